//! The region table.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::{AccessError, AlignedBuffer, AllocError, MemoryAllocator, SharedBytes};

/// Index of a region in a [`Storage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionId(pub u32);

/// A byte range inside one region: where a tensor's data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub region: RegionId,
    pub offset: usize,
    /// Bytes available to the tensor (its capacity, at its upper-bound shape).
    pub len: usize,
}

/// What keeps a region's bytes alive; held only for its drop.
#[allow(dead_code)]
enum Owner {
    Shared(SharedBytes),
    Allocator(Arc<dyn MemoryAllocator>),
    Buffer(AlignedBuffer),
}

pub(super) struct Region {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    pub(super) writable: bool,
    _owner: Owner,
}

/// The regions a method's tensors point into. Owns (or keeps alive) every region.
#[derive(Default)]
pub struct Storage {
    pub(super) regions: Vec<Region>,
}

// SAFETY: regions are either immutable shared bytes or memory owned by this Storage
// (directly or through an Arc'd allocator that cannot be reset while we hold it);
// mutation only happens through &mut Storage or through an Access, which is created
// from &mut Storage.
unsafe impl Send for Storage {}
// SAFETY: &Storage exposes no way to read or write region bytes.
unsafe impl Sync for Storage {}

impl Storage {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, region: Region) -> RegionId {
        self.regions.push(region);
        RegionId((self.regions.len() - 1) as u32)
    }

    /// Adds read-only bytes (program constants, a memory-mapped file).
    pub fn add_shared(&mut self, bytes: SharedBytes) -> RegionId {
        let slice = bytes.as_slice();
        let len = slice.len();
        let ptr = NonNull::new(slice.as_ptr() as *mut u8).unwrap_or(NonNull::dangling());
        self.push(Region {
            ptr,
            len,
            writable: false,
            _owner: Owner::Shared(bytes),
        })
    }

    /// Adds an owned, writable buffer.
    pub fn add_buffer(&mut self, buffer: AlignedBuffer) -> RegionId {
        let len = buffer.len();
        let ptr = buffer.as_non_null();
        self.push(Region {
            ptr,
            len,
            writable: true,
            _owner: Owner::Buffer(buffer),
        })
    }

    /// Allocates a writable, zero-filled region of `size` bytes from `allocator`, which
    /// this storage keeps alive (and so un-resettable) for as long as it exists.
    pub fn add_allocated(
        &mut self,
        allocator: &Arc<dyn MemoryAllocator>,
        size: usize,
        align: usize,
    ) -> Result<RegionId, AllocError> {
        let ptr = allocator.allocate(size, align)?;
        // SAFETY: the allocator contract makes ptr valid and exclusive for `size` bytes
        // until reset or drop; our Arc clone prevents both while this storage lives.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, size) };
        Ok(self.push(Region {
            ptr,
            len: size,
            writable: true,
            _owner: Owner::Allocator(Arc::clone(allocator)),
        }))
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// True when there are no regions.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Length in bytes of a region.
    pub fn region_len(&self, id: RegionId) -> Result<usize, AccessError> {
        Ok(self.region(id)?.len)
    }

    /// True when the region accepts writes.
    pub fn is_writable(&self, id: RegionId) -> Result<bool, AccessError> {
        Ok(self.region(id)?.writable)
    }

    pub(super) fn region(&self, id: RegionId) -> Result<&Region, AccessError> {
        self.regions
            .get(id.0 as usize)
            .ok_or(AccessError::UnknownRegion { region: id.0 })
    }

    /// Checks that a span lies inside its region.
    pub fn check(&self, span: Span) -> Result<(), AccessError> {
        let region = self.region(span.region)?;
        match span.offset.checked_add(span.len) {
            Some(end) if end <= region.len => Ok(()),
            _ => Err(AccessError::OutOfBounds {
                region: span.region.0,
                offset: span.offset,
                len: span.len,
                region_len: region.len,
            }),
        }
    }

    /// Reads a span (exclusive access to the whole storage, so no borrow tracking).
    pub fn bytes(&mut self, span: Span) -> Result<&[u8], AccessError> {
        self.check(span)?;
        let region = self.region(span.region)?;
        // SAFETY: in bounds (checked); &mut self rules out any other live borrow.
        Ok(unsafe { std::slice::from_raw_parts(region.ptr.as_ptr().add(span.offset), span.len) })
    }

    /// Writes a span (exclusive access to the whole storage).
    pub fn bytes_mut(&mut self, span: Span) -> Result<&mut [u8], AccessError> {
        self.check(span)?;
        let region = self.region(span.region)?;
        if !region.writable {
            return Err(AccessError::ReadOnly {
                region: span.region.0,
            });
        }
        // SAFETY: in bounds, writable (owned by us), and &mut self is exclusive.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(region.ptr.as_ptr().add(span.offset), span.len)
        })
    }

    /// Starts a borrow-tracked access (one kernel call).
    pub fn access(&mut self) -> super::Access<'_> {
        super::Access::new(self)
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.regions.iter().map(|r| (r.len, r.writable)))
            .finish()
    }
}
