//! Proof that the caching and arena allocators make no heap allocation in steady state,
//! with `CountingAllocator` installed as this binary's global allocator.
//!
//! The workload is the attention-scratch pattern of a decode loop: per simulated kernel
//! call, 3 blocks at 64-byte alignment whose sizes grow slowly from 16 KiB towards
//! 4 MiB over 1000 calls, then a reset. Counting is per thread, so the test harness's
//! other threads do not pollute the figures.

use etch_memory::MemoryAllocator;
use etch_memory::allocator::{ArenaAllocator, CachingAllocator, MallocAllocator};
use etch_memory::counting::{AllocationCounts, CountingAllocator, count_allocations};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

const CYCLES: usize = 1000;

/// Block sizes of call `step`: 16 KiB + 4 KiB/step (to ~3.9 MiB), 16 KiB + 1 KiB/step
/// and 64 KiB + 64 B/step.
fn sizes(step: usize) -> [usize; 3] {
    [
        (16 << 10) + step * 4096,
        (16 << 10) + step * 1024,
        (64 << 10) + step * 64,
    ]
}

/// `CYCLES` simulated kernel calls: allocate the three blocks, touch them, reset.
fn decode_loop(a: &mut dyn MemoryAllocator, cycles: usize) {
    for step in 0..cycles {
        for size in sizes(step) {
            let p = a.allocate(size, 64).expect("allocation failed");
            // SAFETY: p is valid for `size` >= 1 bytes until the reset below.
            unsafe {
                p.as_ptr().write(step as u8);
                p.as_ptr().add(size - 1).write(step as u8);
            }
        }
        a.reset();
    }
}

/// Heap calls (allocations of any kind, and frees) in a measured pass after a warm-up
/// pass over the same schedule.
fn measure(a: &mut dyn MemoryAllocator, cycles: usize) -> AllocationCounts {
    decode_loop(a, cycles);
    let ((), counts) = count_allocations(|| decode_loop(a, cycles));
    counts
}

#[test]
#[cfg_attr(miri, ignore)]
fn caching_allocator_steady_state_makes_no_heap_allocations() {
    let mut cache = CachingAllocator::new(256 << 20);
    let counts = measure(&mut cache, CYCLES);
    assert!(CountingAllocator::is_installed());
    assert_eq!(counts, AllocationCounts::default(), "{counts:?}");
    let s = cache.stats();
    // The measured pass hit on every call.
    assert_eq!(s.allocations, 2 * 3 * CYCLES as u64);
    assert_eq!(s.hits, s.allocations - s.misses);
    assert!(s.misses < 3 * CYCLES as u64 / 10, "{s:?}");
    assert_eq!(s.system_frees, 0);
}

#[test]
#[cfg_attr(miri, ignore)]
fn caching_allocator_steady_state_under_a_tight_budget_frees_but_never_grows_bookkeeping() {
    // A budget smaller than the working set across classes: resets trim (freeing is
    // allowed), and misses allocate blocks, but the bookkeeping itself never grows once
    // warm: every heap allocation is one of the allocator's own blocks.
    let mut cache = CachingAllocator::new(8 << 20);
    // Two warm-up passes: a request may take a cached block of a larger class, which
    // sends that class's next request to the system, so the per-class high-water marks
    // (and the queues sized to them) settle only in the second pass.
    decode_loop(&mut cache, CYCLES);
    decode_loop(&mut cache, CYCLES);
    let before = cache.stats();
    let ((), counts) = count_allocations(|| decode_loop(&mut cache, CYCLES));
    let after = cache.stats();
    assert_eq!(
        counts.allocations,
        after.system_allocations - before.system_allocations
    );
    assert_eq!(
        counts.deallocations,
        after.system_frees - before.system_frees
    );
    assert!(after.bytes_cached <= 8 << 20);
}

#[test]
#[cfg_attr(miri, ignore)]
fn arena_makes_no_heap_allocations() {
    let mut arena = ArenaAllocator::with_capacity(8 << 20).unwrap();
    let counts = measure(&mut arena, CYCLES);
    assert_eq!(counts, AllocationCounts::default(), "{counts:?}");
}

#[test]
#[cfg_attr(miri, ignore)]
fn malloc_allocates_every_block() {
    let mut malloc = MallocAllocator::new();
    let counts = measure(&mut malloc, CYCLES);
    assert_eq!(counts.allocations, 3 * CYCLES as u64);
    assert_eq!(counts.deallocations, 3 * CYCLES as u64);
}

#[test]
fn small_steady_state_is_allocation_free() {
    // Miri-sized version of the tests above.
    let mut cache = CachingAllocator::new(1 << 20);
    let mut arena = ArenaAllocator::with_capacity(1 << 16).unwrap();
    for a in [&mut cache as &mut dyn MemoryAllocator, &mut arena] {
        let cycle = |a: &mut dyn MemoryAllocator| {
            for step in 0..20 {
                a.allocate(1000 + step, 64).unwrap();
                a.allocate(3000 + 3 * step, 64).unwrap();
                a.reset();
            }
        };
        cycle(a);
        let ((), counts) = count_allocations(|| cycle(a));
        assert_eq!(counts, AllocationCounts::default(), "{}", a.name());
    }
}

#[test]
fn counting_sees_only_the_calling_thread() {
    let ((), counts) = count_allocations(|| {
        let v: Vec<u64> = Vec::with_capacity(10);
        std::hint::black_box(&v);
    });
    assert_eq!(counts.allocations, 1);
    assert_eq!(counts.bytes_allocated, 80);
    assert_eq!(counts.deallocations, 1);

    // Another thread allocating meanwhile is not counted.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::black_box(vec![0u8; 100]);
                std::thread::yield_now();
            }
        });
        let global_before = CountingAllocator::global_counts();
        let ((), counts) = count_allocations(|| {
            for _ in 0..100 {
                std::thread::yield_now();
            }
        });
        assert_eq!(counts, AllocationCounts::default());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // The global counts see every thread.
        assert!(CountingAllocator::global_counts().allocations >= global_before.allocations);
    });
    // Nested counting: each level sees its own traffic.
    let (inner, outer) = count_allocations(|| {
        let (_, inner) = count_allocations(|| std::hint::black_box(Box::new(1u8)));
        std::hint::black_box(Box::new(2u8));
        inner
    });
    assert_eq!(inner.allocations, 1);
    assert_eq!(outer.allocations, 2);
}
