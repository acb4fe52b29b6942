//! Behaviour of the three allocators through the public API: alignment, disjoint live
//! blocks, reset semantics, stats, the caching allocator's classes, budget and LRU, and
//! concurrent use.

use std::ptr::NonNull;

use etch_memory::allocator::{ArenaAllocator, CachingAllocator, MallocAllocator, size_class};
use etch_memory::{AlignedBuffer, AllocError, MemoryAllocator};

/// A block handed out, with the byte pattern written into it.
struct Live {
    ptr: NonNull<u8>,
    size: usize,
    tag: u8,
}

// SAFETY: a Live is a record of a block; the tests only touch its bytes while the block
// is live, and moving the record between threads changes nothing about that.
unsafe impl Send for Live {}

impl Live {
    fn fill(ptr: NonNull<u8>, size: usize, tag: u8) -> Self {
        // SAFETY: the allocator contract makes ptr valid and exclusive for size bytes
        // until the next reset.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), tag, size) };
        Live { ptr, size, tag }
    }

    fn check(&self) {
        // SAFETY: as in fill; the block is still live (no reset since).
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) };
        assert!(
            bytes.iter().all(|&b| b == self.tag),
            "block {:p} ({} bytes, tag {}) was overwritten",
            self.ptr,
            self.size,
            self.tag
        );
    }
}

fn assert_disjoint(live: &[Live]) {
    let mut ranges: Vec<(usize, usize)> = live
        .iter()
        .map(|l| {
            (
                l.ptr.as_ptr() as usize,
                l.ptr.as_ptr() as usize + l.size.max(1),
            )
        })
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "blocks overlap: {:x?} and {:x?}",
            w[0],
            w[1]
        );
    }
}

fn all_allocators() -> Vec<Box<dyn MemoryAllocator>> {
    vec![
        Box::new(ArenaAllocator::with_capacity(1 << 20).unwrap()),
        Box::new(MallocAllocator::new()),
        Box::new(CachingAllocator::new(1 << 20)),
    ]
}

// ---------------------------------------------------------------- all allocators

#[test]
fn every_allocator_honours_alignment_and_keeps_blocks_apart() {
    for mut a in all_allocators() {
        for round in 0..3u8 {
            let mut live = Vec::new();
            for (i, shift) in (0..=12).chain([6, 0, 3]).enumerate() {
                let align = 1usize << shift;
                let size = 1 + i * 37;
                let p = a.allocate(size, align).unwrap();
                assert_eq!(p.as_ptr() as usize % align, 0, "{} align {align}", a.name());
                live.push(Live::fill(p, size, round * 32 + i as u8));
            }
            assert_disjoint(&live);
            live.iter().for_each(Live::check);
            a.reset();
            assert_eq!(a.stats().bytes_live, 0, "{}", a.name());
        }
        assert_eq!(a.stats().resets, 3);
        assert_eq!(a.stats().allocations, 3 * 16);
    }
}

#[test]
fn every_allocator_rejects_bad_alignment() {
    for a in all_allocators() {
        for align in [0, 3, 48, usize::MAX] {
            assert_eq!(
                a.allocate(8, align),
                Err(AllocError::InvalidAlignment { align }),
                "{}",
                a.name()
            );
        }
        assert_eq!(a.stats().allocations, 0);
    }
}

#[test]
fn zero_sized_blocks_are_unique_and_aligned() {
    for a in all_allocators() {
        let p = a.allocate(0, 16).unwrap();
        let q = a.allocate(0, 16).unwrap();
        assert_ne!(p, q, "{}", a.name());
        assert_eq!(q.as_ptr() as usize % 16, 0);
    }
}

#[test]
fn huge_requests_fail_cleanly() {
    let arena = ArenaAllocator::with_capacity(64).unwrap();
    assert!(matches!(
        arena.allocate(usize::MAX, 1),
        Err(AllocError::Exhausted {
            requested: usize::MAX,
            remaining: 64
        })
    ));
    let malloc = MallocAllocator::new();
    assert_eq!(
        malloc.allocate(usize::MAX - 8, 64),
        Err(AllocError::SizeOverflow {
            size: usize::MAX - 8,
            align: 64
        })
    );
    let caching = CachingAllocator::new(0);
    assert_eq!(
        caching.allocate(usize::MAX - 8, 8),
        Err(AllocError::SizeOverflow {
            size: usize::MAX - 8,
            align: 64
        })
    );
    assert_eq!(
        caching.allocate(isize::MAX as usize, 8),
        Err(AllocError::SizeOverflow {
            size: isize::MAX as usize,
            align: 64
        })
    );
    for s in [malloc.stats(), caching.stats()] {
        assert_eq!(
            (s.allocations, s.system_allocations, s.bytes_live),
            (0, 0, 0)
        );
    }
}

