//! The runner on the tiny Qwen3.5 fixtures (a Gated DeltaNet layer and a gated
//! full-attention layer, exported with upstream's static shapes, portable and
//! XNNPACK-delegated): the prompt is prefilled one token per call, 32 greedy tokens equal
//! the official runtime's, decode makes no heap allocations, and a reset (which must
//! clear the convolution and recurrent state the graph keeps in mutable buffers) gives
//! the same tokens again. Its own test binary, so no other test's allocations are
//! counted.

mod common;

use common::{fixture_runner, fixtures, tokens};
use etch_llm::SamplingConfig;
use etch_memory::counting::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const PROMPT_LEN: usize = 7;
const DECODE_STEPS: usize = 32;

#[test]
fn hybrid_programs_prefill_token_by_token_and_match_the_official_tokens() {
    for name in ["tiny_qwen3_5", "tiny_qwen3_5_xnnpack"] {
        let dir = fixtures().join(name);
        // Calls 0-6 feed the prompt one token each; calls 7.. feed the official greedy
        // tokens back, so their inputs are the official chain.
        let prompt: Vec<u64> = (0..PROMPT_LEN)
            .flat_map(|k| tokens(&dir.join(format!("call{k}.in0.npy"))))
            .collect();
        let official: Vec<u64> = (PROMPT_LEN..PROMPT_LEN + DECODE_STEPS)
            .flat_map(|k| tokens(&dir.join(format!("call{k}.in0.npy"))))
            .collect();
        let mut r = fixture_runner(name, 1);
        let first = r
            .generate(
                &prompt,
                DECODE_STEPS,
                SamplingConfig::default(),
                &mut |_| {},
            )
            .expect("generation");
        assert_eq!(
            first.stats.prefill_calls, PROMPT_LEN,
            "{name}: static shapes take one token per call"
        );
        assert_eq!(
            &first.generated_token_ids[..official.len()],
            &official[..],
            "{name}: greedy tokens"
        );
        let per_token = first
            .stats
            .heap_allocations_per_decoded_token
            .expect("counting allocator installed");
        assert_eq!(
            per_token, 0.0,
            "{name}: decode steps must not touch the heap"
        );

        r.reset().expect("reset");
        let again = r
            .generate(
                &prompt,
                DECODE_STEPS,
                SamplingConfig::default(),
                &mut |_| {},
            )
            .expect("generation after reset");
        assert_eq!(
            again.generated_token_ids, first.generated_token_ids,
            "{name}: a reset session starts from clear state"
        );
    }
}
