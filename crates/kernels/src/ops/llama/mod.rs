//! The LLM custom ops of ExecuTorch's `llama` namespace.

use crate::Registry;

/// Registers this family's kernels.
pub fn register(_r: &mut Registry) {}
