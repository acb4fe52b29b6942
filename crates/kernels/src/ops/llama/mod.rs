//! The LLM custom ops of ExecuTorch's `llama` namespace: KV-cache updates and
//! scaled dot-product attention over `[B, S, H, D]` caches (float and int8-quantized).
//!
//! * `update_cache`: `update_cache.out`, `update_cache_with_indices.out` (in-place,
//!   dtype-agnostic row copies into the cache).
//! * `sdpa`: `custom_sdpa.out` and `sdpa_with_kv_cache.out` (f32, f16, bf16).
//! * `quantized_sdpa`: `custom_quantized_sdpa.out` (int8 q/k/v with per-token,
//!   per-head scales and zero points; f32 out).
//! * `gated_delta_rule`: `gated_delta_rule.out` and its deprecated name
//!   `channelwise_gated_delta_rule.out` (Gated DeltaNet's recurrence, Qwen3.5).
//! * `hadamard`: `fast_hadamard_transform.out` (SpinQuant's activation rotation).
//! * `flash`: the shared blocked attention engine (online softmax, query/key
//!   blocks, split-K for decode), with its inner loops in `etch_linalg::attention`.

mod flash;
mod gated_delta_rule;
mod hadamard;
mod quantized_sdpa;
mod sdpa;
mod update_cache;

use crate::Registry;

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("llama::update_cache.out", update_cache::update_cache_out);
    r.register(
        "llama::update_cache_with_indices.out",
        update_cache::update_cache_with_indices_out,
    );
    r.register("llama::custom_sdpa.out", sdpa::custom_sdpa_out);
    r.register(
        "llama::sdpa_with_kv_cache.out",
        sdpa::sdpa_with_kv_cache_out,
    );
    r.register(
        "llama::custom_quantized_sdpa.out",
        quantized_sdpa::custom_quantized_sdpa_out,
    );
    r.register(
        "llama::gated_delta_rule.out",
        gated_delta_rule::gated_delta_rule_out,
    );
    r.register(
        "llama::channelwise_gated_delta_rule.out",
        gated_delta_rule::gated_delta_rule_out,
    );
    r.register(
        "llama::fast_hadamard_transform.out",
        hadamard::fast_hadamard_transform_out,
    );
}