#[test]
fn names() {
    let names: Vec<_> = all_allocators().iter().map(|a| a.name()).collect();
    assert_eq!(names, ["arena", "malloc", "caching"]);
}

// ---------------------------------------------------------------- arena

#[test]
fn arena_bumps_pads_and_rewinds() {
    let mut arena = ArenaAllocator::with_capacity(1000).unwrap();
    let base = arena.allocate(1, 1).unwrap();
    assert_eq!(
        base.as_ptr() as usize % 64,
        0,
        "with_capacity is 64-aligned"
    );
    let b = arena.allocate(10, 64).unwrap();
    assert_eq!(b.as_ptr() as usize - base.as_ptr() as usize, 64);
    assert_eq!(arena.used(), 74);
    let c = arena.allocate(6, 2).unwrap();
    assert_eq!(c.as_ptr() as usize - base.as_ptr() as usize, 74);
    assert_eq!(arena.used(), 80);
    assert_eq!(
        arena.allocate(921, 1),
        Err(AllocError::Exhausted {
            requested: 921,
            remaining: 920
        })
    );
    // Padding counts: 900 bytes fit at offset 80, not after the pad to offset 128.
    assert!(arena.allocate(900, 128).is_err());
    assert!(arena.allocate(920, 1).is_ok());
    assert_eq!(arena.remaining(), 0);
    assert_eq!(
        arena.allocate(0, 1),
        Err(AllocError::Exhausted {
            requested: 0,
            remaining: 0
        })
    );
    let s = arena.stats();
    assert_eq!(s.allocations, 4);
    assert_eq!(s.bytes_live, 1000);
    assert_eq!(s.peak_bytes_live, 1000);
    arena.reset();
    assert_eq!(arena.used(), 0);
    assert_eq!(arena.allocate(1, 1).unwrap(), base);
    let s = arena.stats();
    assert_eq!(
        (s.allocations, s.bytes_live, s.peak_bytes_live, s.resets),
        (5, 1, 1000, 1)
    );
    assert_eq!(
        (s.hits, s.misses, s.system_allocations, s.bytes_cached),
        (0, 0, 0, 0)
    );
}

#[test]
fn arena_aligns_addresses_not_offsets() {
    // A buffer whose base is 64-aligned: after one byte, alignment 4096 needs a pad that
    // depends on the address, not on the offset.
    let arena = ArenaAllocator::from_buffer(AlignedBuffer::zeroed(16384, 64).unwrap());
    arena.allocate(1, 1).unwrap();
    let p = arena.allocate(8, 4096).unwrap();
    assert_eq!(p.as_ptr() as usize % 4096, 0);
}

#[test]
fn arena_over_a_static_buffer() {
    let raw: *mut [u8] = Box::into_raw(vec![0xAAu8; 300].into_boxed_slice());
    {
        // SAFETY: raw comes from the box just leaked; nothing else uses it until it is
        // reclaimed below, after the arena is gone.
        let bytes: &'static mut [u8] = unsafe { &mut *raw };
        let mut arena = ArenaAllocator::over(bytes);
        assert_eq!(arena.capacity(), 300);
        let p = arena.allocate(300, 1).unwrap();
        // SAFETY: p is valid for 300 bytes.
        assert_eq!(unsafe { *p.as_ptr().add(299) }, 0xAA, "no clearing");
        arena.reset();
        assert_eq!(arena.allocate(300, 1).unwrap(), p);
    }
    // SAFETY: the arena that borrowed the bytes is dropped.
    drop(unsafe { Box::from_raw(raw) });
}

#[test]
fn arena_zero_capacity_refuses_everything() {
    let arena = ArenaAllocator::with_capacity(0).unwrap();
    assert_eq!(
        arena.allocate(1, 1),
        Err(AllocError::Exhausted {
            requested: 1,
            remaining: 0
        })
    );
}

