//! OpenAI request bodies, checked field by field: what etch honours, what it refuses
//! (400 naming the parameter), and the limits on what a client may send.

use etch_llm::{SamplingConfig, SamplingDefaults};
use serde_json::{Map, Value};

use super::error::ApiError;

/// Most bytes of a request body.
pub const MAX_BODY_BYTES: usize = 8 << 20;
/// Most messages in one chat request.
pub const MAX_MESSAGES: usize = 4096;
/// Most stop strings in one request.
pub const MAX_STOP_STRINGS: usize = 16;
/// Most bytes of one stop string.
pub const MAX_STOP_BYTES: usize = 256;
/// Most bytes of a session id (the official server's rule: 1-128 printable ASCII).
pub const MAX_SESSION_ID_BYTES: usize = 128;

/// What a chat or completion request asks of generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub max_tokens: Option<usize>,
    pub sampling: SamplingConfig,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Go on past end-of-sequence (llama.cpp's `ignore_eos`; fixed-length benchmarks).
    pub ignore_eos: bool,
}

fn number(body: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ApiError::invalid_value(format!("{key} must be a number."))),
    }
}

fn integer(body: &Map<String, Value>, key: &str) -> Result<Option<i64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid_value(format!("{key} must be an integer (got {n})."))),
        Some(_) => Err(ApiError::invalid_value(format!(
            "{key} must be an integer."
        ))),
    }
}

fn flag(body: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid_value(format!("{key} must be a boolean."))),
    }
}

/// Refuses the parameters etch does not honour (a client asking for them would get
/// something else than it asked for).
pub fn refuse_unsupported(body: &Map<String, Value>) -> Result<(), ApiError> {
    let mut names = Vec::new();
    let present = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if integer(body, "n")?.is_some_and(|n| n != 1) {
        names.push("n");
    }
    for key in ["presence_penalty", "frequency_penalty"] {
        if number(body, key)?.is_some_and(|v| v != 0.0) {
            names.push(key);
        }
    }
    for key in ["logit_bias", "top_logprobs", "reasoning_effort", "suffix"] {
        if present(key) {
            names.push(key);
        }
    }
    for key in ["logprobs", "echo"] {
        if body
            .get(key)
            .is_some_and(|v| v.as_bool() == Some(true) || v.is_number())
        {
            names.push(key);
        }
    }
    if body.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
        names.push("parallel_tool_calls");
    }
    if let Some(format) = body.get("response_format").filter(|v| !v.is_null())
        && format.get("type").and_then(Value::as_str) != Some("text")
    {
        names.push("response_format");
    }
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" || s == "none" => {}
        Some(_) => names.push("tool_choice"),
    }
    if names.is_empty() {
        Ok(())
    } else {
        Err(ApiError::unsupported(&names))
    }
}

/// The generation settings of a request, on top of `defaults`; `seed` makes a random
/// seed when the request has none.
pub fn generation(
    body: &Map<String, Value>,
    defaults: SamplingDefaults,
    seed: impl FnOnce() -> u64,
) -> Result<Generation, ApiError> {
    let temperature = number(body, "temperature")?.unwrap_or(defaults.temperature as f64);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid_value(format!(
            "temperature must be between 0 and 2 (got {temperature})."
        )));
    }
    let top_p = number(body, "top_p")?.unwrap_or(defaults.top_p as f64);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_value(format!(
            "top_p must be between 0 (exclusive) and 1 (got {top_p})."
        )));
    }
    let top_k = integer(body, "top_k")?.unwrap_or(defaults.top_k as i64);
    if !(0..=i64::from(i32::MAX)).contains(&top_k) {
        return Err(ApiError::invalid_value(format!(
            "top_k must be between 0 and 2147483647 (got {top_k})."
        )));
    }
    let repetition_penalty =
        number(body, "repetition_penalty")?.unwrap_or(defaults.repetition_penalty as f64);
    if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
        return Err(ApiError::invalid_value(format!(
            "repetition_penalty must be positive (got {repetition_penalty})."
        )));
    }
    let min_p = number(body, "min_p")?.unwrap_or(defaults.min_p as f64);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid_value(format!(
            "min_p must be between 0 and 1 (got {min_p})."
        )));
    }
    let seed = match integer(body, "seed")? {
        Some(s) if s >= 1 => s as u64,
        Some(s) => {
            return Err(ApiError::invalid_value(format!(
                "seed must be between 1 and 9223372036854775807 (got {s})."
            )));
        }
        None => seed(),
    };
    let mut max_tokens = None;
    for key in ["max_completion_tokens", "max_tokens"] {
        if let Some(v) = integer(body, key)? {
            if v < 1 {
                return Err(ApiError::invalid_value(format!(
                    "{key} must be a positive integer (got {v})."
                )));
            }
            max_tokens = max_tokens.or(Some(v as usize));
        }
    }
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::invalid_value("stop must be a string or a list of strings.")
            })?,
        Some(_) => {
            return Err(ApiError::invalid_value(
                "stop must be a string or a list of strings.",
            ));
        }
    };
    if stop.len() > MAX_STOP_STRINGS || stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid_value(format!(
            "stop takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_BYTES} bytes."
        )));
    }
    let stream = flag(body, "stream")?;
    let ignore_eos = flag(body, "ignore_eos")?;
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => o.get("include_usage").and_then(Value::as_bool) == Some(true),
        Some(_) => return Err(ApiError::invalid_value("stream_options must be an object.")),
    };
    Ok(Generation {
        max_tokens,
        sampling: SamplingConfig {
            temperature: temperature as f32,
            top_k: top_k as usize,
            top_p: top_p as f32,
            repetition_penalty: repetition_penalty as f32,
            min_p: min_p as f32,
            seed,
        },
        stop,
        stream,
        include_usage,
        ignore_eos,
    })
}

