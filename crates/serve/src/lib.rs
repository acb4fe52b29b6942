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

/// The message a caught panic carries (`"unknown"` when it is not a string).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".into())
}
