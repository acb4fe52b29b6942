//! Planned memory: the buffers a method's `non_const_buffer_sizes` asks for, indexed by
//! memory id, and bounds-checked tensor placement inside them.

use std::sync::Arc;

use crate::{AllocError, MemoryAllocator, RegionId, Span, Storage};

/// Alignment of every planned buffer (a cache line, enough for every dtype and SIMD).
pub const PLANNED_ALIGNMENT: usize = 64;

/// Why planned memory could not be built, or a tensor could not be placed in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("memory id 0 is reserved (non_const_buffer_sizes[0] is a placeholder)")]
    ReservedMemoryId,
    #[error("memory id {memory_id} does not exist: the plan has buffers 1..={buffers}")]
    UnknownMemoryId { memory_id: usize, buffers: usize },
    #[error("offset {offset} + {nbytes} bytes overflows in memory id {memory_id}")]
    Overflow {
        memory_id: usize,
        offset: u64,
        nbytes: usize,
    },
    #[error(
        "bytes {offset}..{offset}+{nbytes} are past the end of memory id {memory_id} ({buffer_len} bytes)"
    )]
    OutOfBounds {
        memory_id: usize,
        offset: u64,
        nbytes: usize,
        buffer_len: usize,
    },
    #[error("planned buffer {memory_id} of {size} bytes does not fit in memory")]
    TooLarge { memory_id: usize, size: u64 },
    #[error("allocating planned buffer {memory_id} ({size} bytes) failed: {source}")]
    Alloc {
        memory_id: usize,
        size: usize,
        #[source]
        source: AllocError,
    },
}

/// A method's planned buffers: memory id `i` (1-based, as in the file) is a zero-filled
/// region of `sizes[i]` bytes in a [`Storage`], allocated from a chosen allocator.
///
/// Tensors are placed with [`PlannedMemory::span`], which checks everything the C++
/// runtime checks (id 0 reserved, id in range, `offset + nbytes` without overflow and
/// inside the buffer) and names the offending values. Overlapping spans are legal:
/// memory planning reuses bytes by lifetime; the [`Storage`]'s borrow tracker catches
/// overlapping *borrows* within one kernel call.
///
/// ```
/// use std::sync::Arc;
/// use etch_memory::{MemoryAllocator, PlanError, PlannedMemory, Storage};
/// use etch_memory::allocator::ArenaAllocator;
///
/// let arena: Arc<dyn MemoryAllocator> = Arc::new(ArenaAllocator::with_capacity(1 << 20).unwrap());
/// let mut storage = Storage::new();
/// // non_const_buffer_sizes as in the file: entry 0 is a placeholder.
/// let plan = PlannedMemory::allocate(&mut storage, &[0, 4096, 128], &arena).unwrap();
/// assert_eq!(plan.buffer_count(), 2);
///
/// let span = plan.span(1, 1024, 64).unwrap();
/// storage.bytes_mut(span).unwrap()[0] = 7;
/// assert_eq!(plan.span(0, 0, 4), Err(PlanError::ReservedMemoryId));
/// assert!(matches!(plan.span(2, 100, 29), Err(PlanError::OutOfBounds { buffer_len: 128, .. })));
/// assert!(matches!(plan.span(3, 0, 1), Err(PlanError::UnknownMemoryId { buffers: 2, .. })));
/// ```
#[derive(Debug, Clone, Default)]
pub struct PlannedMemory {
    /// Entry `i` is memory id `i + 1`: its region and length.
    buffers: Vec<(RegionId, usize)>,
}

impl PlannedMemory {
    /// Allocates one zero-filled, [`PLANNED_ALIGNMENT`]-aligned region per entry of
    /// `sizes` after the first (the placeholder for the reserved id 0, ignored) from
    /// `allocator`, adding them to `storage` (which keeps the allocator alive). An empty
    /// `sizes` means no planned buffers.
    ///
    /// The returned spans refer to regions of this `storage`.
    pub fn allocate(
        storage: &mut Storage,
        sizes: &[u64],
        allocator: &Arc<dyn MemoryAllocator>,
    ) -> Result<Self, PlanError> {
        let mut buffers = Vec::with_capacity(sizes.len().saturating_sub(1));
        for (memory_id, &size) in sizes.iter().enumerate().skip(1) {
            let len = usize::try_from(size).map_err(|_| PlanError::TooLarge { memory_id, size })?;
            let region = storage
                .add_allocated(allocator, len, PLANNED_ALIGNMENT)
                .map_err(|source| PlanError::Alloc {
                    memory_id,
                    size: len,
                    source,
                })?;
            buffers.push((region, len));
        }
        Ok(Self { buffers })
    }

    /// Number of planned buffers (memory ids `1..=buffer_count()`).
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    fn buffer(&self, memory_id: usize) -> Result<(RegionId, usize), PlanError> {
        if memory_id == 0 {
            return Err(PlanError::ReservedMemoryId);
        }
        self.buffers
            .get(memory_id - 1)
            .copied()
            .ok_or(PlanError::UnknownMemoryId {
                memory_id,
                buffers: self.buffers.len(),
            })
    }

    /// A span over each whole planned buffer, in memory-id order.
    pub fn whole_buffers(&self) -> Vec<Span> {
        self.buffers
            .iter()
            .map(|&(region, len)| Span {
                region,
                offset: 0,
                len,
            })
            .collect()
    }

    /// The storage region of memory id `memory_id`.
    pub fn region(&self, memory_id: usize) -> Result<RegionId, PlanError> {
        Ok(self.buffer(memory_id)?.0)
    }

