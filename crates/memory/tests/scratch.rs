//! `TempScope` over each allocator: scratch comes from the allocator, is aligned and
//! initialised even when the allocator recycles dirty memory, and falls back to the
//! heap (counted) when the allocator cannot serve it.

use etch_memory::allocator::{ArenaAllocator, CachingAllocator, MallocAllocator};
use etch_memory::{DIRTY_FILL, MemoryAllocator, TempScope};

fn all_allocators() -> Vec<Box<dyn MemoryAllocator>> {
    vec![
        Box::new(ArenaAllocator::with_capacity(1 << 16).unwrap()),
        Box::new(MallocAllocator::new()),
        Box::new(CachingAllocator::new(1 << 16)),
    ]
}

#[test]
fn scratch_comes_from_each_allocator() {
    for mut a in all_allocators() {
        for call in 0..3 {
            {
                let scope = TempScope::new(Some(a.as_ref()));
                let x = scope.scratch::<f32>(1000).unwrap();
                let y = scope.scratch_filled::<i32>(17, -1).unwrap();
                assert_eq!(x.as_ptr() as usize % 64, 0);
                assert_eq!(y.as_ptr() as usize % 64, 0);
                assert!(x.iter().all(|&v| v == 0.0), "{} call {call}", a.name());
                assert!(y.iter().all(|&v| v == -1));
                // Dirty the memory for the next call.
                x.fill(f32::NAN);
                y.fill(7);
                let s = scope.stats();
                assert_eq!((s.allocations, s.fallbacks), (2, 0));
                assert_eq!(s.bytes, 4000 + 68);
            }
            assert_eq!(a.stats().allocations, 2 * (call + 1), "{}", a.name());
            a.reset();
        }
    }
}

#[test]
fn recycled_caching_scratch_is_reinitialised() {
    let mut cache = CachingAllocator::new(1 << 20);
    let first = {
        let scope = TempScope::new(Some(&cache));
        let s = scope.scratch::<u64>(100).unwrap();
        s.fill(u64::MAX);
        s.as_ptr()
    };
    cache.reset();
    let scope = TempScope::new(Some(&cache));
    let s = scope.scratch::<u64>(100).unwrap();
    assert_eq!(s.as_ptr(), first, "the same block was recycled");
    assert!(s.iter().all(|&v| v == 0));
    assert_eq!(cache.stats().hits, 1);
}

#[test]
fn exhausted_arena_falls_back_to_the_heap() {
    let arena = ArenaAllocator::with_capacity(256).unwrap();
    let scope = TempScope::new(Some(&arena));
    let a = scope.scratch::<u8>(200).unwrap();
    let b = scope.scratch::<u8>(200).unwrap();
    a.fill(1);
    b.fill(2);
    assert!(a.iter().all(|&v| v == 1));
    let s = scope.stats();
    assert_eq!((s.allocations, s.fallbacks, s.fallback_bytes), (2, 1, 200));
    assert_eq!(arena.stats().allocations, 1);
}

#[test]
fn scopes_on_several_threads_share_a_caching_allocator() {
    let mut cache = CachingAllocator::new(1 << 20);
    for _ in 0..3 {
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let cache = &cache;
                s.spawn(move || {
                    let scope = TempScope::new(Some(cache));
                    let x = scope.scratch_filled::<u32>(5000, t).unwrap();
                    std::thread::yield_now();
                    assert!(x.iter().all(|&v| v == t));
                    assert_eq!(scope.stats().fallbacks, 0);
                });
            }
        });
        cache.reset();
    }
    let s = cache.stats();
    assert_eq!((s.allocations, s.misses, s.hits), (12, 4, 8));
}

#[test]
fn dirty_scratch_skips_clearing_only_where_blocks_are_initialised() {
    for mut a in all_allocators() {
        let recycles = a.initialised_blocks();
        for call in 0..2 {
            {
                let scope = TempScope::new(Some(a.as_ref()));
                let x = scope.scratch_dirty::<f32>(1000).unwrap();
                assert_eq!(x.as_ptr() as usize % 64, 0);
                if cfg!(debug_assertions) {
                    // Debug builds: poison, whatever the allocator.
                    assert!(
                        x.iter()
                            .all(|v| v.to_bits() == u32::from_ne_bytes([DIRTY_FILL; 4])),
                        "{} call {call}",
                        a.name()
                    );
                } else if call == 0 || !recycles {
                    // Fresh memory (or an allocator without the promise): zeros.
                    assert!(x.iter().all(|&v| v == 0.0), "{} call {call}", a.name());
                } else {
                    // The block of the first call, as that call left it.
                    assert!(x.iter().all(|&v| v == 1.5), "{} call {call}", a.name());
                }
                x.fill(1.5);
                assert_eq!(scope.stats().allocations, 1);
            }
            a.reset();
        }
    }
    assert!(
        ArenaAllocator::with_capacity(64)
            .unwrap()
            .initialised_blocks()
    );
    assert!(CachingAllocator::new(1 << 16).initialised_blocks());
    assert!(!MallocAllocator::new().initialised_blocks());
}
