//! Model-based property tests: random sequences of allocations, resets and trims on
//! every allocator, checked against a model after every step (alignment, disjoint live
//! blocks whose contents survive, exact stats, the cache budget).

#![cfg_attr(miri, allow(dead_code, unused_imports))]

use std::ptr::NonNull;

use etch_memory::allocator::{ArenaAllocator, CachingAllocator, MallocAllocator, size_class};
use etch_memory::{AlignedBuffer, AllocError, MemoryAllocator};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        align_log2: u32,
    },
    Reset,
    /// Caching only: trim the cache to this many bytes.
    Trim(usize),
}

fn ops(max_size: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0..max_size, 0u32..13).prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
            2 => Just(Op::Reset),
            1 => (0usize..100_000).prop_map(Op::Trim),
        ],
        1..80,
    )
}

struct Live {
    ptr: NonNull<u8>,
    size: usize,
    tag: u8,
}

impl Live {
    fn check(&self) {
        // SAFETY: the block is live (no reset since it was handed out) and valid for
        // `size` bytes by the allocator contract.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) };
        assert!(bytes.iter().all(|&b| b == self.tag), "block overwritten");
    }
}

/// The allocator under test and what the model knows about it.
enum Subject {
    Arena {
        arena: ArenaAllocator,
        base: usize,
        capacity: usize,
        cursor: usize,
    },
    Malloc(MallocAllocator),
    Caching {
        cache: CachingAllocator,
        budget: usize,
    },
}

impl Subject {
    fn allocator(&mut self) -> &mut dyn MemoryAllocator {
        match self {
            Subject::Arena { arena, .. } => arena,
            Subject::Malloc(m) => m,
            Subject::Caching { cache, .. } => cache,
        }
    }
}

fn run(mut subject: Subject, ops: Vec<Op>) {
    let mut live: Vec<Live> = Vec::new();
    let mut allocations = 0u64;
    let mut resets = 0u64;
    let mut bytes_live = 0usize;
    let mut peak = 0usize;
    let mut tag = 0u8;
    for op in ops {
        match op {
            Op::Alloc { size, align_log2 } => {
                let align = 1usize << align_log2;
                let live_before = subject.allocator().stats().bytes_live;
                let result = subject.allocator().allocate(size, align);
                let charged = match &mut subject {
                    Subject::Arena {
                        base,
                        capacity,
                        cursor,
                        ..
                    } => {
                        let start = (*base + *cursor).next_multiple_of(align) - *base;
                        let end = start + size.max(1);
                        if end > *capacity {
                            assert_eq!(
                                result,
                                Err(AllocError::Exhausted {
                                    requested: size,
                                    remaining: *capacity - *cursor
                                })
                            );
                            continue;
                        }
                        assert_eq!(result.as_ref().unwrap().as_ptr() as usize, *base + start);
                        let charged = end - *cursor;
                        *cursor = end;
                        charged
                    }
                    Subject::Malloc(_) => size.max(1),
                    Subject::Caching { cache, .. } => {
                        // Its own class, or a cached block of one of the next classes
                        // (at most twice as large).
                        let class = size_class(size).unwrap();
                        let charged = cache.stats().bytes_live - live_before;
                        assert!(
                            (class..=2 * class).contains(&charged),
                            "{size} bytes charged {charged}"
                        );
                        charged
                    }
                };
                let ptr = result.unwrap();
                assert_eq!(ptr.as_ptr() as usize % align, 0);
                tag = tag.wrapping_add(1);
                // SAFETY: a fresh live block of `size` bytes.
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), tag, size) };
                live.push(Live { ptr, size, tag });
                allocations += 1;
                bytes_live += charged;
                peak = peak.max(bytes_live);
                let mut ranges: Vec<_> = live
                    .iter()
                    .map(|l| (l.ptr.as_ptr() as usize, l.size.max(1)))
                    .collect();
                ranges.sort_unstable();
                for w in ranges.windows(2) {
                    assert!(w[0].0 + w[0].1 <= w[1].0, "live blocks overlap");
                }
            }
            Op::Reset => {
                live.iter().for_each(Live::check);
                live.clear();
                subject.allocator().reset();
                resets += 1;
                bytes_live = 0;
                if let Subject::Arena { cursor, .. } = &mut subject {
                    *cursor = 0;
                }
            }
            Op::Trim(target) => {
                if let Subject::Caching { cache, .. } = &subject {
                    let before = cache.stats().bytes_cached;
                    let freed = cache.trim(target);
                    let after = cache.stats().bytes_cached;
                    assert!(after <= target);
                    assert_eq!(before - after, freed);
                    live.iter().for_each(Live::check);
                }
            }
        }
        let s = subject.allocator().stats();
        assert_eq!(s.allocations, allocations);
        assert_eq!(s.resets, resets);
        assert_eq!(s.bytes_live, bytes_live);
        assert_eq!(s.peak_bytes_live, peak);
        match &subject {
            Subject::Arena { .. } => {
                assert_eq!((s.hits, s.misses, s.system_allocations), (0, 0, 0));
            }
            Subject::Malloc(m) => {
                assert_eq!(s.system_allocations, allocations);
                assert_eq!(s.misses, allocations);
                assert_eq!(m.live_blocks(), live.len());
                assert_eq!(s.system_allocations - s.system_frees, live.len() as u64);
            }
            Subject::Caching { cache, budget } => {
                assert!(s.bytes_cached <= *budget, "cache over budget: {s:?}");
                assert_eq!(s.hits + s.misses, s.allocations);
                assert_eq!(s.misses, s.system_allocations);
                assert_eq!(cache.live_blocks(), live.len());
                assert_eq!(
                    s.system_allocations - s.system_frees,
                    (cache.live_blocks() + cache.cached_blocks()) as u64
                );
            }
        }
    }
    live.iter().for_each(Live::check);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    #[cfg_attr(miri, ignore)]
    fn arena_matches_model(capacity in 0usize..200_000, ops in ops(30_000)) {
        let buffer = AlignedBuffer::zeroed(capacity, 64).unwrap();
        let base = buffer.as_slice().as_ptr() as usize;
        let arena = ArenaAllocator::from_buffer(buffer);
        run(Subject::Arena { arena, base, capacity, cursor: 0 }, ops);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn malloc_matches_model(ops in ops(30_000)) {
        run(Subject::Malloc(MallocAllocator::new()), ops);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn caching_matches_model(budget in 0usize..300_000, ops in ops(30_000)) {
        run(Subject::Caching { cache: CachingAllocator::new(budget), budget }, ops);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn caching_matches_model_with_few_sizes(
        budget in 0usize..50_000,
        ops in ops(3_000),
    ) {
        // Small sizes: many hits, frequent trimming.
        run(Subject::Caching { cache: CachingAllocator::new(budget), budget }, ops);
    }
}
