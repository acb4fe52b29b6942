//! The built-in chat formats, for tokenizers without a template of their own (the
//! formats' Jinja sources are in `jinja.rs`).

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
}
