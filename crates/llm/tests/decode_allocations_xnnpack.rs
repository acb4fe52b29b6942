//! The runner on the XNNPACK-delegated tiny llamas (fp32 and 8da4w, exported by
//! ExecuTorch's LLM exporter with `-X --xnnpack-extended-ops`): greedy tokens equal the
//! official runtime's, and decode steps make no heap allocations, delegates included.
//! Its own test binary, so no other test's allocations are counted.

mod common;

use common::{fixture_runner, fixtures, tokens};
use etch_llm::SamplingConfig;
use etch_memory::counting::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn delegated_decode_matches_the_official_tokens_and_does_not_allocate() {
    for name in ["tiny_llama_xnnpack", "tiny_llama_8da4w_xnnpack"] {
        let dir = fixtures().join(name);
        let prompt = tokens(&dir.join("call0.in0.npy"));
        let official: Vec<u64> = (1..=4)
            .flat_map(|k| tokens(&dir.join(format!("call{k}.in0.npy"))))
            .collect();
        let mut r = fixture_runner(name, 1);
        let g = r
            .generate(&prompt, 24, SamplingConfig::default(), &mut |_| {})
            .expect("generation");
        assert_eq!(
            &g.generated_token_ids[..official.len()],
            &official[..],
            "{name}"
        );
        let per_token = g
            .stats
            .heap_allocations_per_decoded_token
            .expect("counting allocator installed");
        assert_eq!(
            per_token, 0.0,
            "{name}: serial decode steps must not touch the heap"
        );
    }
}
