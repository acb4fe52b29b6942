//! Per-kernel scratch memory: typed, aligned, initialised slices from the temp
//! allocator, valid for one kernel call.

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::ptr::NonNull;

use bytemuck::Pod;

use crate::{AllocError, MemoryAllocator};

/// Alignment of every scratch block (a cache line; enough for any SIMD load).
pub const SCRATCH_ALIGNMENT: usize = 64;

/// Most heap fallback blocks one scope may hold.
/// The byte that fills every element [`TempScope::scratch_dirty`] hands out in debug
/// builds.
pub const DIRTY_FILL: u8 = 0xff;

const MAX_FALLBACK_BLOCKS: usize = 32;

/// Heap fallback blocks of one scope, and how many are in use.
type FallbackBlocks = ([Option<(NonNull<u8>, Layout)>; MAX_FALLBACK_BLOCKS], usize);

/// What a scope handed out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScratchStats {
    /// Scratch requests served.
    pub allocations: u64,
    /// Bytes handed out.
    pub bytes: usize,
    /// Requests the temp allocator could not serve (missing or exhausted), served from
    /// the heap instead.
    pub fallbacks: u64,
    /// Bytes of those heap fallbacks.
    pub fallback_bytes: usize,
}

/// Scratch for one kernel call.
///
/// Slices borrow the scope, so they cannot outlive it; the executor resets the temp
/// allocator only after the scope is gone. Every slice is initialised (recycled
/// memory is dirty, and Rust never hands out uninitialised values).
///
/// ```
/// use etch_memory::TempScope;
/// let scope = TempScope::new(None); // no temp allocator: heap fallback, counted
/// let a = scope.scratch::<f32>(100).unwrap();
/// let b = scope.scratch_filled::<f32>(8, f32::NEG_INFINITY).unwrap();
/// a[0] = b[0];
/// assert_eq!(a.as_ptr() as usize % 64, 0);
/// assert_eq!(scope.stats().fallbacks, 2);
/// ```
pub struct TempScope<'a> {
    allocator: Option<&'a dyn MemoryAllocator>,
    fallback: RefCell<FallbackBlocks>,
    stats: Cell<ScratchStats>,
}

impl<'a> TempScope<'a> {
    /// A scope over `allocator` (or heap fallback only, for `None`).
    pub fn new(allocator: Option<&'a dyn MemoryAllocator>) -> Self {
        Self {
            allocator,
            fallback: RefCell::new(([None; MAX_FALLBACK_BLOCKS], 0)),
            stats: Cell::new(ScratchStats::default()),
        }
    }

    /// What this scope has handed out so far.
    pub fn stats(&self) -> ScratchStats {
        self.stats.get()
    }

    /// `n` zeroed elements of `T`, 64-byte aligned.
    #[allow(clippy::mut_from_ref)]
    pub fn scratch<T: Pod>(&self, n: usize) -> Result<&mut [T], AllocError> {
        self.scratch_filled(n, T::zeroed())
    }

    /// `n` elements of `T` set to `value`, 64-byte aligned.
    #[allow(clippy::mut_from_ref)]
    pub fn scratch_filled<T: Pod>(&self, n: usize, value: T) -> Result<&mut [T], AllocError> {
        let size = Self::bytes_of::<T>(n)?;
        let ptr = self.raw(size)?;
        let ptr = ptr.as_ptr().cast::<T>();
        // SAFETY: ptr is 64-aligned (>= align_of::<T>(), checked by `bytes_of`) and
        // valid for `size` bytes exclusively until the allocator's reset, which cannot
        // happen while this scope (and so the returned borrow) lives. Every element is
        // written before the slice is formed.
        unsafe {
            for i in 0..n {
                ptr.add(i).write(value);
            }
            Ok(std::slice::from_raw_parts_mut(ptr, n))
        }
    }

