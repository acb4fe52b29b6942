//! Bump allocation over one fixed buffer.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{AllocatorStats, MemoryAllocator};
use crate::align::{align_up, check_alignment};
use crate::{AlignedBuffer, AllocError};

/// Alignment of the buffer [`ArenaAllocator::with_capacity`] creates.
const ARENA_BUFFER_ALIGNMENT: usize = 64;

/// What keeps the arena's bytes alive; held only for its drop.
#[allow(dead_code)]
enum Backing {
    Owned(AlignedBuffer),
    Static,
}

/// A bump allocator over one fixed buffer: the cheapest allocator there is, and the
/// only one that never calls the system allocator after construction.
///
/// `allocate` advances an atomic cursor (a compare-and-swap loop), so it takes `&self`
/// and may be called from several threads at once. `reset` rewinds the cursor; the
/// bytes are not cleared (recycled memory is dirty). When the buffer is full,
/// `allocate` fails with [`AllocError::Exhausted`], naming the requested and the
/// remaining bytes; nothing is allocated elsewhere.
///
/// Alignment is computed on addresses, so any alignment is honoured whatever the
/// buffer's own alignment (padding counts against the capacity). A zero-byte request
/// takes one byte, so that every block is unique.
///
/// Stats: `allocations`, `bytes_live` (the used prefix of the buffer, padding
/// included), `peak_bytes_live`, `resets`. The arena never asks the system, so the
/// other counters stay 0.
///
/// ```
/// use etch_memory::{AllocError, MemoryAllocator};
/// use etch_memory::allocator::ArenaAllocator;
///
/// let mut arena = ArenaAllocator::with_capacity(256).unwrap();
/// let a = arena.allocate(100, 64).unwrap();
/// let b = arena.allocate(100, 64).unwrap();
/// assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 128);
/// assert_eq!(
///     arena.allocate(100, 64),
///     Err(AllocError::Exhausted { requested: 100, remaining: 28 })
/// );
/// arena.reset();
/// assert_eq!(arena.allocate(100, 64).unwrap(), a);
/// assert_eq!(arena.stats().peak_bytes_live, 228);
/// ```
pub struct ArenaAllocator {
    base: NonNull<u8>,
    capacity: usize,
    /// Offset from `base` of the first free byte.
    cursor: AtomicUsize,
    allocations: AtomicU64,
    /// Highest cursor of the epochs before the current one (the cursor only grows
    /// between resets, so the current epoch's high-water mark is the cursor itself).
    peak_before_reset: usize,
    resets: u64,
    _backing: Backing,
}

// SAFETY: the arena exclusively owns (or has an exclusive `'static` borrow of) its
// buffer; the only shared mutable state is atomics, and disjoint byte ranges are handed
// out, so moving or sharing the arena across threads cannot create a data race.
unsafe impl Send for ArenaAllocator {}
// SAFETY: see Send; `allocate(&self)` only touches atomics.
unsafe impl Sync for ArenaAllocator {}

impl ArenaAllocator {
    /// An arena over a new zero-filled, 64-byte-aligned buffer of `bytes` bytes.
    ///
    /// ```
    /// use etch_memory::allocator::ArenaAllocator;
    /// let arena = ArenaAllocator::with_capacity(4096).unwrap();
    /// assert_eq!((arena.capacity(), arena.used(), arena.remaining()), (4096, 0, 4096));
    /// ```
    pub fn with_capacity(bytes: usize) -> Result<Self, AllocError> {
        Ok(Self::from_buffer(AlignedBuffer::zeroed(
            bytes,
            ARENA_BUFFER_ALIGNMENT,
        )?))
    }

    /// An arena over an owned buffer (dropped with the arena).
    ///
    /// ```
    /// use etch_memory::{AlignedBuffer, MemoryAllocator};
    /// use etch_memory::allocator::ArenaAllocator;
    /// let arena = ArenaAllocator::from_buffer(AlignedBuffer::zeroed(1024, 4096).unwrap());
    /// let p = arena.allocate(10, 4096).unwrap();
    /// assert_eq!(p.as_ptr() as usize % 4096, 0);
    /// ```
    pub fn from_buffer(buffer: AlignedBuffer) -> Self {
        let base = buffer.as_non_null();
        let capacity = buffer.len();
        Self::from_parts(base, capacity, Backing::Owned(buffer))
    }

