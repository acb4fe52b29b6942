//! Counting heap allocations, to prove that hot paths make none.
//!
//! [`CountingAllocator`] is a [`GlobalAlloc`] over [`System`] that counts every
//! allocation, in two ways:
//!
//! * globally, for all threads ([`CountingAllocator::global_counts`]);
//! * per thread, only while the thread is inside [`count_allocations`]: a thread-local
//!   flag turns counting on for the calling thread alone, so allocations made meanwhile
//!   by other threads (the test harness, other tests running in parallel) do not
//!   pollute the figure. Allocations made by threads the closure spawns are **not**
//!   counted by it (they are in the global counts).
//!
//! Counting only works in a binary that installs the wrapper with `#[global_allocator]`
//! (a test binary, a benchmark); elsewhere every count is 0 and
//! [`CountingAllocator::is_installed`] says false.
//!
//! ```rust,standalone_crate
//! use etch_memory::counting::{CountingAllocator, count_allocations};
//!
//! #[global_allocator]
//! static ALLOC: CountingAllocator = CountingAllocator;
//!
//! fn main() {
//!     let (v, counts) = count_allocations(|| vec![1u8; 100]);
//!     assert!(CountingAllocator::is_installed());
//!     assert_eq!(counts.allocations, 1);
//!     assert_eq!(counts.bytes_allocated, 100);
//!     let ((), counts) = count_allocations(|| drop(v));
//!     assert_eq!(counts.deallocations, 1);
//!     let ((), counts) = count_allocations(|| {
//!         let x = [0u8; 100];
//!         std::hint::black_box(&x);
//!     });
//!     assert_eq!(counts.allocations, 0);
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Heap traffic over some period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocationCounts {
    /// Calls that obtained memory: `alloc`, `alloc_zeroed` and `realloc`.
    pub allocations: u64,
    /// Calls to `dealloc`.
    pub deallocations: u64,
    /// The `realloc` calls among `allocations`.
    pub reallocations: u64,
    /// Bytes requested by `allocations` (the new size, for a `realloc`).
    pub bytes_allocated: u64,
    /// Bytes given back by `deallocations`.
    pub bytes_deallocated: u64,
}

impl AllocationCounts {
    /// `self - earlier`, field by field (saturating).
    pub fn since(&self, earlier: &AllocationCounts) -> AllocationCounts {
        AllocationCounts {
            allocations: self.allocations.saturating_sub(earlier.allocations),
            deallocations: self.deallocations.saturating_sub(earlier.deallocations),
            reallocations: self.reallocations.saturating_sub(earlier.reallocations),
            bytes_allocated: self.bytes_allocated.saturating_sub(earlier.bytes_allocated),
            bytes_deallocated: self
                .bytes_deallocated
                .saturating_sub(earlier.bytes_deallocated),
        }
    }
}

/// A [`GlobalAlloc`] that forwards to [`System`] and counts (see the module docs).
///
/// Install it with `#[global_allocator] static A: CountingAllocator = CountingAllocator;`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator;

static INSTALLED: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static DEALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static REALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES_ALLOCATED: AtomicU64 = AtomicU64::new(0);
static BYTES_DEALLOCATED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // Const-initialised and without destructors, so reading them never allocates
    // (which would recurse into the allocator) and works during thread teardown.
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LOCAL: Cell<AllocationCounts> = const {
        Cell::new(AllocationCounts {
            allocations: 0,
            deallocations: 0,
            reallocations: 0,
            bytes_allocated: 0,
            bytes_deallocated: 0,
        })
    };
}

impl CountingAllocator {
    /// True once any allocation has gone through a `CountingAllocator`, i.e. when it is
    /// the global allocator of this binary.
    pub fn is_installed() -> bool {
        INSTALLED.load(Ordering::Relaxed)
    }

    /// Counts over all threads since the program started.
    pub fn global_counts() -> AllocationCounts {
        AllocationCounts {
            allocations: ALLOCATIONS.load(Ordering::Relaxed),
            deallocations: DEALLOCATIONS.load(Ordering::Relaxed),
            reallocations: REALLOCATIONS.load(Ordering::Relaxed),
            bytes_allocated: BYTES_ALLOCATED.load(Ordering::Relaxed),
            bytes_deallocated: BYTES_DEALLOCATED.load(Ordering::Relaxed),
        }
    }

    fn record(allocated: Option<usize>, deallocated: Option<usize>, realloc: bool) {
        INSTALLED.store(true, Ordering::Relaxed);
        if let Some(bytes) = allocated {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            BYTES_ALLOCATED.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        if let Some(bytes) = deallocated {
            DEALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            BYTES_DEALLOCATED.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        if realloc {
            REALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // try_with: the thread may be tearing down its locals (these have no
        // destructor, so this does not fail in practice; never panic in an allocator).
        if TRACKING.try_with(Cell::get).unwrap_or(false) {
            let _ = LOCAL.try_with(|local| {
                let mut c = local.get();
                if let Some(bytes) = allocated {
                    c.allocations += 1;
                    c.bytes_allocated += bytes as u64;
                }
                if let Some(bytes) = deallocated {
                    c.deallocations += 1;
                    c.bytes_deallocated += bytes as u64;
                }
                if realloc {
                    c.reallocations += 1;
                }
                local.set(c);
            });
        }
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees carry over; the bookkeeping only touches atomics and
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::record(Some(layout.size()), None, false);
        // SAFETY: forwarded with the caller's (valid, non-zero-size) layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::record(Some(layout.size()), None, false);
        // SAFETY: forwarded with the caller's (valid, non-zero-size) layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::record(None, Some(layout.size()), false);
        // SAFETY: the caller guarantees ptr was allocated by this allocator (so by
        // System) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::record(Some(new_size), Some(layout.size()), true);
        // SAFETY: forwarded unchanged; the caller upholds realloc's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns its result with the heap traffic **the calling thread** made
/// meanwhile (see the module docs). Nested calls work; each sees its own traffic.
///
/// Without [`CountingAllocator`] as the global allocator, the counts are all 0.
///
/// ```
/// use etch_memory::counting::count_allocations;
/// let (sum, counts) = count_allocations(|| (1..=10).sum::<u32>());
/// assert_eq!(sum, 55);
/// assert_eq!(counts.allocations, 0);
/// ```
pub fn count_allocations<R>(f: impl FnOnce() -> R) -> (R, AllocationCounts) {
    let before = LOCAL.with(Cell::get);
    let was_tracking = TRACKING.with(|t| t.replace(true));
    // Restore the flag even if `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = TRACKING.try_with(|t| t.set(self.0));
        }
    }
    let restore = Restore(was_tracking);
    let result = f();
    drop(restore);
    let after = LOCAL.with(Cell::get);
    (result, after.since(&before))
}
