//! The LLM layer's error type.

use etch_runtime::RuntimeError;

/// Why generation (or loading for it) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("tokenizer {path}: {message}")]
    Tokenizer { path: String, message: String },
    #[error("the program has no {0:?} method; it is required for text generation")]
    MissingMetadata(&'static str),
    #[error("metadata method {name:?} returned {found}, expected an integer")]
    BadMetadata { name: String, found: String },
    #[error("{0}")]
    Model(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt_tokens} tokens but the model's context holds {context} (at position {position})"
    )]
    PromptTooLong {
        prompt_tokens: usize,
        context: usize,
        position: usize,
    },
    #[error(
        "the conversation does not fit the model's context of {context} tokens: at position {position}, the next turn needs {needed} tokens (its prompt and room for the reply)"
    )]
    ContextFull {
        context: usize,
        position: usize,
        needed: usize,
    },
    #[error("token id {id} is outside the model's vocabulary of {vocab}")]
    TokenOutOfRange { id: u64, vocab: usize },
    #[error("{0}")]
    Template(String),
    #[error("cancelled")]
    Cancelled,
    #[error("invalid sampling setting: {0}")]
    Sampling(String),
}
