//! Buffers for weights packed once at load and streamed on every call.
//!
//! A matrix-vector product streams its whole weight on every token. On 4 KiB pages the
//! hardware prefetcher stops at every page boundary, and on a Zen 4 core that halves the
//! bandwidth one stream reaches (measured: 11 against 26 GB/s for one 113 MB f32 weight
//! read in order). Weights are therefore placed on transparent huge pages. A huge page
//! is 2 MiB, larger than most single weights of a small LLM (a 576 x 576 int4 matrix is
//! 166 KB), so buffers are carved out of shared 2 MiB-aligned slabs rather than mapped
//! one by one.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use crate::AllocError;

/// Buffers smaller than this are ordinary heap vectors.
pub const SLAB_MIN_BYTES: usize = 16 << 10;
/// Bytes of one slab (buffers larger than this get a slab of their own).
const SLAB_BYTES: usize = 32 << 20;
/// Alignment of every buffer inside a slab (a cache line).
const SLAB_ALIGN: usize = 64;

/// A fixed-length, zero-filled buffer of `T` for weights packed at load time.
///
/// Buffers of [`SLAB_MIN_BYTES`] or more live in anonymous memory advised to use
/// transparent huge pages (`madvise(MADV_HUGEPAGE)` on Linux; elsewhere plain pages),
/// shared with the other weight buffers packed after them; a slab is unmapped when its
/// last buffer drops. Smaller buffers are ordinary heap vectors.
///
/// ```
/// let mut b = etch_memory::WeightBuffer::<f32>::zeroed(3).unwrap();
/// b[1] = 2.0;
/// assert_eq!(&b[..], &[0.0, 2.0, 0.0]);
/// ```
pub struct WeightBuffer<T: bytemuck::Pod> {
    store: Store<T>,
}

enum Store<T> {
    Heap(Vec<T>),
    Slab {
        /// Keeps the mapping alive.
        _slab: Arc<Slab>,
        ptr: NonNull<T>,
        len: usize,
    },
}

// SAFETY: a slab buffer exclusively owns its byte range of the slab (ranges never
// overlap and are never handed out twice); `T: Pod` has no interior mutability, so the
// buffer is as thread-safe as a `Vec<T>`.
unsafe impl<T: bytemuck::Pod + Send> Send for WeightBuffer<T> {}
// SAFETY: as above; shared references only read.
unsafe impl<T: bytemuck::Pod + Sync> Sync for WeightBuffer<T> {}

/// One anonymous mapping that buffers are bump-allocated from.
struct Slab {
    /// Owns the mapping (unmapped on drop); its bytes are only reached through `base`.
    _map: memmap2::MmapMut,
    /// The mapping's first byte, taken from the mutable map at creation.
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the slab only hands out disjoint ranges (see `slab_alloc`); the pointer is
// never dereferenced through the slab itself.
unsafe impl Send for Slab {}
// SAFETY: as above.
unsafe impl Sync for Slab {}

impl Slab {
    fn new(bytes: usize) -> Result<Slab, AllocError> {
        let mut map = memmap2::MmapMut::map_anon(bytes)
            .map_err(|_| AllocError::SystemOutOfMemory { size: bytes })?;
        #[cfg(target_os = "linux")]
        {
            // Advisory: without THP support the kernel keeps small pages.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let base =
            NonNull::new(map.as_mut_ptr()).ok_or(AllocError::SystemOutOfMemory { size: bytes })?;
        Ok(Slab {
            _map: map,
            base,
            len: bytes,
        })
    }
}

/// The slab new buffers come from, and how many of its bytes are handed out.
static CURRENT: Mutex<Option<(Weak<Slab>, usize)>> = Mutex::new(None);

/// `bytes` zeroed bytes from a slab: the slab and the range's start.
fn slab_alloc(bytes: usize) -> Result<(Arc<Slab>, usize), AllocError> {
    let need = bytes
        .checked_next_multiple_of(SLAB_ALIGN)
        .ok_or(AllocError::SizeOverflow {
            size: bytes,
            align: SLAB_ALIGN,
        })?;
    let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((weak, used)) = current.as_mut()
        && let Some(slab) = weak.upgrade()
        && slab.len - *used >= need
    {
        let start = *used;
        *used += need;
        return Ok((slab, start));
    }
    if need > SLAB_BYTES {
        // A slab of its own; the current one keeps serving smaller buffers.
        return Ok((Arc::new(Slab::new(need)?), 0));
    }
    let slab = Arc::new(Slab::new(SLAB_BYTES)?);
    *current = Some((Arc::downgrade(&slab), need));
    Ok((slab, 0))
}

impl<T: bytemuck::Pod> WeightBuffer<T> {
    /// `len` zeroed elements.
    pub fn zeroed(len: usize) -> Result<Self, AllocError> {
        let size = std::mem::size_of::<T>();
        let align = std::mem::align_of::<T>();
        let bytes = len.checked_mul(size).ok_or(AllocError::SizeOverflow {
            size: usize::MAX,
            align,
        })?;
        if bytes < SLAB_MIN_BYTES || align > SLAB_ALIGN {
            let mut v = Vec::new();
            v.try_reserve_exact(len)
                .map_err(|_| AllocError::SystemOutOfMemory { size: bytes })?;
            v.resize(len, T::zeroed());
            return Ok(WeightBuffer {
                store: Store::Heap(v),
            });
        }
        let (slab, start) = slab_alloc(bytes)?;
        // SAFETY: start + bytes <= slab.len (slab_alloc), so the offset stays inside the
        // mapping.
        let ptr = unsafe { slab.base.add(start) }.cast::<T>();
        Ok(WeightBuffer {
            store: Store::Slab {
                _slab: slab,
                ptr,
                len,
            },
        })
    }

