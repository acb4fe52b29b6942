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
        match self {
            Self::ChatMl => {
                let mut s = String::new();
                if let Some(sys) = system {
                    s.push_str(&format!("<|im_start|>system\n{sys}<|im_end|>\n"));
                }
                s.push_str(&format!(
                    "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
                ));
                s
            }
            Self::Llama3 => {
                let mut s = String::from("<|begin_of_text|>");
                if let Some(sys) = system {
                    s.push_str(&format!(
                        "<|start_header_id|>system<|end_header_id|>\n\n{sys}<|eot_id|>"
                    ));
                }
                s.push_str(&format!(
                    "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
                ));
                s
            }
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

    /// Tokens that end an assistant turn in this format.
    pub fn stop_tokens(self) -> &'static [&'static str] {
        match self {
            Self::ChatMl => &["<|im_end|>"],
            Self::Llama3 => &["<|eot_id|>", "<|end_of_text|>"],
        }
    }
}
