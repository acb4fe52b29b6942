//! The worker's request lines: JSON objects on stdin, checked field by field.

use serde_json::{Map, Value};

/// Most bytes of one request line (a guard against a line that never ends).
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Most stop strings one request may carry.
pub const MAX_STOP_STRINGS: usize = 64;

/// Most bytes of one stop string.
pub const MAX_STOP_BYTES: usize = 1024;

/// A part of a prompt: text to tokenise, or token ids to use as they are.
#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    Text(String),
    Ids(Vec<u64>),
}

/// A session operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Open,
    Close,
    Reset,
}

impl Op {
    /// The acknowledgement's key.
    pub fn ack_key(self) -> &'static str {
        match self {
            Op::Open => "opened",
            Op::Close => "closed",
            Op::Reset => "reset",
        }
    }
}

/// A generate request.
#[derive(Debug, Clone, PartialEq)]
pub struct Generate {
    /// `None` (or an empty id): the scratch session.
    pub session_id: Option<String>,
    pub prompt: Vec<Segment>,
    /// `None`: fill the context.
    pub max_new_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    /// `None`: a random seed.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub cancel_request_id: Option<u64>,
}

/// One request line.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Op { op: Op, session_id: String },
    Generate(Generate),
}

/// A request that cannot be served: the message of the error line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

fn bad(message: impl Into<String>) -> BadRequest {
    BadRequest(message.into())
}

/// Parses one line.
pub fn parse(line: &str) -> Result<Request, BadRequest> {
    let value: Value = serde_json::from_str(line).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(bad("a request must be a JSON object"));
    };
    match obj.get("op") {
        Some(Value::String(op)) if matches!(op.as_str(), "open" | "close" | "reset") => {
            let op = match op.as_str() {
                "open" => Op::Open,
                "close" => Op::Close,
                _ => Op::Reset,
            };
            let session_id = match obj.get("session_id") {
                Some(Value::String(id)) if !id.is_empty() => id.clone(),
                Some(Value::String(_)) => return Err(bad("session_id required for op")),
                Some(_) => return Err(bad("session_id must be a string")),
                None => return Err(bad("session_id required for op")),
            };
            Ok(Request::Op { op, session_id })
        }
        _ => generate(&obj).map(Request::Generate),
    }
}

fn generate(obj: &Map<String, Value>) -> Result<Generate, BadRequest> {
    let cancel_request_id = match obj.get("cancel_request_id") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(id) if id > 0 => Some(id),
            _ => return Err(bad("cancel_request_id must be a positive uint64")),
        },
        Some(_) => return Err(bad("cancel_request_id must be a positive uint64")),
    };
    let session_id = match obj.get("session_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("session_id must be a string")),
    };
    let float = |key: &str, default: f64| -> Result<f64, BadRequest> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) => n
                .as_f64()
                .ok_or_else(|| bad(format!("{key} must be a number"))),
            Some(_) => Err(bad(format!("{key} must be a number"))),
        }
    };
    let int = |key: &str| -> Result<i64, BadRequest> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(0),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_u64().map(|_| i64::MAX))
                .ok_or_else(|| bad(format!("{key} must be an integer"))),
            Some(_) => Err(bad(format!("{key} must be an integer"))),
        }
    };
    let temperature = float("temperature", 0.0)?;
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(bad("temperature must be finite and >= 0"));
    }
    let top_p = float("top_p", 1.0)?;
    if !(top_p.is_finite() && top_p > 0.0 && top_p <= 1.0) {
        return Err(bad("top_p must be finite and in (0, 1]"));
    }
    let top_k = int("top_k")?;
    if !(0..=i64::from(i32::MAX)).contains(&top_k) {
        return Err(bad("top_k must fit in a nonnegative int32"));
    }
    let seed = int("seed")?;
    if seed < 0 {
        return Err(bad("seed must be nonnegative"));
    }
    let max_new_tokens = match obj.get("max_new_tokens") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(v), _) if v <= 0 => None,
            (_, Some(v)) => Some(usize::try_from(v).unwrap_or(usize::MAX)),
            _ => return Err(bad("max_new_tokens must be an integer")),
        },
        Some(_) => return Err(bad("max_new_tokens must be an integer")),
    };
    let stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            if items.len() > MAX_STOP_STRINGS {
                return Err(bad(format!(
                    "at most {MAX_STOP_STRINGS} stop strings, got {}",
                    items.len()
                )));
            }
            let mut stop = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) if s.len() <= MAX_STOP_BYTES => stop.push(s.clone()),
                    Value::String(_) => {
                        return Err(bad(format!(
                            "a stop string has more than {MAX_STOP_BYTES} bytes"
                        )));
                    }
                    _ => return Err(bad("stop must be a list of strings")),
                }
            }
            stop
        }
        Some(_) => return Err(bad("stop must be a list of strings")),
    };
    let prompt = match (obj.get("prompt"), obj.get("prompt_segments")) {
        (Some(Value::String(text)), None) => vec![Segment::Text(text.clone())],
        (None, Some(Value::Array(segments))) => segments
            .iter()
            .map(segment)
            .collect::<Result<Vec<_>, _>>()?,
        (Some(_), None) => return Err(bad("prompt must be a string")),
        (None, Some(_)) => return Err(bad("prompt_segments must be a list")),
        _ => return Err(bad("exactly one of prompt / prompt_segments is required")),
    };
    Ok(Generate {
        session_id,
        prompt,
        max_new_tokens,
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k: top_k as usize,
        seed: (seed > 0).then_some(seed as u64),
        stop,
        cancel_request_id,
    })
}

