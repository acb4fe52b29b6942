//! The model's own chat template: the Jinja `chat_template` of `tokenizer_config.json`
//! (or `chat_template.jinja`) beside the tokenizer, rendered with `minijinja` and the
//! variables Hugging Face's `apply_chat_template` passes, so that a conversation is
//! written as the model was trained on it. The built-in ChatML and Llama 3 formats are
//! the fallbacks.
//!
//! Templates come from files etch did not write: rendering is bounded (a fuel limit on
//! the engine's instructions, a recursion limit) and has no loader, so a template can
//! neither run forever nor read files.

use std::path::Path;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde_json::Value as Json;

use crate::{ChatTemplate, LlmError};

/// Instructions one render may run (a template that loops forever runs out of fuel).
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// Most bytes of a chat template's source.
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// Most bytes of the text one render may produce.
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// The template ChatML models use (SmolLM2, Qwen).
const CHATML_SOURCE: &str = "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] if message['content'] is string else '') + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}";

/// The Llama 3 instruct format.
const LLAMA3_SOURCE: &str = "{{- bos_token }}{%- for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (message['content'] if message['content'] is string else '') + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}";

/// A chat template ready to render conversations.
pub struct JinjaChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// Where the template came from, for messages.
    origin: String,
}

impl std::fmt::Debug for JinjaChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JinjaChatTemplate")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

fn template_error(origin: &str, e: impl std::fmt::Display) -> LlmError {
    LlmError::Template(format!("chat template ({origin}): {e}"))
}

