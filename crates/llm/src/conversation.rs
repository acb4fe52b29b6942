//! Multi-turn chat on one KV cache. Each turn renders the whole conversation with the
//! model's chat template, its earlier replies put back as the token ids the model
//! generated; the runner's session keeps what the new prompt repeats and prefills only
//! the rest (the new user message and the closing of the last reply).

use serde_json::json;

use crate::{Generation, JinjaChatTemplate, LlmError, Runner, SamplingConfig, StopReason};

/// What to do when the next turn does not fit the model's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFull {
    /// Refuse the turn with [`LlmError::ContextFull`].
    #[default]
    Stop,
    /// Start the cache over with the system message and as many of the newest turns as
    /// fit with the new one, prefilled again.
    DropOldest,
}

/// One turn's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Turn {
    /// Tokens this turn prefilled: what its prompt adds to the cache (the last reply's
    /// final token and closing, then the user message; or, after dropping old turns,
    /// everything kept).
    pub prompt_tokens_prefilled: usize,
    /// Tokens in the KV cache after the turn.
    pub context_tokens: usize,
    /// Old turns dropped from the context to fit this one.
    pub dropped_turns: usize,
    /// The reply, as the model generated it (with the end-of-turn token if it ended so).
    pub generated_token_ids: Vec<u64>,
    pub text: String,
    pub stop_reason: StopReason,
    pub stats: crate::GenerationStats,
}

/// A finished exchange: the user's message and the reply's text and ids.
#[derive(Debug, Clone)]
struct Exchange {
    user: String,
    reply: String,
    /// The reply's ids without an end-of-turn token (the template writes its own).
    reply_ids: Vec<u64>,
}

/// A conversation held in one runner's KV cache.
#[derive(Debug)]
pub struct Conversation {
    template: JinjaChatTemplate,
    system: Option<String>,
    exchanges: Vec<Exchange>,
}

impl Conversation {
    /// A new conversation written with `template`; `runner`'s cache is reset, and the
    /// end-of-turn tokens its tokenizer has ([`crate::END_OF_TURN_TOKENS`]) end replies as
    /// end-of-sequence does.
    pub fn new(
        runner: &mut Runner,
        template: JinjaChatTemplate,
        system: Option<String>,
    ) -> Result<Self, LlmError> {
        runner.add_end_of_turn_tokens();
        runner.reset()?;
        Ok(Self {
            template,
            system,
            exchanges: Vec::new(),
        })
    }

    /// Forgets every turn (the system message stays) and empties the cache.
    pub fn reset(&mut self, runner: &mut Runner) -> Result<(), LlmError> {
        self.exchanges.clear();
        runner.reset()
    }

    /// Sets the system message (`None`: none) and starts over: the system message opens
    /// the context, so the turns after it cannot be kept.
    pub fn set_system(
        &mut self,
        runner: &mut Runner,
        system: Option<String>,
    ) -> Result<(), LlmError> {
        self.system = system;
        self.reset(runner)
    }

    /// The system message.
    pub fn system(&self) -> Option<&str> {
        self.system.as_deref()
    }

    /// Finished turns in the context.
    pub fn turns(&self) -> usize {
        self.exchanges.len()
    }

    /// Tokens a turn must leave free for its reply before it is prefilled.
    fn reply_room(max_new_tokens: usize, context: usize) -> usize {
        max_new_tokens.min(context / 4).max(1)
    }

    /// The prompt of the conversation from exchange `first` on, then `user`.
    fn prompt(&self, runner: &Runner, first: usize, user: &str) -> Result<Vec<u64>, LlmError> {
        let mut messages = Vec::new();
        let mut reply_ids = Vec::new();
        if let Some(system) = &self.system {
            messages.push(json!({"role": "system", "content": system}));
            reply_ids.push(None);
        }
        for e in &self.exchanges[first..] {
            messages.push(json!({"role": "user", "content": e.user}));
            messages.push(json!({"role": "assistant", "content": e.reply}));
            reply_ids.push(None);
            reply_ids.push(Some(e.reply_ids.as_slice()));
        }
        messages.push(json!({"role": "user", "content": user}));
        reply_ids.push(None);
        self.template
            .render_ids(runner.tokenizer(), &messages, &reply_ids, None, None)
    }

    /// The user says `user`; the model replies, streaming text to `on_text`. Only what
    /// the cache does not hold is prefilled; when the prompt and room for the reply
    /// (`max_new_tokens`, at most a quarter of the context) do not fit, `on_full` decides.
    pub fn turn(
        &mut self,
        runner: &mut Runner,
        user: &str,
        max_new_tokens: usize,
        sampling: SamplingConfig,
        on_full: OnFull,
        on_text: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Turn, LlmError> {
        let context = runner.metadata().max_context_len;
        let room = Self::reply_room(max_new_tokens, context);
        let mut first = 0;
        let mut prompt = self.prompt(runner, first, user)?;
        if prompt.len() + room > context {
            if on_full == OnFull::Stop {
                return Err(LlmError::ContextFull {
                    context,
                    position: runner.position(),
                    needed: prompt.len().saturating_sub(runner.position()) + room,
                });
            }
            // Keep the newest exchanges that fit.
            while prompt.len() + room > context && first < self.exchanges.len() {
                first += 1;
                prompt = self.prompt(runner, first, user)?;
            }
            if prompt.len() + room > context {
                return Err(LlmError::ContextFull {
                    context,
                    position: 0,
                    needed: prompt.len() + room,
                });
            }
        }
        let plan = runner.prepare(&prompt)?;
        let Generation {
            generated_token_ids,
            text,
            stop_reason,
            stats,
            ..
        } = runner.generate(&prompt[plan.reused..], max_new_tokens, sampling, on_text)?;
        self.exchanges.drain(..first);
        let mut reply_ids = generated_token_ids.clone();
        if stop_reason == StopReason::Eos {
            reply_ids.pop();
        }
        self.exchanges.push(Exchange {
            user: user.to_string(),
            reply: text.clone(),
            reply_ids,
        });
        Ok(Turn {
            prompt_tokens_prefilled: prompt.len() - plan.reused,
            context_tokens: runner.position(),
            dropped_turns: first,
            generated_token_ids,
            text,
            stop_reason,
            stats,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_room_is_bounded_by_the_context() {
        assert_eq!(Conversation::reply_room(256, 2048), 256);
        assert_eq!(Conversation::reply_room(256, 64), 16);
        assert_eq!(Conversation::reply_room(0, 64), 1);
    }
}