    /// An arena over a caller-provided buffer borrowed for the rest of the program
    /// (a `static mut` array on an embedded target, or leaked memory).
    ///
    /// ```
    /// use etch_memory::MemoryAllocator;
    /// use etch_memory::allocator::ArenaAllocator;
    /// let bytes: &'static mut [u8] = Box::leak(vec![0u8; 512].into_boxed_slice());
    /// # let raw: *mut [u8] = bytes;
    /// # // SAFETY: `raw` came from the leaked box just above and is used by nothing else.
    /// # let bytes: &'static mut [u8] = unsafe { &mut *raw };
    /// let arena = ArenaAllocator::over(bytes);
    /// assert_eq!(arena.capacity(), 512);
    /// assert!(arena.allocate(512, 1).is_ok());
    /// # drop(arena);
    /// # // SAFETY: the arena that borrowed the bytes is gone; give them back so that
    /// # // leak checkers (Miri) stay quiet.
    /// # unsafe { drop(Box::from_raw(raw)) };
    /// ```
    pub fn over(buffer: &'static mut [u8]) -> Self {
        let capacity = buffer.len();
        let base = NonNull::new(buffer.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Self::from_parts(base, capacity, Backing::Static)
    }

    fn from_parts(base: NonNull<u8>, capacity: usize, backing: Backing) -> Self {
        Self {
            base,
            capacity,
            cursor: AtomicUsize::new(0),
            allocations: AtomicU64::new(0),
            peak_before_reset: 0,
            resets: 0,
            _backing: backing,
        }
    }

    /// Size of the buffer in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes used since the last reset, alignment padding included.
    pub fn used(&self) -> usize {
        self.cursor.load(Ordering::Relaxed)
    }

    /// Bytes still free (before any alignment padding the next request needs).
    pub fn remaining(&self) -> usize {
        self.capacity - self.used()
    }
}

// SAFETY: every returned block is `[start, start + size)` with `start` aligned (on the
// address) and `start + size <= capacity`, so it lies inside the buffer, which lives as
// long as the arena. The compare-and-swap moves the cursor from `cur` to `start + size`
// with `cur <= start`, so ranges handed out since the last reset are disjoint, even
// under concurrent calls. `reset(&mut self)` is the only way to move the cursor back.
unsafe impl MemoryAllocator for ArenaAllocator {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        check_alignment(align)?;
        let needed = size.max(1);
        let base_addr = self.base.as_ptr().addr();
        // Relaxed is enough: the cursor only partitions the buffer; no data is published
        // through it, and a reset (which rewinds it) needs `&mut self`.
        let mut cur = self.cursor.load(Ordering::Relaxed);
        let start = loop {
            // cur <= capacity, and base + capacity is the end of a live allocation, so
            // base_addr + cur cannot overflow.
            let addr = base_addr + cur;
            let exhausted = AllocError::Exhausted {
                requested: size,
                remaining: self.capacity - cur,
            };
            let start = align_up(addr, align).ok_or(exhausted.clone())? - base_addr;
            let end = match start.checked_add(needed) {
                Some(end) if end <= self.capacity => end,
                _ => return Err(exhausted),
            };
            match self
                .cursor
                .compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break start,
                Err(actual) => cur = actual,
            }
        };
        self.allocations.fetch_add(1, Ordering::Relaxed);
        // SAFETY: start + needed <= capacity, so the offset stays inside the buffer
        // `base` points to.
        Ok(unsafe { self.base.add(start) })
    }

    fn reset(&mut self) {
        let cursor = self.cursor.get_mut();
        self.peak_before_reset = self.peak_before_reset.max(*cursor);
        *cursor = 0;
        self.resets += 1;
    }

    fn stats(&self) -> AllocatorStats {
        AllocatorStats {
            allocations: self.allocations.load(Ordering::Relaxed),
            bytes_live: self.used(),
            peak_bytes_live: self.peak_before_reset.max(self.used()),
            resets: self.resets,
            ..AllocatorStats::default()
        }
    }

    fn name(&self) -> &'static str {
        "arena"
    }

    /// The arena's buffer is a zeroed [`AlignedBuffer`] or a caller's initialised
    /// slice, and blocks are carved out of it.
    fn initialised_blocks(&self) -> bool {
        true
    }
}

impl std::fmt::Debug for ArenaAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaAllocator")
            .field("capacity", &self.capacity)
            .field("used", &self.used())
            .finish()
    }
}
