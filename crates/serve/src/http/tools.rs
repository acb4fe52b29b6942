//! Tool calls in replies: Hermes-style `<tool_call>{"name", "arguments"}</tool_call>`
//! blocks (what Qwen's and many other templates teach their models) as OpenAI
//! `tool_calls`.

use serde_json::{Value, json};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A reply split into its text and its tool calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedReply {
    /// The text before the first call (`None` when empty).
    pub content: Option<String>,
    /// OpenAI tool-call objects.
    pub tool_calls: Vec<Value>,
}

/// Finds the tool calls in `text`, keeping only calls to functions in `tools`. All or
/// nothing: when a block is malformed or names an unknown function, the reply is text.
///
/// ```
/// use etch_serve::http::parse_tool_calls;
/// let tools = serde_json::json!([{"type": "function", "function": {"name": "add"}}]);
/// let r = parse_tool_calls(r#"Sure.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>"#, &tools, &mut || "call-1".into());
/// assert_eq!(r.content.as_deref(), Some("Sure."));
/// assert_eq!(r.tool_calls[0]["function"]["arguments"], r#"{"a":1}"#);
/// ```
pub fn parse_tool_calls(
    text: &str,
    tools: &Value,
    next_id: &mut dyn FnMut() -> String,
) -> ParsedReply {
    let as_text = || ParsedReply {
        content: (!text.is_empty()).then(|| text.to_string()),
        tool_calls: Vec::new(),
    };
    let Some(first) = text.find(OPEN) else {
        return as_text();
    };
    let known: Vec<&str> = tools
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|t| t.get("function")?.get("name")?.as_str())
                .collect()
        })
        .unwrap_or_default();
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(OPEN) {
        let body_start = start + OPEN.len();
        let Some(len) = rest[body_start..].find(CLOSE) else {
            return as_text();
        };
        let body = rest[body_start..body_start + len].trim();
        let Ok(parsed) = serde_json::from_str::<Value>(body) else {
            return as_text();
        };
        let items = match parsed {
            Value::Array(items) => items,
            one => vec![one],
        };
        for item in items {
            let Some(name) = item.get("name").and_then(Value::as_str) else {
                return as_text();
            };
            if !known.contains(&name) {
                return as_text();
            }
            let arguments = item
                .get("arguments")
                .or_else(|| item.get("parameters"))
                .cloned()
                .unwrap_or_else(|| json!({}));
            let arguments = match arguments {
                Value::String(s) => s,
                other => other.to_string(),
            };
            calls.push(json!({
                "id": next_id(),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }));
        }
        rest = &rest[body_start + len + CLOSE.len()..];
    }
    let content = text[..first].trim_end();
    ParsedReply {
        content: (!content.is_empty()).then(|| content.to_string()),
        tool_calls: calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather"}}])
    }

    fn ids() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("call-{n}")
        }
    }

    #[test]
    fn calls_become_tool_calls() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}]</tool_call>";
        let r = parse_tool_calls(text, &tools(), &mut ids());
        assert_eq!(r.content, None);
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(r.tool_calls[1]["id"], "call-2");
        assert_eq!(
            r.tool_calls[1]["function"]["arguments"],
            "{\"city\":\"Rome\"}"
        );
    }

    #[test]
    fn unknown_functions_and_bad_markup_stay_text() {
        for text in [
            "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>",
            "<tool_call>{not json}</tool_call>",
            "<tool_call>{\"name\": \"get_weather\"}",
            "no calls here",
        ] {
            let r = parse_tool_calls(text, &tools(), &mut ids());
            assert!(r.tool_calls.is_empty(), "{text}");
            assert_eq!(r.content.as_deref(), Some(text));
        }
    }
}
