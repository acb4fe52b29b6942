//! Where a method's tensors live: a table of byte regions (planned buffers, constant
//! data, input buffers) and a borrow tracker that hands out checked, typed slices.
//!
//! Tensors refer to their bytes by [`Span`] (region, offset, length), never by pointer.
//! A kernel call borrows bytes through an [`Access`], which records every borrow of a
//! writable region and refuses a mutable borrow that overlaps any other borrow of the
//! same call, so aliasing planned memory can never produce two live `&mut` to the same
//! bytes.

mod access;
mod regions;

pub use access::{Access, MAX_BORROWS};
pub use regions::{RegionId, Span, Storage};
