//! etch's memory layer: every byte a method uses comes from here.
//!
//! * [`MemoryAllocator`] and its strategies (arena, malloc, caching);
//! * [`MemoryBudget`]: the byte limit a program's allocations are checked against
//!   before they are made;
//! * [`Storage`], [`Span`] and [`Access`]: the regions tensors live in and checked
//!   borrows of their bytes;
//! * [`PlannedMemory`]: a method's planned buffers, indexed by memory id, with
//!   bounds-checked tensor placement;
//! * [`TempScope`]: per-kernel scratch from the temp allocator;
//! * [`counting`]: a counting global allocator, to prove hot paths allocation-free;
//! * [`AlignedBuffer`] and [`SharedBytes`]: owned and shared byte sources (including
//!   memory-mapped files);
//! * [`WeightBuffer`]: packed weights, on transparent huge pages when large;
//! * [`ColumnBlocks`]: disjoint column blocks of one matrix, written by parallel tasks.
//!
//! All of etch's `unsafe` outside SIMD kernels lives in this crate.

mod align;
pub mod allocator;
mod budget;
mod buffer;
mod column_blocks;
pub mod counting;
mod error;
mod pages;
mod planned;
mod scratch;
mod shared_bytes;
pub mod storage;
mod weight_buffer;

pub use align::{align_up, check_alignment};
pub use allocator::{
    AllocatorStats, ArenaAllocator, CachingAllocator, MallocAllocator, MemoryAllocator,
};
pub use budget::{BudgetExceeded, MemoryBudget, Reservation, format_bytes, parse_byte_size};
pub use buffer::AlignedBuffer;
pub use column_blocks::{ColumnBlock, ColumnBlocks};
pub use error::{AccessError, AllocError};
pub use planned::{PLANNED_ALIGNMENT, PlanError, PlannedMemory};
pub use scratch::{DIRTY_FILL, ScratchStats, TempScope};
pub use shared_bytes::{FILE_ALIGNMENT, MappedFile, SharedBytes};
pub use storage::{Access, RegionId, Span, Storage};
pub use weight_buffer::{SLAB_MIN_BYTES, WeightBuffer};
