//! Chat messages to prompt token ids. In a named session, the assistant replies this
//! server generated are put back as the exact token ids the model produced (not their
//! text tokenised again, which may split differently), so that the next turn's prompt
//! extends the session's resident tokens and resumes warm -- as the official server's
//! transcript splicing does.

use std::collections::HashMap;
use std::sync::Mutex;

use etch_llm::{JinjaChatTemplate, LlmError, Tokenizer};
use serde_json::{Map, Value};

/// Most replies remembered per session.
const MAX_REPLIES_PER_SESSION: usize = 256;

/// Marks where a remembered reply goes in the rendered text (private-use characters a
/// client's text is vanishingly unlikely to hold).
const MARK_OPEN: char = '\u{F8F0}';
const MARK_CLOSE: char = '\u{F8F1}';

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
    let mut marked = Vec::new();
    let mut spliced: Vec<Value> = messages.to_vec();
    if !replies.is_empty() {
        for m in &mut spliced {
            let is_plain_reply = m.get("role").and_then(Value::as_str) == Some("assistant")
                && m.get("tool_calls").is_none_or(Value::is_null);
            let Some(text) = m.get("content").and_then(Value::as_str) else {
                continue;
            };
            if !is_plain_reply {
                continue;
            }
            if let Some(reply) = replies.iter().rev().find(|r| r.text == text) {
                m["content"] = Value::String(format!("{MARK_OPEN}{}{MARK_CLOSE}", marked.len()));
                marked.push(reply.ids.clone());
            }
        }
    }
    if !marked.is_empty() {
        let text = template.render(&Value::Array(spliced), tools, true, extra)?;
        if let Some(ids) = splice(&text, &marked, tokenizer)? {
            return Ok(ids);
        }
    }
    let text = template.render(&Value::Array(messages.to_vec()), tools, true, extra)?;
    encode(tokenizer, &text)
}

fn encode(tokenizer: &dyn Tokenizer, text: &str) -> Result<Vec<u64>, LlmError> {
    Ok(tokenizer.encode(text)?.into_iter().map(u64::from).collect())
}

/// Tokenises `text` with each mark replaced by its ids; `None` when the template did not
/// keep every mark intact.
fn splice(
    text: &str,
    marked: &[Vec<u64>],
    tokenizer: &dyn Tokenizer,
) -> Result<Option<Vec<u64>>, LlmError> {
    let mut ids = Vec::new();
    let mut rest = text;
    let mut used = vec![false; marked.len()];
    while let Some(open) = rest.find(MARK_OPEN) {
        ids.extend(encode(tokenizer, &rest[..open])?);
        let after = &rest[open + MARK_OPEN.len_utf8()..];
        let Some(close) = after.find(MARK_CLOSE) else {
            return Ok(None);
        };
        let Ok(index) = after[..close].parse::<usize>() else {
            return Ok(None);
        };
        let Some(reply) = marked.get(index) else {
            return Ok(None);
        };
        used[index] = true;
        ids.extend_from_slice(reply);
        rest = &after[close + MARK_CLOSE.len_utf8()..];
    }
    if used.iter().any(|u| !u) {
        return Ok(None);
    }
    ids.extend(encode(tokenizer, rest)?);
    Ok(Some(ids))
}
