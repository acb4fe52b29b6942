//! Borrow tracking for one kernel call.

use std::cell::RefCell;
use std::marker::PhantomData;

use bytemuck::Pod;

use super::regions::{Region, Storage};
use super::{RegionId, Span};
use crate::AccessError;

/// The most borrows of writable memory one call may hold at once.
pub const MAX_BORROWS: usize = 64;

#[derive(Clone, Copy, Default)]
struct Borrow {
    region: u32,
    start: usize,
    end: usize,
    exclusive: bool,
}

struct BorrowLog {
    entries: [Borrow; MAX_BORROWS],
    len: usize,
}

impl BorrowLog {
    fn conflicts(&self, region: u32, start: usize, end: usize, exclusive: bool) -> bool {
        self.entries[..self.len].iter().any(|b| {
            b.region == region
                && b.start < end
                && start < b.end
                && (exclusive || b.exclusive)
                && start < end
        })
    }
}

/// Borrow-checked access to a [`Storage`]'s bytes for the duration of one kernel call.
///
/// Slices handed out live as long as the `Access`; shared borrows may overlap each
/// other, an exclusive borrow may overlap nothing. Read-only regions are never written.
///
/// ```
/// use etch_memory::{AlignedBuffer, Span, Storage};
/// let mut storage = Storage::new();
/// let r = storage.add_buffer(AlignedBuffer::zeroed(64, 64).unwrap());
/// let access = storage.access();
/// let a = access.slice_mut::<f32>(Span { region: r, offset: 0, len: 16 }).unwrap();
/// let b = access.slice::<f32>(Span { region: r, offset: 16, len: 16 }).unwrap();
/// a[0] = b[0] + 1.0;
/// // Overlapping a mutable borrow is refused:
/// assert!(access.slice::<f32>(Span { region: r, offset: 8, len: 16 }).is_err());
/// ```
pub struct Access<'a> {
    regions: &'a [Region],
    log: RefCell<BorrowLog>,
    _storage: PhantomData<&'a mut Storage>,
}

impl<'a> Access<'a> {
    pub(super) fn new(storage: &'a mut Storage) -> Self {
        Self {
            regions: &storage.regions,
            log: RefCell::new(BorrowLog {
                entries: [Borrow::default(); MAX_BORROWS],
                len: 0,
            }),
            _storage: PhantomData,
        }
    }

    fn locate(&self, span: Span, exclusive: bool) -> Result<*mut u8, AccessError> {
        let region =
            self.regions
                .get(span.region.0 as usize)
                .ok_or(AccessError::UnknownRegion {
                    region: span.region.0,
                })?;
        let end = match span.offset.checked_add(span.len) {
            Some(end) if end <= region.len => end,
            _ => {
                return Err(AccessError::OutOfBounds {
                    region: span.region.0,
                    offset: span.offset,
                    len: span.len,
                    region_len: region.len,
                });
            }
        };
        if exclusive && !region.writable {
            return Err(AccessError::ReadOnly {
                region: span.region.0,
            });
        }
        if region.writable {
            let mut log = self.log.borrow_mut();
            if log.conflicts(span.region.0, span.offset, end, exclusive) {
                return Err(AccessError::Aliased {
                    region: span.region.0,
                    offset: span.offset,
                    len: span.len,
                });
            }
            if span.len > 0 {
                if log.len == MAX_BORROWS {
                    return Err(AccessError::TooManyBorrows { limit: MAX_BORROWS });
                }
                let n = log.len;
                log.entries[n] = Borrow {
                    region: span.region.0,
                    start: span.offset,
                    end,
                    exclusive,
                };
                log.len += 1;
            }
        }
        // SAFETY: offset <= region.len (checked above), so the result stays inside
        // (or one past the end of) the region's allocation.
        Ok(unsafe { region.ptr.as_ptr().add(span.offset) })
    }