    /// `n` elements of `T`, 64-byte aligned, whose values are unspecified: what an
    /// earlier kernel left there, or zeros (in debug builds: every byte [`DIRTY_FILL`]). For scratch a kernel writes in full before
    /// reading it (packing buffers, im2col columns), which then skips clearing it.
    /// Cleared like [`TempScope::scratch`] when the allocator does not promise
    /// initialised blocks ([`MemoryAllocator::initialised_blocks`]) or the request
    /// falls back to the heap.
    #[allow(clippy::mut_from_ref)]
    pub fn scratch_dirty<T: Pod>(&self, n: usize) -> Result<&mut [T], AllocError> {
        if cfg!(debug_assertions) {
            // Debug builds (the tests) hand out all-ones bytes (NaN for floats, -1 or the
            // largest value for integers) instead of stale ones or zeros, so that a kernel
            // which reads dirty scratch before writing it fails its tests rather than
            // passing by luck.
            let out = self.scratch::<T>(n)?;
            bytemuck::cast_slice_mut::<T, u8>(out).fill(DIRTY_FILL);
            return Ok(out);
        }
        if !self.allocator.is_some_and(|a| a.initialised_blocks()) {
            return self.scratch(n);
        }
        let size = Self::bytes_of::<T>(n)?;
        let Some(Ok(ptr)) = self.allocator.map(|a| a.allocate(size, SCRATCH_ALIGNMENT)) else {
            return self.scratch(n);
        };
        let mut stats = self.stats.get();
        stats.allocations += 1;
        stats.bytes += size;
        self.stats.set(stats);
        // SAFETY: ptr is 64-aligned (checked by `bytes_of`: >= align_of::<T>()) and
        // valid for `size` bytes exclusively until the allocator's reset, which cannot
        // happen while this scope (and so the returned borrow) lives. The allocator
        // promises the block is initialised memory, and any bit pattern is a valid `T`
        // (`Pod`).
        unsafe { Ok(std::slice::from_raw_parts_mut(ptr.as_ptr().cast::<T>(), n)) }
    }

    /// Bytes of `n` elements of `T`, checking that scratch alignment suits `T`.
    fn bytes_of<T: Pod>(n: usize) -> Result<usize, AllocError> {
        if std::mem::align_of::<T>() > SCRATCH_ALIGNMENT {
            return Err(AllocError::InvalidAlignment {
                align: std::mem::align_of::<T>(),
            });
        }
        n.checked_mul(std::mem::size_of::<T>())
            .ok_or(AllocError::SizeOverflow {
                size: usize::MAX,
                align: SCRATCH_ALIGNMENT,
            })
    }

    fn raw(&self, size: usize) -> Result<NonNull<u8>, AllocError> {
        let mut stats = self.stats.get();
        stats.allocations += 1;
        stats.bytes += size;
        let from_allocator = self.allocator.map(|a| a.allocate(size, SCRATCH_ALIGNMENT));
        let result = match from_allocator {
            Some(Ok(ptr)) => Ok(ptr),
            _ => {
                stats.fallbacks += 1;
                stats.fallback_bytes += size;
                self.heap_fallback(size)
            }
        };
        self.stats.set(stats);
        result
    }

    fn heap_fallback(&self, size: usize) -> Result<NonNull<u8>, AllocError> {
        let mut fallback = self.fallback.borrow_mut();
        let (blocks, len) = &mut *fallback;
        if *len == MAX_FALLBACK_BLOCKS {
            return Err(AllocError::Exhausted {
                requested: size,
                remaining: 0,
            });
        }
        let layout = Layout::from_size_align(size.max(1), SCRATCH_ALIGNMENT).map_err(|_| {
            AllocError::SizeOverflow {
                size,
                align: SCRATCH_ALIGNMENT,
            }
        })?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr = NonNull::new(raw).ok_or(AllocError::SystemOutOfMemory { size })?;
        blocks[*len] = Some((ptr, layout));
        *len += 1;
        Ok(ptr)
    }
}

impl Drop for TempScope<'_> {
    fn drop(&mut self) {
        let (blocks, len) = &mut *self.fallback.borrow_mut();
        for (ptr, layout) in blocks[..*len].iter_mut().filter_map(Option::take) {
            // SAFETY: allocated in heap_fallback with exactly this layout; the borrows
            // handed out ended with &self's lifetime, before drop.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        }
    }
}
