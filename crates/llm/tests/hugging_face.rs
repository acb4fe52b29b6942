//! The runner on programs Hugging Face's optimum-executorch exports (XNNPACK, 8da4w
//! linears, 4-bit embedding, custom SDPA and KV cache): a `[S]` cache-position input,
//! `[1, S, vocab]` logits, `get_eos_id` and `get_max_seq_len` without
//! `get_max_context_len`; Gemma 3's sliding-window layer with a ring-buffer cache and
//! soft-capped logits, SmolLM 3's layers without RoPE. The greedy chain equals the
//! official runtime's.

mod common;

use common::{fixture_runner, fixtures, tokens};
use etch_llm::SamplingConfig;

const DECODE_STEPS: usize = 8;

#[test]
fn optimum_exports_generate_the_official_tokens() {
    let cases: [(&str, &[u64]); 3] = [
        ("optimum_qwen3", &[2]),
        ("optimum_gemma3", &[2, 3]),
        ("optimum_smollm3", &[2]),
    ];
    for (name, eos) in cases {
        let dir = fixtures().join(name);
        let prompt = tokens(&dir.join("call0.in0.npy"));
        let official: Vec<u64> = (1..=DECODE_STEPS)
            .flat_map(|k| tokens(&dir.join(format!("call{k}.in0.npy"))))
            .collect();
        let mut r = fixture_runner(name, 1);
        let meta = r.metadata().clone();
        assert_eq!(meta.eos_ids, eos, "{name}: get_eos_id");
        assert_eq!(
            meta.max_context_len, 64,
            "{name}: the cache is get_max_seq_len long"
        );
        assert!(
            meta.position_is_vector,
            "{name}: cache_position is a vector"
        );
        let g = r
            .generate(
                &prompt,
                DECODE_STEPS,
                SamplingConfig::default(),
                &mut |_| {},
            )
            .expect("generation");
        assert_eq!(g.stats.prefill_calls, 1, "{name}");
        let n = official.len().min(g.generated_token_ids.len());
        assert_eq!(
            &g.generated_token_ids[..n],
            &official[..n],
            "{name}: greedy tokens"
        );
        // Gemma's chain meets an EOS (2) at its fifth token, where generation stops.
        let stopped_at_eos = g
            .generated_token_ids
            .last()
            .is_some_and(|t| eos.contains(t));
        assert!(n >= DECODE_STEPS || stopped_at_eos, "{name}: {n} tokens");
    }
}
