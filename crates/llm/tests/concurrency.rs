//! One loaded program, several runners on several threads: every thread generates
//! exactly the tokens it generates alone, through many short interleaved runs.

mod common;

use std::time::Instant;

use common::{ByteTokenizer, fixtures};
use etch_llm::{Runner, SamplingConfig};
use etch_runtime::{LoadMode, Module, Program};

const THREADS: usize = 4;
const RUNS_PER_THREAD: usize = 12;

/// The prompt and sampling of run `k` of thread `t`: lengths, contents and sampling
/// differ from run to run so that interleaved runs touch different cache positions.
fn job(t: usize, k: usize) -> (Vec<u64>, SamplingConfig) {
    let len = 1 + (t * 7 + k * 5) % 23;
    let prompt = (0..len)
        .map(|i| ((t * 31 + k * 17 + i * 13) % 256) as u64)
        .collect();
    let sampling = SamplingConfig {
        min_p: 0.0,
        temperature: if k.is_multiple_of(3) { 0.0 } else { 0.8 },
        top_k: if k.is_multiple_of(2) { 0 } else { 40 },
        seed: (t * 1000 + k) as u64,
        ..SamplingConfig::default()
    };
    (prompt, sampling)
}

fn runner(program: &Program) -> Runner {
    Runner::from_parts(
        Module::from_program(program.clone()),
        Box::new(ByteTokenizer),
        "forward",
        Instant::now(),
    )
    .expect("runner")
}

fn tokens(runner: &mut Runner, t: usize, k: usize) -> Vec<u64> {
    let (prompt, sampling) = job(t, k);
    runner.reset().unwrap();
    runner
        .generate(&prompt, 6, sampling, &mut |_| {})
        .expect("generation")
        .generated_token_ids
}

#[test]
fn threads_sharing_one_program_generate_what_each_generates_alone() {
    for pool_threads in [1, 2] {
        let program = Program::from_path(fixtures().join("tiny_llama_fp32.pte"))
            .load_mode(LoadMode::Read)
            .threads(pool_threads)
            .build_program()
            .expect("fixture loads");
        let mut alone = runner(&program);
        let reference: Vec<Vec<Vec<u64>>> = (0..THREADS)
            .map(|t| {
                (0..RUNS_PER_THREAD)
                    .map(|k| tokens(&mut alone, t, k))
                    .collect()
            })
            .collect();
        drop(alone);

        std::thread::scope(|s| {
            for (t, want) in reference.iter().enumerate() {
                let program = &program;
                s.spawn(move || {
                    let mut mine = runner(program);
                    for (k, want) in want.iter().enumerate() {
                        assert_eq!(
                            &tokens(&mut mine, t, k),
                            want,
                            "thread {t}, run {k}, pool of {pool_threads}"
                        );
                    }
                });
            }
        });
    }
}