fn segment(value: &Value) -> Result<Segment, BadRequest> {
    let Value::Object(seg) = value else {
        return Err(bad("prompt_segment needs `text` or `ids`"));
    };
    if let Some(ids) = seg.get("ids") {
        let Value::Array(ids) = ids else {
            return Err(bad("prompt_segment ids must be a list of token ids"));
        };
        let ids = ids
            .iter()
            .map(|v| v.as_u64())
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| bad("prompt_segment ids must be nonnegative integers"))?;
        return Ok(Segment::Ids(ids));
    }
    match seg.get("text") {
        Some(Value::String(text)) => Ok(Segment::Text(text.clone())),
        Some(_) => Err(bad("prompt_segment text must be a string")),
        None => Err(bad("prompt_segment needs `text` or `ids`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_generate_request_parses() {
        let line = r#"{"max_new_tokens": 16, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["a", "b"], "prompt_segments": [{"text": "hi"}, {"ids": [1, 2]}], "session_id": "s1", "cancel_request_id": 3}"#;
        let Request::Generate(g) = parse(line).unwrap() else {
            panic!("not a generate")
        };
        assert_eq!(g.session_id.as_deref(), Some("s1"));
        assert_eq!(
            g.prompt,
            [Segment::Text("hi".into()), Segment::Ids(vec![1, 2])]
        );
        assert_eq!(
            (g.max_new_tokens, g.top_k, g.seed, g.cancel_request_id),
            (Some(16), 40, Some(7), Some(3))
        );
        assert_eq!(g.stop, ["a", "b"]);
    }

    #[test]
    fn defaults_and_fill_the_context() {
        let Request::Generate(g) =
            parse(r#"{"prompt": "x", "max_new_tokens": -1, "seed": 0, "session_id": ""}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!((g.max_new_tokens, g.seed, g.session_id), (None, None, None));
        assert_eq!((g.temperature, g.top_p, g.top_k), (0.0, 1.0, 0));
    }

    #[test]
    fn ops_parse_and_need_a_session_id() {
        assert_eq!(
            parse(r#"{"op": "reset", "session_id": "a"}"#).unwrap(),
            Request::Op {
                op: Op::Reset,
                session_id: "a".into()
            }
        );
        assert_eq!(
            parse(r#"{"op": "open", "session_id": ""}"#).unwrap_err().0,
            "session_id required for op"
        );
        assert!(parse(r#"{"op": "close"}"#).is_err());
    }

    #[test]
    fn bad_fields_are_named() {
        for (line, message) in [
            (
                r#"{"prompt": "x", "top_p": 0}"#,
                "top_p must be finite and in (0, 1]",
            ),
            (
                r#"{"prompt": "x", "top_k": -1}"#,
                "top_k must fit in a nonnegative int32",
            ),
            (r#"{"prompt": "x", "seed": -2}"#, "seed must be nonnegative"),
            (
                r#"{"prompt": "x", "cancel_request_id": 0}"#,
                "cancel_request_id must be a positive uint64",
            ),
            (
                r#"{"prompt": "x", "cancel_request_id": "1"}"#,
                "cancel_request_id must be a positive uint64",
            ),
            (
                r#"{"prompt": "x", "prompt_segments": []}"#,
                "exactly one of prompt / prompt_segments is required",
            ),
            (
                r#"{}"#,
                "exactly one of prompt / prompt_segments is required",
            ),
            (
                r#"{"prompt_segments": [{"x": 1}]}"#,
                "prompt_segment needs `text` or `ids`",
            ),
            (
                r#"{"prompt_segments": [{"ids": [-1]}]}"#,
                "prompt_segment ids must be nonnegative integers",
            ),
            (
                r#"{"prompt": "x", "stop": "s"}"#,
                "stop must be a list of strings",
            ),
            (r#"[1]"#, "a request must be a JSON object"),
        ] {
            assert_eq!(parse(line).unwrap_err().0, message, "{line}");
        }
        assert!(parse("{").unwrap_err().0.starts_with("invalid JSON"));
    }
}
