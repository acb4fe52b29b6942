//! Multi-turn chat on one KV cache: each turn prefills only its own tokens, the cache
//! keeps the rest of the conversation (the runner's position carries over between
//! `generate` calls).

use crate::{ChatTemplate, Generation, LlmError, Runner, SamplingConfig, StopReason};

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
    /// Tokens this turn prefilled: the previous reply's last token and closing, then the
    /// user message (or, after dropping old turns, everything kept).
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

/// A conversation held in one runner's KV cache.
#[derive(Debug)]
pub struct Conversation {
    template: ChatTemplate,
    system: Option<String>,
    /// Every finished turn's tokens (user message, reply, closing), oldest first: what
    /// is prefilled again when old turns are dropped.
    turns: Vec<Vec<u64>>,
    /// Tokens the next turn prefills first: the conversation's start (before the first
    /// turn), or the last reply's final token (which had no model step) and closing.
    pending: Vec<u64>,
    started: bool,
}

impl Conversation {
    /// A new conversation; the template's end-of-turn tokens become stop tokens of
    /// `runner`, whose cache is reset.
    pub fn new(
        runner: &mut Runner,
        template: ChatTemplate,
        system: Option<String>,
    ) -> Result<Self, LlmError> {
        runner.add_stop_tokens(template);
        runner.reset()?;
        Ok(Self {
            template,
            system,
            turns: Vec::new(),
            pending: Vec::new(),
            started: false,
        })
    }

    /// Forgets every turn (the system message stays) and empties the cache.
    pub fn reset(&mut self, runner: &mut Runner) -> Result<(), LlmError> {
        self.turns.clear();
        self.pending.clear();
        self.started = false;
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
        self.turns.len()
    }

    /// Tokens a turn must leave free for its reply before it is prefilled.
    fn reply_room(max_new_tokens: usize, context: usize) -> usize {
        max_new_tokens.min(context / 4).max(1)
    }

    /// The user says `user`; the model replies, streaming text to `on_text`. Only the
    /// new tokens are prefilled; when they and room for the reply (`max_new_tokens`,
    /// at most a quarter of the context) do not fit, `on_full` decides.
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
        if !self.started {
            self.pending = runner.encode(&self.template.conversation_start(self.system()))?;
        }
        let user_ids = runner.encode(&self.template.user_turn(user))?;
        let mut prompt = std::mem::take(&mut self.pending);
        prompt.extend_from_slice(&user_ids);
        let mut dropped = 0;
        if runner.position() + prompt.len() + room > context {
            match on_full {
                OnFull::Stop => {
                    // The turn is refused: the conversation stays as it was.
                    prompt.truncate(prompt.len() - user_ids.len());
                    self.pending = prompt;
                    return Err(LlmError::ContextFull {
                        context,
                        position: runner.position(),
                        needed: self.pending.len() + user_ids.len() + room,
                    });
                }
                OnFull::DropOldest => {
                    let start = runner.encode(&self.template.conversation_start(self.system()))?;
                    let fixed = start.len() + user_ids.len() + room;
                    if fixed > context {
                        return Err(LlmError::ContextFull {
                            context,
                            position: 0,
                            needed: fixed,
                        });
                    }
                    // Keep the newest turns that fit.
                    let mut kept = 0;
                    let mut used = fixed;
                    for t in self.turns.iter().rev() {
                        if used + t.len() > context {
                            break;
                        }
                        used += t.len();
                        kept += 1;
                    }
                    dropped = self.turns.len() - kept;
                    self.turns.drain(..dropped);
                    prompt = start;
                    for t in &self.turns {
                        prompt.extend_from_slice(t);
                    }
                    prompt.extend_from_slice(&user_ids);
                    runner.reset()?;
                }
            }
        }
        let Generation {
            generated_token_ids,
            text,
            stop_reason,
            stats,
            ..
        } = runner.generate(&prompt, max_new_tokens, sampling, on_text)?;
        self.started = true;
        let closing = runner.encode(self.template.close_reply(stop_reason == StopReason::Eos))?;
        let mut turn = user_ids;
        turn.extend_from_slice(&generated_token_ids);
        turn.extend_from_slice(&closing);
        self.turns.push(turn);
        // The reply's last token is not in the cache yet: the next turn starts with it.
        self.pending.clear();
        self.pending.extend(generated_token_ids.last().copied());
        self.pending.extend_from_slice(&closing);
        Ok(Turn {
            prompt_tokens_prefilled: prompt.len(),
            context_tokens: runner.position(),
            dropped_turns: dropped,
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
