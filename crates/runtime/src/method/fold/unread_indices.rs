//! Max pooling whose indices nothing reads.
//!
//! `max_pool2d_with_indices` writes each window's maximum and, as int64, where it was.
//! An exported classifier (ResNet's stem) keeps only the values: the indices are a
//! planned tensor no later step names and no method returns. Such a step gets
//! [`Epilogue::indices_unread`] and its kernel writes the values alone: the same values
//! (the value at each index it would have written), and twice their bytes not written.

use etch_kernels::Epilogue;

use super::super::{FoldCounts, Step};
use super::batch_norm::kernel_args;
use super::uses::Uses;

const MAX_POOL: &str = "aten::max_pool2d_with_indices.out";

/// `max_pool2d_with_indices.out(self, kernel_size, stride, padding, dilation,
/// ceil_mode, out, indices)` and its return slot: the position of `indices`.
const INDICES: usize = 7;
const ARGS: usize = 9;

/// Marks each kept max pooling step whose indices no other step names and nothing pins.
pub(super) fn mark_unread_indices(
    steps: &mut [Step],
    keep: &[bool],
    uses: &Uses,
    (operator_names, counts): (&[String], &mut FoldCounts),
) {
    debug_assert!(Epilogue::INDICES_OPS.contains(&MAX_POOL));
    for s in 0..steps.len() {
        if !keep[s] {
            continue;
        }
        let Some(args) = kernel_args(&steps[s], MAX_POOL, operator_names) else {
            continue;
        };
        if args.len() != ARGS || !uses.only_in_kept(args[INDICES], &[s], keep) {
            continue;
        }
        if let Step::Kernel { epilogue, .. } = &mut steps[s] {
            epilogue.indices_unread = true;
            counts.unread_indices += 1;
        }
    }
}