/// Checks a session id: 1-128 printable ASCII characters, no spaces.
pub fn check_session_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > MAX_SESSION_ID_BYTES {
        return Err(ApiError::invalid_session_id(
            "Invalid session_id: must be 1-128 characters",
        ));
    }
    if !id.bytes().all(|b| (0x21..=0x7E).contains(&b)) {
        return Err(ApiError::invalid_session_id(
            "Invalid session_id: must be printable ASCII with no spaces",
        ));
    }
    Ok(())
}

/// The chat messages of a body, each with its content as a string (text parts joined).
pub fn messages(body: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let Some(Value::Array(list)) = body.get("messages") else {
        return Err(ApiError::invalid_request(
            "messages must be a non-empty list.",
        ));
    };
    if list.is_empty() {
        return Err(ApiError::invalid_request(
            "messages must be a non-empty list.",
        ));
    }
    if list.len() > MAX_MESSAGES {
        return Err(ApiError::invalid_request(format!(
            "at most {MAX_MESSAGES} messages, got {}.",
            list.len()
        )));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(m) = m else {
                return Err(ApiError::invalid_request(format!("messages[{i}] must be an object.")));
            };
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_request(format!("messages[{i}].role must be a string."))
            })?;
            if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
                return Err(ApiError::invalid_request(format!(
                    "messages[{i}].role {role:?} is not system, user, assistant or tool."
                )));
            }
            let mut m = m.clone();
            let content = match m.get("content") {
                None | Some(Value::Null) => Value::Null,
                Some(Value::String(s)) => Value::String(s.clone()),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.get("type").and_then(Value::as_str), part.get("text")) {
                            (Some("text"), Some(Value::String(t))) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::invalid_request(format!(
                                    "messages[{i}]: content parts of type {} are not supported (text only).",
                                    kind.unwrap_or("?")
                                )));
                            }
                        }
                    }
                    Value::String(text)
                }
                Some(_) => {
                    return Err(ApiError::invalid_request(format!(
                        "messages[{i}].content must be a string or a list of text parts."
                    )));
                }
            };
            if role == "developer" {
                m.insert("role".into(), Value::String("system".into()));
            }
            // Templates read arguments as objects; OpenAI sends them as JSON strings.
            if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
                for call in calls {
                    if let Some(f) = call.get_mut("function")
                        && let Some(Value::String(args)) = f.get("arguments")
                        && let Ok(parsed) = serde_json::from_str::<Value>(args)
                    {
                        f["arguments"] = parsed;
                    }
                }
            }
            m.insert("content".into(), content);
            Ok(Value::Object(m))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn sampling_fields_and_their_ranges() {
        let g = generation(
            &obj(json!({"temperature": 0, "top_k": 5, "seed": 9, "max_tokens": 7, "stop": "x", "stream": true, "stream_options": {"include_usage": true}})),
            SamplingDefaults::default(),
            || 1,
        )
        .unwrap();
        assert_eq!(g.sampling.temperature, 0.0);
        assert_eq!(
            (g.sampling.top_k, g.sampling.seed, g.max_tokens),
            (5, 9, Some(7))
        );
        assert_eq!(g.stop, ["x"]);
        assert!(g.stream && g.include_usage);
        for bad in [
            json!({"temperature": 3}),
            json!({"top_p": 0}),
            json!({"top_k": -1}),
            json!({"seed": 0}),
            json!({"max_tokens": 0}),
            json!({"stop": [1]}),
            json!({"temperature": "hot"}),
        ] {
            let e = generation(&obj(bad.clone()), SamplingDefaults::default(), || 1).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
        }
    }

    #[test]
    fn unsupported_parameters_are_named() {
        let e = refuse_unsupported(&obj(
            json!({"n": 2, "logprobs": true, "tool_choice": {"type": "function"}}),
        ))
        .unwrap_err();
        assert!(
            e.message.contains("n, logprobs, tool_choice"),
            "{}",
            e.message
        );
        refuse_unsupported(&obj(json!({"n": 1, "presence_penalty": 0, "tool_choice": "auto", "response_format": {"type": "text"}}))).unwrap();
    }

    #[test]
    fn session_ids_and_messages_are_checked() {
        check_session_id("abc-1").unwrap();
        assert!(check_session_id("").is_err());
        assert!(check_session_id("a b").is_err());
        assert!(check_session_id(&"x".repeat(129)).is_err());
        let m = messages(&obj(json!({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}))).unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "ab"}));
        assert!(messages(&obj(json!({"messages": []}))).is_err());
        assert!(
            messages(&obj(
                json!({"messages": [{"role": "robot", "content": "x"}]})
            ))
            .is_err()
        );
        assert!(
            messages(&obj(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
            ))
            .is_err()
        );
    }
}
