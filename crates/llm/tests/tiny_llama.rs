//! The runner on the tiny-llama fixture (exported by ExecuTorch's own LLM exporter):
//! greedy tokens equal the official runtime's, and decode makes no heap allocations.

use std::path::{Path, PathBuf};
use std::time::Instant;

use etch_llm::{LlmError, Runner, SamplingConfig, StopReason, Tokenizer};
use etch_memory::counting::CountingAllocator;
use etch_runtime::{LoadMode, Module};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// One id per byte: enough to drive a 256-token model.
struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, LlmError> {
        Ok(String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned())
    }
    fn token_id(&self, _: &str) -> Option<u32> {
        None
    }
    fn vocab_size(&self) -> usize {
        256
    }
    fn bos_id(&self) -> Option<u32> {
        None
    }
    fn eos_ids(&self) -> Vec<u32> {
        Vec::new()
    }
    fn kind(&self) -> &'static str {
        "bytes"
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn tokens(file: &Path) -> Vec<u64> {
    let t = etch_runtime::npy::read_npy_file(file).expect("fixture npy");
    t.as_slice::<i64>()
        .expect("i64 tokens")
        .into_iter()
        .map(|v| v as u64)
        .collect()
}

fn runner(threads: usize) -> Runner {
    let module = Module::from_path(fixtures().join("tiny_llama_fp32.pte"))
        .load_mode(LoadMode::File)
        .threads(threads)
        .build()
        .expect("fixture loads");
    Runner::from_parts(module, Box::new(ByteTokenizer), "forward", Instant::now()).expect("runner")
}

#[test]
fn greedy_tokens_match_the_official_runtime_and_decode_does_not_allocate() {
    let dir = fixtures().join("tiny_llama_fp32");
    let prompt = tokens(&dir.join("call0.in0.npy"));
    // The fixture's decode inputs are the official runtime's greedy tokens.
    let official: Vec<u64> = (1..=4)
        .flat_map(|k| tokens(&dir.join(format!("call{k}.in0.npy"))))
        .collect();
    for threads in [1, 2] {
        let mut r = runner(threads);
        let meta = r.metadata().clone();
        assert_eq!((meta.max_seq_len, meta.max_context_len), (32, 64));
        assert_eq!(
            meta.max_prefill_chunk, 31,
            "bounded by the token input, not get_max_seq_len"
        );
        let g = r
            .generate(&prompt, 24, SamplingConfig::default(), &mut |_| {})
            .expect("generation");
        assert_eq!(
            &g.generated_token_ids[..official.len()],
            &official[..],
            "{threads} threads"
        );
        assert_eq!(g.stop_reason, StopReason::MaxNewTokens);
        assert_eq!(
            g.stats.heap_allocations_per_decoded_token,
            Some(0.0),
            "decode steps must not touch the heap ({threads} threads)"
        );
    }
}

#[test]
fn long_prompts_are_chunked_and_the_context_limit_is_reported() {
    let mut r = runner(1);
    let prompt: Vec<u64> = (0..40).map(|i| (i * 7 % 256) as u64).collect();
    let g = r
        .generate(&prompt, 100, SamplingConfig::default(), &mut |_| {})
        .expect("generation");
    assert_eq!(g.stats.prefill_calls, 2, "40 tokens in chunks of 31");
    assert_eq!(g.stop_reason, StopReason::ContextFull);
    assert_eq!(prompt.len() + g.generated_token_ids.len(), 64 + 1);

    r.reset();
    let too_long: Vec<u64> = vec![1; 64];
    assert!(matches!(
        r.generate(&too_long, 4, SamplingConfig::default(), &mut |_| {}),
        Err(LlmError::PromptTooLong { .. })
    ));
    assert!(matches!(
        r.generate(&[], 4, SamplingConfig::default(), &mut |_| {}),
        Err(LlmError::EmptyPrompt)
    ));
    assert!(matches!(
        r.generate(&[999], 4, SamplingConfig::default(), &mut |_| {}),
        Err(LlmError::TokenOutOfRange { .. })
    ));
}
