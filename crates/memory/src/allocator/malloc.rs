//! One system allocation per block.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use super::{AllocatorStats, MemoryAllocator};
use crate::AllocError;
use crate::align::check_alignment;

/// A live block: the pointer the system allocator returned and its exact layout.
#[derive(Clone, Copy)]
struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a Block is the sole owner of a heap allocation; nothing about it is tied to
// the thread that allocated it (the system allocator is thread-safe).
unsafe impl Send for Block {}

#[derive(Default)]
struct Inner {
    blocks: Vec<Block>,
    stats: AllocatorStats,
}

/// Every block is its own system allocation (`std::alloc::alloc` with the exact
/// `Layout::from_size_align(size, align)`, never over-allocated and shifted); every
/// block is freed at `reset` and on drop.
///
/// This is the simplest correct temp allocator and the baseline the others are
/// measured against: one system allocation and one free per block.
///
/// Stats: `allocations`, `misses` and `system_allocations` (all equal: every block asks
/// the system), `system_frees`, `bytes_live` (sum of block sizes; a zero-byte request
/// takes one byte), `peak_bytes_live`, `resets`.
///
/// ```
/// use etch_memory::MemoryAllocator;
/// use etch_memory::allocator::MallocAllocator;
///
/// let mut m = MallocAllocator::new();
/// let p = m.allocate(1000, 256).unwrap();
/// assert_eq!(p.as_ptr() as usize % 256, 0);
/// m.allocate(24, 8).unwrap();
/// assert_eq!(m.stats().bytes_live, 1024);
/// m.reset(); // frees both blocks
/// let s = m.stats();
/// assert_eq!((s.system_allocations, s.system_frees, s.bytes_live), (2, 2, 0));
/// ```
#[derive(Default)]
pub struct MallocAllocator {
    inner: Mutex<Inner>,
}

impl MallocAllocator {
    /// An allocator with no live blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of blocks allocated since the last reset.
    pub fn live_blocks(&self) -> usize {
        self.lock().blocks.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The critical sections never leave the state inconsistent, so a poisoned lock
        // (a panic elsewhere while holding it) is still safe to use.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn free_all(inner: &mut Inner) {
        for block in inner.blocks.drain(..) {
            // SAFETY: the block was returned by `alloc` with exactly this layout and is
            // freed once: drain removes it from the list.
            unsafe { std::alloc::dealloc(block.ptr.as_ptr(), block.layout) };
            inner.stats.system_frees += 1;
        }
        inner.stats.bytes_live = 0;
    }
}

// SAFETY: every block is a fresh system allocation of at least `size` bytes with the
// requested alignment (the Layout carries it), so blocks are aligned, valid and
// disjoint; a block is freed only by `reset(&mut self)` or drop.
unsafe impl MemoryAllocator for MallocAllocator {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        check_alignment(align)?;
        let layout = Layout::from_size_align(size.max(1), align)
            .map_err(|_| AllocError::SizeOverflow { size, align })?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr = NonNull::new(raw).ok_or(AllocError::SystemOutOfMemory { size })?;
        crate::pages::advise_huge_pages(raw, layout.size());
        let mut inner = self.lock();
        if inner.blocks.try_reserve(1).is_err() {
            drop(inner);
            // SAFETY: just allocated with this layout and never handed out.
            unsafe { std::alloc::dealloc(raw, layout) };
            return Err(AllocError::SystemOutOfMemory { size });
        }
        inner.blocks.push(Block { ptr, layout });
        let stats = &mut inner.stats;
        stats.allocations += 1;
        stats.misses += 1;
        stats.system_allocations += 1;
        stats.bytes_live += layout.size();
        stats.peak_bytes_live = stats.peak_bytes_live.max(stats.bytes_live);
        Ok(ptr)
    }

    fn reset(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        Self::free_all(inner);
        inner.stats.resets += 1;
    }

    fn stats(&self) -> AllocatorStats {
        self.lock().stats
    }

    fn name(&self) -> &'static str {
        "malloc"
    }
}

impl Drop for MallocAllocator {
    fn drop(&mut self) {
        Self::free_all(self.inner.get_mut().unwrap_or_else(|e| e.into_inner()));
    }
}

impl std::fmt::Debug for MallocAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MallocAllocator")
            .field("stats", &self.stats())
            .finish()
    }
}
