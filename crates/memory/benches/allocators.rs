//! The attention-scratch pattern of a decode loop, per allocator.
//!
//! One iteration is one simulated kernel call: allocate 3 blocks at 64-byte alignment
//! (16 KiB + 4 KiB/step, 16 KiB + 1 KiB/step, 64 KiB + 64 B/step, so sizes grow slowly
//! from 16 KiB to ~4 MiB over 1000 steps and then start again), touch them, reset.
//!
//! * `attention_scratch/<allocator>`: touch the first and last byte of each block (the
//!   allocator's own cost).
//! * `attention_scratch_pages/<allocator>`: write one byte per 4 KiB page (adds the
//!   page faults a fresh system block costs).
//!
//! After the timings, the bench prints the system allocations per call over 1000 warm
//! calls for each allocator.
//!
//! Run: `cargo bench -p etch-memory --bench allocators -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::Criterion;
use etch_memory::MemoryAllocator;
use etch_memory::allocator::{ArenaAllocator, CachingAllocator, MallocAllocator};

const STEPS: usize = 1000;
const PAGE: usize = 4096;

fn sizes(step: usize) -> [usize; 3] {
    [
        (16 << 10) + step * 4096,
        (16 << 10) + step * 1024,
        (64 << 10) + step * 64,
    ]
}

#[inline(always)]
fn kernel_call(a: &mut dyn MemoryAllocator, step: usize, every_page: bool) {
    for size in sizes(step) {
        let p = a.allocate(size, 64).expect("allocation failed");
        // SAFETY: p is valid for `size` bytes until the reset below.
        unsafe {
            if every_page {
                let mut off = 0;
                while off < size {
                    p.as_ptr().add(off).write(step as u8);
                    off += PAGE;
                }
            }
            p.as_ptr().write(step as u8);
            p.as_ptr().add(size - 1).write(step as u8);
        }
        black_box(p);
    }
    a.reset();
}

fn allocators() -> Vec<Box<dyn MemoryAllocator>> {
    vec![
        Box::new(MallocAllocator::new()),
        // The runner's default budget upstream is 10 MiB; the working set across all
        // classes of this schedule is larger, so 64 MiB keeps it all.
        Box::new(CachingAllocator::new(64 << 20)),
        Box::new(ArenaAllocator::with_capacity(8 << 20).unwrap()),
    ]
}

fn bench(c: &mut Criterion) {
    for (group, every_page) in [
        ("attention_scratch", false),
        ("attention_scratch_pages", true),
    ] {
        let mut g = c.benchmark_group(group);
        for mut a in allocators() {
            let mut step = 0;
            g.bench_function(a.name(), |b| {
                b.iter(|| {
                    kernel_call(a.as_mut(), step, every_page);
                    step = (step + 1) % STEPS;
                })
            });
        }
        g.finish();
    }
}

fn report_system_allocations() {
    println!("system allocations per call, 1000 calls after a 1000-call warm-up:");
    for mut a in allocators() {
        for step in 0..STEPS {
            kernel_call(a.as_mut(), step, false);
        }
        let before = a.stats();
        for step in 0..STEPS {
            kernel_call(a.as_mut(), step, false);
        }
        let after = a.stats();
        let per_call = (after.system_allocations - before.system_allocations) as f64 / STEPS as f64;
        println!(
            "  {:8} {:.3} (hits {}, misses {}, bytes cached {})",
            a.name(),
            per_call,
            after.hits - before.hits,
            after.misses - before.misses,
            after.bytes_cached
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    report_system_allocations();
}
