//! etch's LLM layer: generate text from an exported LLM.
//!
//! * [`Runner`]: reads the model's metadata methods, prefills the prompt in as few calls
//!   as the program allows, decodes token by token, stops at EOS, at `max_new_tokens`
//!   or when the context is full; every buffer is owned by the runner and reused.
//! * [`Sampler`]: greedy, temperature, top-k, top-p, repetition penalty, seeded.
//! * [`Tokenizer`]: Hugging Face `tokenizer.json`, tiktoken files, llama2.c
//!   `tokenizer.bin`; [`StreamDecoder`] for streaming text.
//! * [`ChatTemplate`]: ChatML and Llama 3 prompts.

// Errors wrap the runtime's, which carry their context by value; they are cold.
#![allow(clippy::result_large_err)]

mod chat;
mod error;
mod metadata;
mod runner;
mod sampler;
pub mod tokenizer;

pub use chat::ChatTemplate;
pub use error::LlmError;
pub use metadata::LlmMetadata;
pub use runner::{
    DEFAULT_TEMP_CACHE_BYTES, Generation, GenerationStats, Runner, RunnerOptions, StopReason,
    peak_rss_bytes,
};
pub use sampler::{Sampler, SamplingConfig, argmax};
pub use tokenizer::{StreamDecoder, Tokenizer, load_tokenizer, load_tokenizer_bytes};