#[test]
fn arena_concurrent_allocations_are_disjoint() {
    let threads = 4;
    let per_thread = if cfg!(miri) { 20 } else { 500 };
    let mut arena = ArenaAllocator::with_capacity(threads * per_thread * 64).unwrap();
    for round in 0..2u8 {
        let blocks: Vec<Vec<Live>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let arena = &arena;
                    s.spawn(move || {
                        (0..per_thread)
                            .map(|i| {
                                let p = arena.allocate(1 + (i % 64), 16).unwrap();
                                Live::fill(p, 1 + (i % 64), (t as u8 + 1) * 10 + round)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let all: Vec<Live> = blocks.into_iter().flatten().collect();
        all.iter().for_each(Live::check);
        assert_disjoint(&all);
        assert_eq!(
            arena.stats().allocations as usize,
            (round as usize + 1) * threads * per_thread
        );
        arena.reset();
    }
}

// ---------------------------------------------------------------- malloc

#[test]
fn malloc_frees_everything_at_reset() {
    let mut m = MallocAllocator::new();
    let p = m.allocate(100, 4096).unwrap();
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    m.allocate(0, 1).unwrap();
    m.allocate(50, 8).unwrap();
    assert_eq!(m.live_blocks(), 3);
    let s = m.stats();
    assert_eq!(s.allocations, 3);
    assert_eq!(s.misses, 3);
    assert_eq!(s.system_allocations, 3);
    assert_eq!(s.bytes_live, 151);
    assert_eq!(s.peak_bytes_live, 151);
    m.reset();
    assert_eq!(m.live_blocks(), 0);
    m.allocate(10, 8).unwrap();
    let s = m.stats();
    assert_eq!((s.system_allocations, s.system_frees), (4, 3));
    assert_eq!((s.bytes_live, s.peak_bytes_live, s.resets), (10, 151, 1));
    assert_eq!((s.hits, s.bytes_cached), (0, 0));
}

// ---------------------------------------------------------------- caching

#[test]
fn caching_reuses_blocks_after_reset() {
    let mut c = CachingAllocator::new(1 << 20);
    let a = c.allocate(1000, 64).unwrap();
    let b = c.allocate(1000, 64).unwrap();
    assert_ne!(a, b);
    c.reset();
    let s = c.stats();
    assert_eq!(
        (s.misses, s.hits, s.bytes_live, s.bytes_cached),
        (2, 0, 0, 2048)
    );
    assert_eq!(c.cached_blocks(), 2);
    // LIFO: the most recently used block comes back first.
    assert_eq!(c.allocate(1000, 64).unwrap(), b);
    assert_eq!(c.allocate(1000, 8).unwrap(), a);
    let s = c.stats();
    assert_eq!(
        (s.misses, s.hits, s.bytes_live, s.bytes_cached),
        (2, 2, 2048, 0)
    );
    assert_eq!(s.system_allocations, 2);
    assert_eq!(s.peak_bytes_live, 2048);
    assert_eq!(c.live_blocks(), 2);
}

#[test]
fn caching_sizes_in_one_class_share_blocks() {
    let mut c = CachingAllocator::new(1 << 30);
    // Attention scratch during decode: kv length grows by one each step.
    let row = 4 * 64; // f32 x head_dim 64
    let mut system = 0;
    for kv in 64..512usize {
        let size = kv * row;
        c.allocate(size, 64).unwrap();
        c.reset();
        let s = c.stats();
        if s.system_allocations > system && system > 0 {
            // A miss only happens when the size crosses into a new class.
            assert!(
                size_class(size) != size_class(size - row),
                "miss at kv {kv}"
            );
        }
        system = s.system_allocations;
    }
    let s = c.stats();
    // 16 KiB .. 128 KiB is 3 doublings: 12 classes, the first included.
    assert_eq!(s.system_allocations, 13);
    assert_eq!(s.hits, 448 - 13);
}

#[test]
fn caching_larger_alignments() {
    let mut c = CachingAllocator::new(1 << 20);
    let p = c.allocate(5000, 4096).unwrap();
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    c.reset();
    // A 4096-aligned block serves a default-aligned request of the same class...
    assert_eq!(c.allocate(5000, 64).unwrap(), p);
    c.reset();
    // ...and a request for 4096 again.
    assert_eq!(c.allocate(4500, 4096).unwrap(), p);
    let q = c.allocate(4500, 8192).unwrap();
    assert_eq!(q.as_ptr() as usize % 8192, 0);
    c.reset();
    for _ in 0..3 {
        let a = c.allocate(5000, 8192).unwrap();
        assert_eq!(a.as_ptr() as usize % 8192, 0);
        c.reset();
    }
    assert_eq!(
        c.stats().misses,
        2,
        "the 8192-aligned block was found and reused"
    );
}

#[test]
fn caching_reset_trims_only_the_excess_least_recently_used_first() {
    let mut c = CachingAllocator::new(3 * 4096);
    let a = c.allocate(4096, 64).unwrap();
    let b = c.allocate(4096, 64).unwrap();
    let d = c.allocate(8192, 64).unwrap();
    c.reset();
    // 16 KiB cached, budget 12 KiB: only `a`, the least recently used, is freed.
    let s = c.stats();
    assert_eq!((s.bytes_cached, s.system_frees), (12288, 1));
    assert_eq!(c.cached_blocks(), 2);
    assert_eq!(c.allocate(8192, 64).unwrap(), d);
    assert_eq!(c.allocate(4096, 64).unwrap(), b);
    let a2 = c.allocate(4096, 64).unwrap();
    assert_eq!(c.stats().misses, 4);
    c.reset();
    // Used in order d, b, a2: 16 KiB cached, so the reset frees d, the oldest.
    let s = c.stats();
    assert_eq!((s.bytes_cached, s.system_frees), (8192, 2));
    // Trimming further frees b, then a2.
    assert_eq!(c.trim(4096), 4096);
    assert_eq!(c.allocate(4096, 64).unwrap(), a2);
    assert_eq!(c.stats().bytes_cached, 0);
    assert_eq!(c.stats().misses, 4);
    let _ = a;
}

#[test]
fn caching_budget_zero_frees_everything_at_reset() {
    let mut c = CachingAllocator::new(0);
    c.allocate(100, 64).unwrap();
    c.allocate(100_000, 64).unwrap();
    c.reset();
    let s = c.stats();
    assert_eq!(
        (s.bytes_cached, s.system_allocations, s.system_frees),
        (0, 2, 2)
    );
    assert_eq!(c.cached_blocks(), 0);
}

#[test]
fn caching_trim_release_all_and_budget_changes_leave_live_blocks_alone() {
    let mut c = CachingAllocator::new(1 << 20);
    c.allocate(1024, 64).unwrap();
    c.allocate(2048, 64).unwrap();
    c.reset();
    let live = Live::fill(c.allocate(1024, 64).unwrap(), 1024, 9);
    assert_eq!(c.stats().bytes_cached, 2048);
    assert_eq!(c.release_all(), 2048);
    assert_eq!(c.release_all(), 0);
    live.check();
    assert_eq!(c.set_max_cached_bytes(0), 0);
    assert_eq!(c.max_cached_bytes(), 0);
    live.check();
    c.reset();
    let s = c.stats();
    assert_eq!((s.bytes_cached, s.bytes_live, s.system_frees), (0, 0, 2));
}

#[test]
fn caching_stats_balance() {
    let mut c = CachingAllocator::new(40_000);
    let mut owned_bytes = 0usize;
    for round in 0..20usize {
        for i in 0..5 {
            c.allocate(1000 + 997 * ((round + i) % 13), 64).unwrap();
        }
        let s = c.stats();
        assert_eq!(s.hits + s.misses, s.allocations);
        assert_eq!(s.misses, s.system_allocations);
        c.reset();
        let s = c.stats();
        assert!(s.bytes_cached <= 40_000);
        assert_eq!(s.bytes_live, 0);
        owned_bytes = s.bytes_cached;
        assert_eq!(
            c.cached_blocks() as u64,
            s.system_allocations - s.system_frees
        );
    }
    assert!(owned_bytes > 0);
}

#[test]
fn caching_concurrent_stress() {
    let threads = 4;
    let per_thread = if cfg!(miri) { 4 } else { 64 };
    let rounds = if cfg!(miri) { 3 } else { 50 };
    let budget = 8 << 20;
    let mut c = CachingAllocator::new(budget);
    for round in 0..rounds {
        let blocks: Vec<Live> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let c = &c;
                    s.spawn(move || {
                        (0..per_thread)
                            .map(|i| {
                                let size = 64 + ((round * 131 + t * 977 + i * 53) % 20_000);
                                let align = if i % 7 == 0 { 512 } else { 64 };
                                let p = c.allocate(size, align).unwrap();
                                assert_eq!(p.as_ptr() as usize % align, 0);
                                Live::fill(p, size, (t * 50 + i % 50) as u8)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        blocks.iter().for_each(Live::check);
        assert_disjoint(&blocks);
        let s = c.stats();
        assert_eq!(c.live_blocks(), threads * per_thread);
        assert_eq!(s.hits + s.misses, s.allocations);
        c.reset();
        assert!(c.stats().bytes_cached <= budget);
    }
    let s = c.stats();
    assert_eq!(s.allocations as usize, rounds * threads * per_thread);
    // Under Miri the run is too short for hits to dominate.
    assert!(cfg!(miri) || s.hits > s.misses, "{s:?}");
}
