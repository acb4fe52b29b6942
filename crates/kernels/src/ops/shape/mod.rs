//! Shape and copy kernels: views copied out (`view_copy`, `alias_copy`, `squeeze`,
//! `unsqueeze`), slicing (`slice_copy`, `narrow_copy`, `select_copy`), joining and
//! splitting (`cat`, `stack`, `split_copy`, `split_with_sizes_copy`), strided
//! rearrangements (`permute_copy`, `transpose_copy`, `t_copy`, `expand_copy`, `repeat`,
//! `pixel_shuffle`, `pixel_unshuffle`), index remaps (`flip`, `roll`), scatters of a
//! slice or a select (`slice_scatter`, `select_scatter`), the lower triangle (`tril`)
//! and strided windows (`diagonal_copy`, `unfold_copy`).
//!
//! Every kernel here moves bytes without looking at them (`tril` also writes zeros),
//! so one implementation per element size serves every dtype. Inputs and outputs must
//! be contiguous.

pub(crate) mod common;
mod flip_roll;
mod join;
mod permute;
mod pixel_shuffle;
mod slice;
mod triangle;
mod view;
mod windows;

use crate::Registry;

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    view::register(r);
    slice::register(r);
    join::register(r);
    permute::register(r);
    pixel_shuffle::register(r);
    flip_roll::register(r);
    triangle::register(r);
    windows::register(r);
}
