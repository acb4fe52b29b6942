//! What a `parallel_for` costs on the runtime's thread pool (rayon), as decode calls it:
//! between two parallel kernels the calling thread runs small serial kernels for a few
//! to a few hundred microseconds, long enough for idle rayon workers to go to sleep.
//!
//! Each iteration spins `gap` µs on the caller (the serial kernels), then times one
//! `parallel_for` of one 10 µs task per thread; only the `parallel_for` is timed, so
//! the figure minus 10 µs is the hand-off cost. Run with
//! `cargo bench -p etch-kernels --bench pool -- --warm-up-time 1 --measurement-time 3`.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use etch_kernels::ThreadPool;

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn benches(c: &mut Criterion) {
    let threads = etch_kernels::default_threads().max(2);
    let pool = ThreadPool::new(threads).unwrap();
    let task = Duration::from_micros(10);
    let mut g = c.benchmark_group(format!("parallel_for_{threads}x10us"));
    for gap_us in [0u64, 5, 20, 100] {
        let gap = Duration::from_micros(gap_us);
        g.bench_function(format!("after_{gap_us}us_serial"), |b| {
            b.iter_custom(|iters| {
                pool.install(|| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        spin(gap);
                        let t = Instant::now();
                        pool.parallel_for(0..threads, 1, |_, _| spin(task));
                        total += t.elapsed();
                    }
                    total
                })
            })
        });
    }
    g.finish();
}

criterion_group!(pool, benches);
criterion_main!(pool);
