//! The runner on the tiny-llama fixture: chunked prefill, context limits, bad prompts.

mod common;

use common::runner;
use etch_llm::{LlmError, SamplingConfig, StopReason};

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

    r.reset().unwrap();
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
