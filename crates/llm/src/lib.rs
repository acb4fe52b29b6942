//! etch's LLM layer: generate text from an exported LLM.
//!
//! * [`Runner`]: reads the model's metadata methods, prefills the prompt in as few calls
//!   as the program allows, decodes token by token, stops at EOS, at `max_new_tokens`
//!   or when the context is full; every buffer is owned by the runner and reused.
//! * [`Session`] and [`Engine`]: one conversation's state on a loaded program, and named
//!   sessions with warm resume, turns started then stepped token by token (the servers).
//! * [`Sampler`]: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded.
//! * [`Tokenizer`]: Hugging Face `tokenizer.json`, tiktoken files, llama2.c
//!   `tokenizer.bin`; [`StreamDecoder`] for streaming text.
//! * [`JinjaChatTemplate`]: the model's own chat template (the built-in
//!   [`ChatTemplate`] formats where it has none); [`Conversation`]: multi-turn chat on
//!   one KV cache, each turn prefilling only its own tokens.
//!
//! # Heap allocations in the token loop
//!
//! After load, one `generate` allocates a fixed number of times whatever the number of
//! tokens: the sampler, the result's id and text buffers (reserved from
//! `max_new_tokens`, capped by the context left), the prompt's copy in the result. Each
//! step of the token loop -- the model step, sampling, detokenising (a look-up in the
//! [`tokenizer::TokenBytes`] table built at load; an incomplete UTF-8 character waits in
//! a reused buffer) and the `on_text` callback -- allocates nothing in steady state.
//! `GenerationStats::heap_allocations_per_decoded_token` counts those steps (from the
//! third on) when the binary installs etch-memory's counting allocator: with one thread,
//! this thread's allocations exactly; with a pool, the whole process's during each step.
//! It does not count loading, tokenising the prompt, prefill, the first two steps (they
//! warm the temp allocator's cache), nor what the caller's `on_text` does outside the
//! step: the CLI writes each piece to stdout with `write_all` and `flush`, which
//! allocate nothing, and an LD_PRELOAD malloc counter (bench/malloc_count.c) over the
//! whole `etch generate` process counts the same total for 8 and for 40 tokens on the
//! tiny llama, and for 16 and for 48 on SmolLM2-135M (fp32, XNNPACK, 8da4w; 1 and 2
//! threads).

// Errors wrap the runtime's, which carry their context by value; they are cold.
#![allow(clippy::result_large_err)]

mod chat;
mod conversation;
mod engine;
mod error;
mod generation_config;
mod jinja;
mod metadata;
mod runner;
mod sampler;
mod session;
mod stop;
pub mod tokenizer;

pub use chat::ChatTemplate;
pub use conversation::{Conversation, OnFull, Turn};
pub use engine::{
    ActiveTurn, Completion, END_OF_TURN_TOKENS, Engine, EngineMemory, EngineOptions, FinishReason,
    SessionError, TurnError, TurnRequest,
};
pub use error::LlmError;
pub use generation_config::SamplingDefaults;
pub use jinja::{JinjaChatTemplate, MAX_RENDERED_BYTES, MAX_TEMPLATE_BYTES, TEMPLATE_FUEL};
pub use metadata::LlmMetadata;
pub use runner::{
    DEFAULT_TEMP_CACHE_BYTES, Generation, GenerationStats, Runner, RunnerOptions, StopReason,
    peak_rss_bytes,
};
pub use sampler::{Sampler, SamplingConfig, argmax};
pub use session::{ForwardShape, PrefillPlan, ResumeReason, Session};
pub use stop::StopStrings;
pub use tokenizer::{StreamDecoder, Tokenizer, load_tokenizer, load_tokenizer_bytes};
