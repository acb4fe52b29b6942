//! Chat templates for instruct models.

use crate::Tokenizer;

/// A prompt format for instruct models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatTemplate {
    /// `<|im_start|>role\n...<|im_end|>\n` (SmolLM2, Qwen, ...).
    ChatMl,
    /// `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>` (Llama 3).
    Llama3,
}

impl ChatTemplate {
    /// Parses `chatml` or `llama3`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "chatml" => Some(Self::ChatMl),
            "llama3" | "llama-3" => Some(Self::Llama3),
            _ => None,
        }
    }

    /// The template whose special tokens the tokenizer has.
    pub fn detect(tokenizer: &dyn Tokenizer) -> Option<Self> {
        if tokenizer.token_id("<|im_start|>").is_some() {
            Some(Self::ChatMl)
        } else if tokenizer.token_id("<|start_header_id|>").is_some() {
            Some(Self::Llama3)
        } else {
            None
        }
    }

    /// One user turn (with an optional system message), ready for the assistant.
    ///
    /// ```
    /// use etch_llm::ChatTemplate;
    /// let p = ChatTemplate::ChatMl.render(None, "Hi");
    /// assert_eq!(p, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    /// ```
    pub fn render(self, system: Option<&str>, user: &str) -> String {
        let mut s = self.conversation_start(system);
        s.push_str(&self.user_turn(user));
        s
    }

    /// What opens a conversation: the beginning-of-text token where the format has one,
    /// and the system message if any.
    pub fn conversation_start(self, system: Option<&str>) -> String {
        match (self, system) {
            (Self::ChatMl, None) => String::new(),
            (Self::ChatMl, Some(sys)) => format!("<|im_start|>system\n{sys}<|im_end|>\n"),
            (Self::Llama3, None) => "<|begin_of_text|>".to_string(),
            (Self::Llama3, Some(sys)) => format!(
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{sys}<|eot_id|>"
            ),
        }
    }

    /// A user message followed by the assistant's header: what the model continues.
    pub fn user_turn(self, user: &str) -> String {
        match self {
            Self::ChatMl => format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"),
            Self::Llama3 => format!(
                "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
            ),
        }
    }

    /// What closes an assistant reply before the next user turn: after an end-of-turn
    /// token the model generated, only the separator; after a reply cut short, the
    /// end-of-turn token as well.
    ///
    /// ```
    /// use etch_llm::ChatTemplate;
    /// assert_eq!(ChatTemplate::ChatMl.close_reply(true), "\n");
    /// assert_eq!(ChatTemplate::ChatMl.close_reply(false), "<|im_end|>\n");
    /// ```
    pub fn close_reply(self, ended_by_the_model: bool) -> &'static str {
        match (self, ended_by_the_model) {
            (Self::ChatMl, true) => "\n",
            (Self::ChatMl, false) => "<|im_end|>\n",
            (Self::Llama3, true) => "",
            (Self::Llama3, false) => "<|eot_id|>",
        }
    }

    /// The system message a Jinja chat template inserts when the conversation has none
    /// (SmolLM2's and Qwen's templates do), read from the template's literal text.
    ///
    /// ```
    /// use etch_llm::ChatTemplate;
    /// let t = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}";
    /// assert_eq!(ChatTemplate::default_system_prompt(t).as_deref(), Some("Be brief."));
    /// ```
    pub fn default_system_prompt(template: &str) -> Option<String> {
        if !template.contains("!= 'system'") && !template.contains("!= \"system\"") {
            return None;
        }
        let start = template.find("<|im_start|>system\n")? + "<|im_start|>system\n".len();
        let rest = &template[start..];
        let end = rest.find("<|im_end|>")?;
        let text = &rest[..end];
        (!text.is_empty() && !text.contains("{{") && !text.contains('\'')).then(|| text.to_string())
    }

    /// The default system message of the chat template stored beside `tokenizer`
    /// (`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`), as
    /// [`ChatTemplate::default_system_prompt`] reads it; `None` when there is none.
    pub fn default_system_beside(tokenizer: &std::path::Path) -> Option<String> {
        let dir = tokenizer.parent()?;
        let template = std::fs::read_to_string(dir.join("chat_template.jinja"))
            .ok()
            .or_else(|| {
                let config = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?;
                let v: serde_json::Value = serde_json::from_str(&config).ok()?;
                v.get("chat_template")?.as_str().map(str::to_string)
            })?;
        Self::default_system_prompt(&template)
    }

    /// Tokens that end an assistant turn in this format.
    pub fn stop_tokens(self) -> &'static [&'static str] {
        match self {
            Self::ChatMl => &["<|im_end|>"],
            Self::Llama3 => &["<|eot_id|>", "<|end_of_text|>"],
        }
    }
}