    /// Shared bytes of a span.
    pub fn bytes(&self, span: Span) -> Result<&[u8], AccessError> {
        let ptr = self.locate(span, false)?;
        // SAFETY: the span is in bounds of a live region (checked in locate); no
        // exclusive borrow overlaps it for the lifetime of &self (the log records this
        // borrow until the Access is dropped); the Storage is mutably borrowed by the
        // Access, so nothing else can touch the bytes.
        Ok(unsafe { std::slice::from_raw_parts(ptr, span.len) })
    }

    /// Exclusive bytes of a span.
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut(&self, span: Span) -> Result<&mut [u8], AccessError> {
        let ptr = self.locate(span, true)?;
        // SAFETY: in bounds of a writable region; the log proved no other borrow of
        // this call overlaps and records this one until the Access is dropped.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, span.len) })
    }

    /// A span viewed as a slice of `T` (its length must be a multiple of `T`'s size
    /// and its address aligned for `T`).
    pub fn slice<T: Pod>(&self, span: Span) -> Result<&[T], AccessError> {
        let bytes = self.bytes(span)?;
        bytemuck::try_cast_slice(bytes).map_err(|e| cast_error::<T>(span, e))
    }

    /// A span viewed as a mutable slice of `T`.
    #[allow(clippy::mut_from_ref)]
    pub fn slice_mut<T: Pod>(&self, span: Span) -> Result<&mut [T], AccessError> {
        let bytes = self.bytes_mut(span)?;
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| cast_error::<T>(span, e))
    }

    /// Number of regions visible through this access.
    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    /// True when `region` accepts writes.
    pub fn is_writable(&self, region: RegionId) -> bool {
        self.regions
            .get(region.0 as usize)
            .is_some_and(|r| r.writable)
    }
}

fn cast_error<T>(span: Span, e: bytemuck::PodCastError) -> AccessError {
    match e {
        bytemuck::PodCastError::TargetAlignmentGreaterAndInputNotAligned => {
            AccessError::Misaligned {
                region: span.region.0,
                offset: span.offset,
                align: std::mem::align_of::<T>(),
            }
        }
        _ => AccessError::Size {
            len: span.len,
            element_size: std::mem::size_of::<T>(),
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::{AlignedBuffer, SharedBytes, Span, Storage};

    fn span(region: crate::RegionId, offset: usize, len: usize) -> Span {
        Span {
            region,
            offset,
            len,
        }
    }

    #[test]
    fn shared_borrows_may_overlap_exclusive_may_not() {
        let mut s = Storage::new();
        let r = s.add_buffer(AlignedBuffer::zeroed(128, 64).unwrap());
        let a = s.access();
        let x = a.bytes(span(r, 0, 64)).unwrap();
        let y = a.bytes(span(r, 32, 64)).unwrap();
        assert_eq!(x.len() + y.len(), 128);
        assert!(a.bytes_mut(span(r, 60, 8)).is_err());
        let z = a.bytes_mut(span(r, 96, 32)).unwrap();
        z[0] = 1;
        assert!(a.bytes(span(r, 100, 1)).is_err());
        assert!(a.bytes(span(r, 120, 16)).is_err(), "out of bounds");
    }

    #[test]
    fn read_only_regions_refuse_writes() {
        let mut s = Storage::new();
        let r = s.add_shared(SharedBytes::Static(&[1, 2, 3, 4]));
        let a = s.access();
        assert_eq!(a.bytes(span(r, 1, 2)).unwrap(), &[2, 3]);
        assert!(a.bytes_mut(span(r, 0, 1)).is_err());
    }

    #[test]
    fn borrows_end_with_the_access() {
        let mut s = Storage::new();
        let r = s.add_buffer(AlignedBuffer::zeroed(16, 16).unwrap());
        {
            let a = s.access();
            a.slice_mut::<u32>(span(r, 0, 16)).unwrap()[1] = 9;
        }
        let a = s.access();
        assert_eq!(a.slice::<u32>(span(r, 0, 16)).unwrap()[1], 9);
        assert!(a.slice::<u32>(span(r, 1, 8)).is_err(), "misaligned");
        assert!(a.slice::<u32>(span(r, 0, 6)).is_err(), "ragged");
    }
}
