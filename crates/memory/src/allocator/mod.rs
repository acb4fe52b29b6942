//! The allocator family: one trait, several strategies.
//!
//! * [`MemoryAllocator`]: the trait every allocator implements.
//! * [`ArenaAllocator`]: bump allocation over one fixed buffer; no system calls at all.
//! * [`MallocAllocator`]: one system allocation per block, all freed at reset.
//! * [`CachingAllocator`]: system blocks recycled across resets through size classes,
//!   with a bounded, least-recently-used cache.
//!
//! All three take `allocate(&self)` (so kernels running in parallel may share one) and
//! `reset(&mut self)` (so the borrow checker proves no block is still in use).
//!
//! ```
//! use etch_memory::MemoryAllocator;
//! use etch_memory::allocator::{ArenaAllocator, CachingAllocator, MallocAllocator};
//!
//! let mut allocators: Vec<Box<dyn MemoryAllocator>> = vec![
//!     Box::new(ArenaAllocator::with_capacity(1 << 20).unwrap()),
//!     Box::new(MallocAllocator::new()),
//!     Box::new(CachingAllocator::new(1 << 20)),
//! ];
//! for a in &mut allocators {
//!     let p = a.allocate(1000, 64).unwrap();
//!     assert_eq!(p.as_ptr() as usize % 64, 0);
//!     a.reset();
//!     assert_eq!(a.stats().bytes_live, 0);
//! }
//! ```

mod arena;
mod caching;
mod malloc;

use std::ptr::NonNull;

pub use arena::ArenaAllocator;
pub use caching::{CachingAllocator, DEFAULT_CACHING_ALIGNMENT, size_class};
pub use malloc::MallocAllocator;

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
    /// Blocks given back to the system allocator since creation.
    pub system_frees: u64,
    /// Bytes currently handed out (live until the next reset). What counts is the
    /// memory each allocator commits to its live blocks: the arena counts its used
    /// prefix (padding included), malloc the block sizes, the caching allocator the
    /// size-class capacity of each block.
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

    /// True when every block this allocator hands out is initialised memory: zeroed
    /// when it first came from the system, and since then holding only bytes written
    /// through earlier blocks. [`TempScope::scratch_dirty`](crate::TempScope::scratch_dirty)
    /// then hands such a block out as it is, without clearing it. An implementor that
    /// returns `true` promises this (it is part of this unsafe trait's contract).
    fn initialised_blocks(&self) -> bool {
        false
    }
}
