//! Several sessions decoded as one batched step give each session what it gets alone,
//! on the tiny-llama fixtures of the recipes (portable fp32, XNNPACK fp32, XNNPACK
//! 8da4w, weight-only int8, 4-bit embedding): the same greedy tokens, logits within 1e-5, a session that joins
//! mid-way included; and a batched step allocates nothing after warm-up. One binary
//! with the counting allocator, the tests in one function so that no other test's
//! allocations are counted.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use common::{ByteTokenizer, fixtures};
use etch_llm::{
    Engine, EngineOptions, ForwardShape, LlmMetadata, Runner, SamplingConfig, Session, TurnRequest,
    argmax,
};
use etch_memory::counting::CountingAllocator;
use etch_runtime::{Batch, LoadMode, Module};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const FIXTURES: [&str; 5] = [
    "tiny_llama_fp32",
    "tiny_llama_xnnpack",
    "tiny_llama_8da4w_xnnpack",
    // Weight-only int8 (dequantized constants folded at load into the linears' weights)
    // and a 4-bit quantized embedding.
    "tiny_llama_int8",
    "tiny_llama_emb4",
];

fn module(name: &str, threads: usize) -> Module {
    Module::from_path(fixtures().join(format!("{name}.pte")))
        .load_mode(LoadMode::Read)
        .threads(threads)
        .build()
        .expect("fixture loads")
}

fn sessions(module: &mut Module, count: usize) -> Vec<Session> {
    let meta = LlmMetadata::read(module, "forward").expect("metadata");
    let shape = ForwardShape::new(&meta, meta.vocab_size.unwrap_or(256));
    (0..count)
        .map(|_| Session::new(module.program().method("forward").unwrap(), shape))
        .collect()
}

fn prompt(len: usize, salt: u64) -> Vec<u64> {
    (0..len as u64).map(|i| (i * 29 + salt * 7) % 256).collect()
}

/// Greedy tokens and the logits after each step of one session decoding alone.
fn alone(session: &mut Session, prompt: &[u64], steps: usize) -> (Vec<u64>, Vec<Vec<f32>>) {
    let stop = AtomicBool::new(false);
    session.prefill(prompt, &stop).unwrap();
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let t = u64::from(argmax(session.logits()));
        session.decode(t).unwrap();
        tokens.push(t);
        logits.push(session.logits().to_vec());
    }
    (tokens, logits)
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Three sessions decoded together (the third joining after `join` steps) against
/// each alone.
fn batched_equals_alone(name: &str, threads: usize) {
    let mut m = module(name, threads);
    let prompts = [prompt(7, 1), prompt(3, 2), prompt(11, 3)];
    let steps = 12;
    let join = 4;
    let mut solo = sessions(&mut m, 3);
    let expected: Vec<_> = solo
        .iter_mut()
        .zip(&prompts)
        .enumerate()
        .map(|(i, (s, p))| alone(s, p, if i == 2 { steps - join } else { steps }))
        .collect();

    let mut together = sessions(&mut m, 3);
    let stop = AtomicBool::new(false);
    for (s, p) in together.iter_mut().zip(&prompts).take(2) {
        s.prefill(p, &stop).unwrap();
    }
    let mut got: Vec<(Vec<u64>, Vec<Vec<f32>>)> = vec![Default::default(); 3];
    for step in 0..steps {
        if step == join {
            together[2].prefill(&prompts[2], &stop).unwrap();
        }
        let active = if step < join { 2 } else { 3 };
        let mut batch = Batch::new();
        for (i, s) in together.iter_mut().take(active).enumerate() {
            let t = u64::from(argmax(s.logits()));
            got[i].0.push(t);
            assert!(batch.push((s, t)).is_ok());
        }
        Session::decode_batch(&mut batch).unwrap();

        for (i, s) in together.iter().take(active).enumerate() {
            got[i].1.push(s.logits().to_vec());
        }
    }
    // Every linear ran once for the batch: the portable `linear`s, or the delegates'
    // fully connected nodes (the other delegates share nothing).
    let stats = together[0].method().stats();
    assert_eq!(stats.batched_executions, steps as u64, "{name}");
    let per_step = stats.shared_instructions / stats.batched_executions;
    assert!(
        per_step >= 5,
        "{name}: {per_step} shared instructions per batched step"
    );
    for (i, ((tokens, logits), (want_tokens, want_logits))) in got.iter().zip(&expected).enumerate()
    {
        assert_eq!(
            tokens, want_tokens,
            "{name}, {threads} threads: session {i}'s tokens"
        );
        for (step, (a, b)) in logits.iter().zip(want_logits).enumerate() {
            let d = max_difference(a, b);
            assert!(
                d <= 1e-5,
                "{name}, {threads} threads: session {i} step {step}: logits differ by {d}"
            );
        }
    }
}

