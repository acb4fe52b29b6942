//! The attention-scratch pattern of a decode loop, per allocator.
//!
//! One iteration is one simulated kernel call: allocate 3 blocks at 64-byte alignment
//! (16 KiB + 4 KiB/step, 16 KiB + 1 KiB/step, 64 KiB + 64 B/step, so sizes grow slowly
//! from 16 KiB to ~4 MiB over 1000 steps and then start again), touch them, reset.
//!
//! * `attention_scratch/<allocator>`: the allocator's own cost: the blocks are not
//!   touched (a touch of the far end of a 4 MiB block is a cache and TLB miss that
//!   costs more than the whole caching-allocator call).
//! * `attention_scratch_pages/<allocator>`: also write one byte per 4 KiB page of each
//!   block, as a kernel filling its scratch would (adds the page faults a fresh system
//!   block costs, and the cache misses every allocator pays).
//!
//! Each group is measured twice: in wall-clock time (`…/wall`) and in the benchmark
//! thread's CPU time (`…/cpu`, `CLOCK_THREAD_CPUTIME_ID`), which leaves out the time
//! the thread spends descheduled: on a shared machine that figure is the steadier one.
//!
//! After the timings, the bench prints the system allocations per call over 1000 warm
//! calls for each allocator.
//!
//! Run: `cargo bench -p etch-memory --bench allocators -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::Criterion;
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
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
        if every_page {
            let mut off = 0;
            while off < size {
                // SAFETY: off < size and p is valid for `size` bytes until the reset.
                unsafe { p.as_ptr().add(off).write(step as u8) };
                off += PAGE;
            }
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

/// The calling thread's CPU time, in nanoseconds.
struct ThreadCpuTime;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

static WALL: WallTime = WallTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Values are nanoseconds, as for wall time.
        WALL.formatter()
    }
}

fn bench<M: Measurement>(c: &mut Criterion<M>, clock: &str) {
    for (group, every_page) in [
        ("attention_scratch", false),
        ("attention_scratch_pages", true),
    ] {
        let mut g = c.benchmark_group(format!("{group}/{clock}"));
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
    let mut wall = Criterion::default().configure_from_args();
    bench(&mut wall, "wall");
    wall.final_summary();
    let mut cpu = Criterion::default()
        .with_measurement(ThreadCpuTime)
        .configure_from_args();
    bench(&mut cpu, "cpu");
    cpu.final_summary();
    report_system_allocations();
}
