//! The allocator family: one trait, several strategies.
//!
//! * [`MemoryAllocator`]: the trait every allocator implements.
//! * `ArenaAllocator`, `MallocAllocator`, `CachingAllocator`: the strategies.

use std::ptr::NonNull;

use crate::AllocError;

/// Counters every allocator reports. Fields an allocator does not track stay 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Successful `allocate` calls since creation.
    pub allocations: u64,
    /// Allocations served from a cache without asking the system.
    pub hits: u64,
    /// Allocations that had to ask the system (or the arena) for new memory.
    pub misses: u64,
    /// Calls to the system allocator (malloc-like) since creation.
    pub system_allocations: u64,
    /// Bytes currently handed out (live until the next reset).
    pub bytes_live: usize,
    /// Highest `bytes_live` ever seen.
    pub peak_bytes_live: usize,
    /// Bytes held in a cache, free for reuse.
    pub bytes_cached: usize,
    /// Number of resets.
    pub resets: u64,
}

/// An allocator that hands out aligned blocks until it is reset.
///
/// Blocks are not freed one by one: they all become invalid at [`MemoryAllocator::reset`]
/// (or when the allocator is dropped). `reset` takes `&mut self`, so the borrow checker
/// proves no shared handle is in use when memory is recycled.
///
/// # Safety
///
/// Implementors promise that every `Ok(ptr)` returned by `allocate(size, align)`:
/// is aligned to `align`; is valid for reads and writes of `size` bytes until the next
/// `reset` or the allocator's drop; and does not overlap any other block handed out
/// since the last reset. `allocate` may be called concurrently from several threads.
pub unsafe trait MemoryAllocator: Send + Sync {
    /// A block of `size` bytes aligned to `align` (a power of two). The contents are
    /// unspecified (recycled memory is dirty). A zero `size` still returns a unique,
    /// aligned, non-null pointer.
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError>;

    /// Invalidates every block handed out so far.
    fn reset(&mut self);

    /// Current counters.
    fn stats(&self) -> AllocatorStats;

    /// A short name for messages and stats ("arena", "malloc", "caching").
    fn name(&self) -> &'static str;
}
