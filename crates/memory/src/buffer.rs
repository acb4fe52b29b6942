//! Owned, aligned, zero-initialised byte buffers.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use crate::AllocError;
use crate::align::check_alignment;

/// A heap byte buffer with a chosen alignment, zero-filled at creation.
///
/// ```
/// let mut b = etch_memory::AlignedBuffer::zeroed(100, 64).unwrap();
/// assert_eq!(b.as_slice().len(), 100);
/// assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
/// b.as_mut_slice()[3] = 7;
/// assert_eq!(b.as_slice()[3], 7);
/// ```
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    layout: Option<Layout>,
}

// SAFETY: the buffer exclusively owns its heap block; it has no interior mutability.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared references only allow reads.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// A zero-filled buffer of `len` bytes aligned to `align` (a power of two).
    pub fn zeroed(len: usize, align: usize) -> Result<Self, AllocError> {
        check_alignment(align)?;
        if len == 0 {
            // A dangling, well-aligned pointer is valid for zero-length slices.
            let ptr = NonNull::new(std::ptr::without_provenance_mut::<u8>(align))
                .unwrap_or(NonNull::dangling());
            return Ok(Self {
                ptr,
                len,
                layout: None,
            });
        }
        let layout = Layout::from_size_align(len, align)
            .map_err(|_| AllocError::SizeOverflow { size: len, align })?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(AllocError::SystemOutOfMemory { size: len })?;
        Ok(Self {
            ptr,
            len,
            layout: Some(layout),
        })
    }

    /// A buffer holding a copy of `bytes`, aligned to `align`.
    pub fn copy_from(bytes: &[u8], align: usize) -> Result<Self, AllocError> {
        let mut b = Self::zeroed(bytes.len(), align)?;
        b.as_mut_slice().copy_from_slice(bytes);
        Ok(b)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (zeroed at creation) for the
        // lifetime of self, and no &mut alias exists while &self is held.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_non_null(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: ptr was returned by alloc_zeroed with exactly this layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl AsRef<[u8]> for AlignedBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuffer")
            .field("len", &self.len)
            .finish()
    }
}
