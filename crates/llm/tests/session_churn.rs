//! Sessions opened and closed over and over give their memory back: planned memory is
//! the session's own and is freed when it closes, so a server whose clients open a new
//! session per conversation does not grow (the one test here owns the counting
//! allocator's global counts).

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use common::runner;
use etch_llm::{Engine, EngineOptions, SamplingConfig, TurnRequest};
use etch_memory::counting::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Heap bytes live now (allocated minus freed since the process started).
fn heap_live() -> i64 {
    let c = CountingAllocator::global_counts();
    c.bytes_allocated as i64 - c.bytes_deallocated as i64
}

#[test]
fn closed_sessions_give_their_planned_memory_back() {
    let mut engine = Engine::new(runner(1), EngineOptions { max_sessions: 4 });
    let round = |engine: &mut Engine, r: usize| {
        for s in 0..3 {
            let name = format!("s{s}");
            let request = TurnRequest {
                session: Some(name.clone()),
                prompt: (0..6u64)
                    .map(|i| (i * 7 + r as u64 + s) % 200 + 1)
                    .collect(),
                max_new_tokens: Some(3),
                sampling: SamplingConfig::default(),
                stop: Vec::new(),
                ignore_eos: false,
            };
            engine
                .run(&request, Arc::new(AtomicBool::new(false)), &mut |_| {})
                .expect("turn");
        }
        let planned = engine.memory().planned_bytes;
        for s in 0..3 {
            assert!(engine.close(&format!("s{s}")).expect("close"));
        }
        planned
    };
    // Two rounds to warm up (tokenizer caches, the temp allocators' first blocks).
    let planned = round(&mut engine, 0);
    round(&mut engine, 1);
    let open_one = engine.memory().planned_bytes;
    assert!(
        planned >= 4 * open_one,
        "4 sessions hold {planned} bytes, one {open_one}"
    );
    let warm = heap_live();
    for r in 2..12 {
        round(&mut engine, r);
    }
    let grown = heap_live() - warm;
    assert_eq!(engine.loaded_sessions(), 1);
    assert_eq!(engine.sessions_opened(), 36);
    assert_eq!(engine.sessions_closed(), 36);
    // 30 sessions opened and closed since: each plans `open_one` bytes, and none kept it.
    assert!(
        grown < open_one as i64 / 2,
        "the heap grew by {grown} bytes over 30 sessions opened and closed \
         (a session plans {open_one})"
    );
}
