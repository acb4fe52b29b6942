//! Serving etch LLMs to applications.
//!
//! * [`worker`]: `etch-worker`, the model worker that ExecuTorch's own OpenAI-compatible
//!   server (`executorch` 1.5.1 on PyPI) spawns with `--worker-bin`.
//! * [`http`]: `etch serve`, an OpenAI-compatible HTTP server of etch's own.
//!
//! Both drive one [`etch_llm::Engine`]: named sessions with warm resume on one loaded
//! program.

// Errors wrap the LLM layer's, which carry the runtime's context by value; they are cold.
#![allow(clippy::result_large_err)]

pub mod http;
pub mod worker;
