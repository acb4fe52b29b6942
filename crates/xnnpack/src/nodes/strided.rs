//! Walking a dense tensor by runs of its innermost axis, for the data-movement nodes
//! (transpose, slice, pad): strides of a contiguous layout and block copies between two
//! strided views.

use etch_kernels::KernelError;

use crate::dims::{Dims, MAX_DIMS};
use crate::nodes::call::short;

/// Element strides of a contiguous (row-major) tensor of dims `d`.
pub fn contiguous_strides(d: &Dims) -> [usize; MAX_DIMS] {
    let mut s = [0usize; MAX_DIMS];
    let mut stride = 1;
    for i in (0..d.rank()).rev() {
        s[i] = stride;
        stride *= d.get(i);
    }
    s
}

/// Visits every index of `dims` in row-major order with the flat offsets given by two
/// stride sets, innermost axis as a run: `f(src_offset, dst_offset, run, src_step)`.
pub fn for_each_run(
    dims: &Dims,
    src: &[usize; MAX_DIMS],
    dst: &[usize; MAX_DIMS],
    mut f: impl FnMut(usize, usize, usize, usize) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    let r = dims.rank();
    if r == 0 {
        return f(0, 0, 1, 1);
    }
    if dims.numel() == Some(0) {
        return Ok(());
    }
    let inner = dims.get(r - 1);
    let outer = dims.product(0..r - 1);
    let mut idx = [0usize; MAX_DIMS];
    for _ in 0..outer {
        let (mut so, mut d) = (0, 0);
        for k in 0..r - 1 {
            so += idx[k] * src[k];
            d += idx[k] * dst[k];
        }
        f(so, d, inner, src[r - 1])?;
        for k in (0..r - 1).rev() {
            idx[k] += 1;
            if idx[k] < dims.get(k) {
                break;
            }
            idx[k] = 0;
        }
    }
    Ok(())
}

/// The element offset of the index `at` in a tensor of `strides`.
pub fn offset(at: &[usize], strides: &[usize; MAX_DIMS]) -> usize {
    at.iter().zip(strides).map(|(a, b)| a * b).sum()
}

/// Copies a block of shape `block` from `x` into `out`, each given as (elements, offset
/// of the block's first element, strides); `what` names the node when one is short.
pub fn copy_block<T: Copy>(
    block: &Dims,
    (x, x_at, x_strides): (&[T], usize, &[usize; MAX_DIMS]),
    (out, out_at, out_strides): (&mut [T], usize, &[usize; MAX_DIMS]),
    what: &str,
) -> Result<(), KernelError> {
    for_each_run(block, x_strides, out_strides, |so, d, run, _| {
        out.get_mut(out_at + d..out_at + d + run)
            .zip(x.get(x_at + so..x_at + so + run))
            .map(|(o, s)| o.copy_from_slice(s))
            .ok_or_else(|| short(what))
    })
}
