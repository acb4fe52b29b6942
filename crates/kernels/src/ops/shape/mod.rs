//! Shape and copy kernels: views copied out (`view_copy`, `alias_copy`, `squeeze`,
//! `unsqueeze`), slicing (`slice_copy`, `select_copy`), joining and splitting (`cat`,
//! `stack`, `split_copy`, `split_with_sizes_copy`) and strided rearrangements
//! (`permute_copy`, `transpose_copy`, `t_copy`, `expand_copy`, `repeat`).
//!
//! Every kernel here moves bytes without looking at them, so one implementation per
//! element size serves every dtype. Inputs and outputs must be contiguous.

pub(crate) mod common;
mod join;
mod permute;
mod slice;
mod view;

use crate::Registry;

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    view::register(r);
    slice::register(r);
    join::register(r);
    permute::register(r);
}