    /// A buffer holding a copy of `values`.
    pub fn copy_from(values: &[T]) -> Result<Self, AllocError> {
        let mut b = Self::zeroed(values.len())?;
        b.copy_from_slice(values);
        Ok(b)
    }

    /// Bytes the elements take.
    pub fn byte_len(&self) -> usize {
        std::mem::size_of_val(self.deref())
    }

    /// True when the buffer lives in a huge-page slab (it is large enough).
    pub fn on_huge_pages(&self) -> bool {
        matches!(self.store, Store::Slab { .. })
    }
}

impl<T: bytemuck::Pod> Deref for WeightBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.store {
            Store::Heap(v) => v,
            // SAFETY: ptr..ptr+len is this buffer's own range of a live slab (the Arc
            // keeps the mapping), aligned for T (the slab is page-aligned and the range
            // starts at a multiple of SLAB_ALIGN >= align_of T), zero-filled at mapping
            // and so valid for the Pod type T; only &mut self gives mutable access.
            Store::Slab { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: bytemuck::Pod> DerefMut for WeightBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.store {
            Store::Heap(v) => v,
            // SAFETY: as in `deref`; the range belongs to this buffer alone, and &mut
            // self is the only access to it.
            Store::Slab { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: bytemuck::Pod> Clone for WeightBuffer<T> {
    /// A copy on the same kind of memory.
    ///
    /// # Panics
    /// When the system cannot provide the memory (as cloning a `Vec` does).
    fn clone(&self) -> Self {
        match Self::copy_from(self) {
            Ok(b) => b,
            Err(e) => panic!("cloning a weight buffer: {e}"),
        }
    }
}

impl<T: bytemuck::Pod> fmt::Debug for WeightBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightBuffer")
            .field("len", &self.len())
            .field("huge_pages", &self.on_huge_pages())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_hold_their_values() {
        let mut kept = Vec::new();
        for len in [
            0usize,
            5,
            SLAB_MIN_BYTES / 4 + 3,
            7,
            SLAB_BYTES / 4 + 1,
            40_000,
        ] {
            let mut b = WeightBuffer::<f32>::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&v| v == 0.0));
            assert_eq!(b.as_ptr() as usize % 4, 0);
            for (i, v) in b.iter_mut().enumerate() {
                *v = i as f32;
            }
            let c = b.clone();
            assert_eq!(&c[..], &b[..]);
            assert_eq!(b.byte_len(), len * 4);
            assert_eq!(b.on_huge_pages(), len * 4 >= SLAB_MIN_BYTES);
            kept.push(b);
        }
        // Buffers carved from one slab do not overlap.
        for (i, b) in kept.iter().enumerate() {
            assert!(
                b.iter().enumerate().all(|(j, &v)| v == j as f32),
                "buffer {i}"
            );
        }
    }

    #[test]
    fn buffers_are_usable_from_other_threads() {
        let b = WeightBuffer::<u8>::copy_from(&vec![3u8; 100_000]).unwrap();
        let sum: u64 = std::thread::scope(|s| {
            s.spawn(|| b.iter().map(|&v| u64::from(v)).sum())
                .join()
                .unwrap()
        });
        assert_eq!(sum, 300_000);
    }

    #[test]
    fn oversized_request_is_an_error() {
        assert!(WeightBuffer::<u64>::zeroed(usize::MAX / 2).is_err());
    }
}
