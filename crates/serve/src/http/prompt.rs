//! Chat messages to prompt token ids. In a named session, the assistant replies this
//! server generated are put back as the exact token ids the model produced
//! ([`JinjaChatTemplate::render_ids`]), so that the next turn's prompt extends the
//! session's resident tokens and resumes warm -- as the official server's transcript
//! splicing does. Replies are recognised by their text as returned.

use std::collections::HashMap;
use std::sync::Mutex;

use etch_llm::{JinjaChatTemplate, LlmError, Tokenizer};
use serde_json::{Map, Value};

/// Most replies remembered per session.
const MAX_REPLIES_PER_SESSION: usize = 256;

/// A reply generated in a session: its text as returned, and its token ids.
#[derive(Debug, Clone)]
struct Reply {
    text: String,
    ids: Vec<u64>,
}

/// The replies each named session has generated.
#[derive(Debug, Default)]
pub struct Transcripts {
    sessions: Mutex<HashMap<String, Vec<Reply>>>,
}

impl Transcripts {
    /// Remembers a reply of `session`.
    pub fn remember(&self, session: &str, text: &str, ids: &[u64]) {
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let replies = map.entry(session.to_string()).or_default();
        if replies.len() >= MAX_REPLIES_PER_SESSION {
            replies.remove(0);
        }
        replies.push(Reply {
            text: text.to_string(),
            ids: ids.to_vec(),
        });
    }

    /// Forgets a session's replies.
    pub fn forget(&self, session: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
    }

    fn replies(&self, session: &str) -> Vec<Reply> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session)
            .cloned()
            .unwrap_or_default()
    }
}

/// Renders `messages` and tokenises the text; in a named session, remembered replies
/// are spliced in as their ids.
pub fn prompt_ids(
    template: &JinjaChatTemplate,
    tokenizer: &dyn Tokenizer,
    transcripts: &Transcripts,
    session: Option<&str>,
    messages: &[Value],
    tools: Option<&Value>,
    extra: Option<&Map<String, Value>>,
) -> Result<Vec<u64>, LlmError> {
    let replies = session.map(|s| transcripts.replies(s)).unwrap_or_default();
    let reply_ids: Vec<Option<&[u64]>> = messages
        .iter()
        .map(|m| {
            let plain_reply = m.get("role").and_then(Value::as_str) == Some("assistant")
                && m.get("tool_calls").is_none_or(Value::is_null);
            let text = m.get("content").and_then(Value::as_str)?;
            plain_reply
                .then(|| replies.iter().rev().find(|r| r.text == text))
                .flatten()
                .map(|r| r.ids.as_slice())
        })
        .collect();
    template.render_ids(tokenizer, messages, &reply_ids, tools, extra)
}