/// Heap allocations of `steps` batched decode steps of `count` sessions.
fn allocations_of_batched_steps(name: &str, count: usize, steps: usize) -> u64 {
    let mut m = module(name, 1);
    let mut s = sessions(&mut m, count);
    let stop = AtomicBool::new(false);
    for (i, session) in s.iter_mut().enumerate() {
        session.prefill(&prompt(5, i as u64), &stop).unwrap();
    }
    let step = |s: &mut [Session]| {
        let mut batch = Batch::new();
        for session in s.iter_mut() {
            let t = u64::from(argmax(session.logits()));
            let _ = batch.push((session, t));
        }
        Session::decode_batch(&mut batch).unwrap();
    };
    // Warm-up: the temp allocators' caches grow to the step's scratch.
    step(&mut s);
    let before = CountingAllocator::global_counts();
    for _ in 0..steps {
        step(&mut s);
    }
    CountingAllocator::global_counts()
        .since(&before)
        .allocations
}

/// The engine's batched step: turns stepped together give the tokens they give alone.
fn engine_batched_equals_alone(name: &str) {
    let request = |session: &str, p: Vec<u64>| TurnRequest {
        session: Some(session.to_string()),
        prompt: p,
        max_new_tokens: Some(9),
        sampling: SamplingConfig::default(),
        stop: Vec::new(),
        ignore_eos: true,
    };
    let runner = || {
        Runner::from_parts(
            module(name, 2),
            Box::new(ByteTokenizer),
            "forward",
            Instant::now(),
        )
        .unwrap()
    };
    let cancel = || Arc::new(AtomicBool::new(false));
    let names = ["a", "b", "c"];
    let mut alone = Engine::new(runner(), EngineOptions { max_sessions: 4 });
    let expected: Vec<Vec<u64>> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let done = alone
                .run(&request(n, prompt(4 + i, i as u64)), cancel(), &mut |_| {})
                .unwrap();
            done.generated_token_ids.unwrap()
        })
        .collect();
    let mut e = Engine::new(runner(), EngineOptions { max_sessions: 4 });
    let mut turns: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            e.start(&request(n, prompt(4 + i, i as u64)), cancel())
                .unwrap()
        })
        .collect();
    let mut got: Vec<Option<Vec<u64>>> = vec![None; 3];
    let mut ids: Vec<usize> = (0..3).collect();
    while !turns.is_empty() {
        let mut finished = Vec::new();
        e.step_batch(&mut turns, &mut |_, _| {}, &mut |i, result| {
            finished.push((i, result.unwrap()));
        });
        finished.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, done) in finished {
            got[ids[i]] = done.generated_token_ids;
            turns.remove(i);
            ids.remove(i);
        }
    }
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(got[i].as_ref(), Some(want), "{name}: turn {i}");
    }
}

#[test]
fn batched_sessions_get_what_they_get_alone() {
    // Allocations first, before any thread pool of another test exists.
    for name in FIXTURES {
        allocations_of_batched_steps(name, 3, 2);
        let few = allocations_of_batched_steps(name, 3, 4);
        let many = allocations_of_batched_steps(name, 3, 16);
        assert_eq!(
            few, many,
            "{name}: allocations grow with batched steps ({few} for 4, {many} for 16)"
        );
    }
    for name in FIXTURES {
        for threads in [1, 2] {
            batched_equals_alone(name, threads);
        }
        engine_batched_equals_alone(name);
    }
}