    /// Length in bytes of memory id `memory_id`.
    pub fn buffer_len(&self, memory_id: usize) -> Result<usize, PlanError> {
        Ok(self.buffer(memory_id)?.1)
    }

    /// The span of `nbytes` bytes at `offset` in memory id `memory_id` (a tensor's
    /// `allocation_info`), checked to lie inside the buffer.
    pub fn span(&self, memory_id: usize, offset: u64, nbytes: usize) -> Result<Span, PlanError> {
        let (region, buffer_len) = self.buffer(memory_id)?;
        let overflow = PlanError::Overflow {
            memory_id,
            offset,
            nbytes,
        };
        let start = usize::try_from(offset).map_err(|_| overflow.clone())?;
        let end = start.checked_add(nbytes).ok_or(overflow)?;
        if end > buffer_len {
            return Err(PlanError::OutOfBounds {
                memory_id,
                offset,
                nbytes,
                buffer_len,
            });
        }
        Ok(Span {
            region,
            offset: start,
            len: nbytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{ArenaAllocator, CachingAllocator, MallocAllocator};

    fn allocators() -> Vec<Arc<dyn MemoryAllocator>> {
        vec![
            Arc::new(ArenaAllocator::with_capacity(1 << 16).unwrap()),
            Arc::new(MallocAllocator::new()),
            Arc::new(CachingAllocator::new(1 << 16)),
        ]
    }

    #[test]
    fn buffers_are_zeroed_aligned_and_separate() {
        for a in allocators() {
            let mut storage = Storage::new();
            let plan = PlannedMemory::allocate(&mut storage, &[999, 100, 0, 300], &a).unwrap();
            assert_eq!(plan.buffer_count(), 3);
            assert_eq!(storage.len(), 3);
            assert_eq!(plan.buffer_len(1), Ok(100));
            assert_eq!(plan.buffer_len(2), Ok(0));
            assert_eq!(plan.buffer_len(3), Ok(300));
            for id in [1, 3] {
                let whole = plan.span(id, 0, plan.buffer_len(id).unwrap()).unwrap();
                let bytes = storage.bytes_mut(whole).unwrap();
                assert!(bytes.iter().all(|&b| b == 0), "{}", a.name());
                assert_eq!(bytes.as_ptr() as usize % PLANNED_ALIGNMENT, 0);
                bytes.fill(id as u8);
            }
            let one = storage
                .bytes(plan.span(1, 0, 100).unwrap())
                .unwrap()
                .to_vec();
            assert!(one.iter().all(|&b| b == 1));
            let three = storage.bytes(plan.span(3, 0, 300).unwrap()).unwrap();
            assert!(three.iter().all(|&b| b == 3));
            assert_eq!(plan.span(2, 0, 0).unwrap().len, 0);
        }
    }

    #[test]
    fn span_errors_name_the_values() {
        let a = allocators().remove(1);
        let mut storage = Storage::new();
        let plan = PlannedMemory::allocate(&mut storage, &[0, 64], &a).unwrap();
        assert_eq!(plan.span(0, 0, 0), Err(PlanError::ReservedMemoryId));
        assert_eq!(
            plan.span(2, 0, 1),
            Err(PlanError::UnknownMemoryId {
                memory_id: 2,
                buffers: 1
            })
        );
        assert_eq!(
            plan.span(1, u64::MAX, 2),
            Err(PlanError::Overflow {
                memory_id: 1,
                offset: u64::MAX,
                nbytes: 2
            })
        );
        assert_eq!(
            plan.span(1, 1, usize::MAX),
            Err(PlanError::Overflow {
                memory_id: 1,
                offset: 1,
                nbytes: usize::MAX
            })
        );
        let e = plan.span(1, 60, 5).unwrap_err();
        assert_eq!(
            e,
            PlanError::OutOfBounds {
                memory_id: 1,
                offset: 60,
                nbytes: 5,
                buffer_len: 64
            }
        );
        assert_eq!(
            e.to_string(),
            "bytes 60..60+5 are past the end of memory id 1 (64 bytes)"
        );
        assert!(plan.span(1, 60, 4).is_ok());
        assert!(plan.span(1, 64, 0).is_ok());
        assert!(plan.span(1, 65, 0).is_err());
    }

    #[test]
    fn empty_and_placeholder_only_plans_have_no_buffers() {
        let a = allocators().remove(0);
        let mut storage = Storage::new();
        assert_eq!(
            PlannedMemory::allocate(&mut storage, &[], &a)
                .unwrap()
                .buffer_count(),
            0
        );
        let plan = PlannedMemory::allocate(&mut storage, &[0], &a).unwrap();
        assert_eq!(plan.buffer_count(), 0);
        assert!(matches!(
            plan.span(1, 0, 0),
            Err(PlanError::UnknownMemoryId { buffers: 0, .. })
        ));
    }

    #[test]
    fn allocation_failure_names_the_buffer() {
        let a: Arc<dyn MemoryAllocator> = Arc::new(ArenaAllocator::with_capacity(256).unwrap());
        let mut storage = Storage::new();
        let e = PlannedMemory::allocate(&mut storage, &[0, 200, 100], &a).unwrap_err();
        assert_eq!(
            e,
            PlanError::Alloc {
                memory_id: 2,
                size: 100,
                source: AllocError::Exhausted {
                    requested: 100,
                    remaining: 56
                }
            }
        );
    }
}