/// A token given in `tokenizer_config.json` as a string or as `{"content": ...}`.
fn token_text(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl JinjaChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts the template may use.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        origin: &str,
    ) -> Result<Self, LlmError> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(template_error(
                origin,
                format!("{} bytes is more than {MAX_TEMPLATE_BYTES}", source.len()),
            ));
        }
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(64);
        // Python's str and dict methods (strip, split, startswith, items, ...), which
        // Hugging Face templates call.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| -> String {
            // No clock in templates: renders stay reproducible. The date is the one
            // Llama 3.1's own template falls back to when `strftime_now` is missing.
            let _ = format;
            "26 Jul 2024".to_string()
        });
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| template_error(origin, e))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            origin: origin.to_string(),
        })
    }

    /// A built-in format as a template.
    pub fn builtin(format: ChatTemplate) -> Self {
        let (source, bos, eos, name) = match format {
            ChatTemplate::ChatMl => (CHATML_SOURCE, "", "<|im_end|>", "built-in ChatML"),
            ChatTemplate::Llama3 => (
                LLAMA3_SOURCE,
                "<|begin_of_text|>",
                "<|eot_id|>",
                "built-in Llama 3",
            ),
        };
        // The built-in sources compile: a test checks both.
        Self::new(source, bos, eos, name).unwrap_or_else(|_| Self {
            env: Environment::new(),
            bos_token: String::new(),
            eos_token: String::new(),
            origin: name.into(),
        })
    }

    /// Reads a template file: a `.jinja` source, or a `tokenizer_config.json` whose
    /// `chat_template` (a string, or a list of named templates: `default` is taken) is
    /// used with its `bos_token` and `eos_token`.
    pub fn from_file(path: &Path) -> Result<Self, LlmError> {
        let origin = path.display().to_string();
        let len = std::fs::metadata(path)
            .map_err(|e| template_error(&origin, e))?
            .len();
        if len > 4 * MAX_TEMPLATE_BYTES as u64 + (16 << 20) {
            return Err(template_error(&origin, format!("{len} bytes is too large")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| template_error(&origin, e))?;
        if text.trim_start().starts_with('{') && path.extension().is_some_and(|e| e == "json") {
            let config: Json =
                serde_json::from_str(&text).map_err(|e| template_error(&origin, e))?;
            return Self::from_tokenizer_config(&config, &origin)?
                .ok_or_else(|| template_error(&origin, "no chat_template in it"));
        }
        Self::new(&text, "", "", &origin)
    }

    fn from_tokenizer_config(config: &Json, origin: &str) -> Result<Option<Self>, LlmError> {
        let source = match config.get("chat_template") {
            Some(Json::String(s)) => s.clone(),
            Some(Json::Array(list)) => {
                let named = |name: &str| {
                    list.iter().find_map(|t| {
                        (t.get("name")?.as_str()? == name)
                            .then(|| t.get("template")?.as_str().map(str::to_string))?
                    })
                };
                match named("default") {
                    Some(s) => s,
                    None => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let bos = token_text(config.get("bos_token")).unwrap_or_default();
        let eos = token_text(config.get("eos_token")).unwrap_or_default();
        Self::new(&source, &bos, &eos, origin).map(Some)
    }

    /// The template stored beside a tokenizer file: `chat_template.jinja`, else the
    /// `chat_template` of `tokenizer_config.json`; `Ok(None)` when there is none.
    pub fn beside_tokenizer(tokenizer: &Path) -> Result<Option<Self>, LlmError> {
        let Some(dir) = tokenizer.parent() else {
            return Ok(None);
        };
        let config_path = dir.join("tokenizer_config.json");
        let config: Option<Json> = std::fs::read_to_string(&config_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let mut t = Self::from_file(&jinja)?;
            if let Some(config) = &config {
                t.bos_token = token_text(config.get("bos_token")).unwrap_or_default();
                t.eos_token = token_text(config.get("eos_token")).unwrap_or_default();
            }
            return Ok(Some(t));
        }
        match &config {
            Some(config) => Self::from_tokenizer_config(config, &config_path.display().to_string()),
            None => Ok(None),
        }
    }

    /// The template a chat uses: `name_or_file` (`chatml`, `llama3`, or a `.jinja` /
    /// `tokenizer_config.json` file) if given, else the model's own beside the tokenizer
    /// file `tokenizer_path`, else the built-in format whose special tokens `tokenizer`
    /// has. Fails when none applies, naming what to pass.
    pub fn select(
        name_or_file: Option<&str>,
        tokenizer_path: &Path,
        tokenizer: &dyn crate::Tokenizer,
    ) -> Result<Self, LlmError> {
        if let Some(given) = name_or_file {
            return match ChatTemplate::from_name(given) {
                Some(format) => Ok(Self::builtin(format)),
                None => Self::from_file(Path::new(given)),
            };
        }
        if let Some(own) = Self::beside_tokenizer(tokenizer_path)? {
            return Ok(own);
        }
        ChatTemplate::detect(tokenizer)
            .map(Self::builtin)
            .ok_or_else(|| {
                LlmError::Template(format!(
                    "{} has no chat template beside it and neither ChatML nor Llama 3 special tokens: pass one (--chat-template, or chat_template in Python: chatml, llama3, or a .jinja file)",
                    tokenizer_path.display()
                ))
            })
    }

    /// Where the template came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Renders `messages` (OpenAI/Hugging Face message objects: `role`, `content`, and
    /// `tool_calls` etc. as the template reads them), with `tools` if any, and the
    /// assistant's header after them when `add_generation_prompt`. `extra` adds
    /// variables (`enable_thinking`, ...).
    pub fn render(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: Option<&serde_json::Map<String, Json>>,
    ) -> Result<String, LlmError> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| template_error(&self.origin, e))?;
        let mut vars = serde_json::Map::new();
        if let Some(extra) = extra {
            vars.extend(extra.clone());
        }
        vars.insert("messages".into(), messages.clone());
        vars.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        vars.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        vars.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        if let Some(tools) = tools {
            vars.insert("tools".into(), tools.clone());
        }
        let text = template
            .render(Value::from_serialize(&vars))
            .map_err(|e| template_error(&self.origin, e))?;
        if text.len() > MAX_RENDERED_BYTES {
            return Err(template_error(
                &self.origin,
                format!(
                    "rendered {} bytes, more than {MAX_RENDERED_BYTES}",
                    text.len()
                ),
            ));
        }
        Ok(text)
    }
}

/// Marks where a reply's ids go in rendered text (private-use characters a client's
/// text is vanishingly unlikely to hold).
const MARK_OPEN: char = '\u{F8F0}';
const MARK_CLOSE: char = '\u{F8F1}';

impl JinjaChatTemplate {
    /// Renders `messages` (with the assistant's header after them) and tokenises the
    /// text, putting in the exact token ids of the assistant messages that `reply_ids`
    /// gives (entry `i` for message `i`) instead of their text tokenised again, which
    /// may split differently: a conversation's next prompt then extends the tokens its
    /// session holds, and resumes warm. Falls back to plain text when the template does
    /// not keep a reply intact.
    pub fn render_ids(
        &self,
        tokenizer: &dyn crate::Tokenizer,
        messages: &[Json],
        reply_ids: &[Option<&[u64]>],
        tools: Option<&Json>,
        extra: Option<&serde_json::Map<String, Json>>,
    ) -> Result<Vec<u64>, LlmError> {
        let mut marked: Vec<&[u64]> = Vec::new();
        let mut spliced = messages.to_vec();
        for (m, ids) in spliced.iter_mut().zip(reply_ids) {
            if let Some(ids) = ids
                && m.get("content").is_some_and(Json::is_string)
            {
                m["content"] = Json::String(format!("{MARK_OPEN}{}{MARK_CLOSE}", marked.len()));
                marked.push(ids);
            }
        }
        if !marked.is_empty() {
            let text = self.render(&Json::Array(spliced), tools, true, extra)?;
            if let Some(ids) = splice(&text, &marked, tokenizer)? {
                return Ok(ids);
            }
        }
        let text = self.render(&Json::Array(messages.to_vec()), tools, true, extra)?;
        encode(tokenizer, &text)
    }
}

fn encode(tokenizer: &dyn crate::Tokenizer, text: &str) -> Result<Vec<u64>, LlmError> {
    Ok(tokenizer.encode(text)?.into_iter().map(u64::from).collect())
}

/// Tokenises `text` with each mark replaced by its ids; `None` when the template did not
/// keep every mark intact.
fn splice(
    text: &str,
    marked: &[&[u64]],
    tokenizer: &dyn crate::Tokenizer,
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
        let Some(index) = after[..close]
            .parse::<usize>()
            .ok()
            .filter(|&i| i < marked.len())
        else {
            return Ok(None);
        };
        used[index] = true;
        ids.extend_from_slice(marked[index]);
        rest = &after[close + MARK_CLOSE.len_utf8()..];
    }
    if used.iter().any(|u| !u) {
        return Ok(None);
    }
    ids.extend(encode(tokenizer, rest)?);
    Ok(Some(ids))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat() -> Json {
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ])
    }

    #[test]
    fn the_builtins_render_as_the_fixed_formats_do() {
        let t = JinjaChatTemplate::builtin(ChatTemplate::ChatMl);
        assert_eq!(
            t.render(&chat(), None, true, None).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let t = JinjaChatTemplate::builtin(ChatTemplate::Llama3);
        assert_eq!(
            t.render(&chat(), None, true, None).unwrap(),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn hugging_face_idioms_work() {
        // Python string methods, loop controls, tojson, raise_exception, tools.
        let source = "{%- if tools %}{{ tools | tojson }}{% endif %}{%- for m in messages %}{%- if m.role == 'system' %}{% continue %}{% endif %}[{{ m.role.upper() }}]{{ m.content.strip() }}{%- endfor %}{%- if not add_generation_prompt %}{{ raise_exception('no prompt') }}{% endif %}";
        let t = JinjaChatTemplate::new(source, "<s>", "</s>", "test").unwrap();
        let messages =
            json!([{"role": "system", "content": "x"}, {"role": "user", "content": "  Hi  "}]);
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let text = t.render(&messages, Some(&tools), true, None).unwrap();
        assert!(text.ends_with("[USER]Hi"), "{text}");
        assert!(text.starts_with('['), "{text}");
        let err = t.render(&messages, None, false, None).unwrap_err();
        assert!(err.to_string().contains("no prompt"), "{err}");
    }

    #[test]
    fn a_template_that_never_ends_runs_out_of_fuel() {
        let source =
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
        let t = JinjaChatTemplate::new(source, "", "", "loop").unwrap();
        let err = t.render(&chat(), None, true, None).unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
    }

    #[test]
    fn templates_cannot_include_files() {
        let t = JinjaChatTemplate::new("{% include '/etc/passwd' %}", "", "", "inc").unwrap();
        assert!(t.render(&chat(), None, true, None).is_err());
    }

    #[test]
    fn tokenizer_config_templates_and_named_lists_are_read() {
        let config = json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D"}], "bos_token": {"content": "<s>"}});
        let t = JinjaChatTemplate::from_tokenizer_config(&config, "cfg")
            .unwrap()
            .unwrap();
        assert_eq!(t.render(&chat(), None, true, None).unwrap(), "<s>D");
        assert!(
            JinjaChatTemplate::from_tokenizer_config(&json!({}), "cfg")
                .unwrap()
                .is_none()
        );
    }
}
