//! `sum` and `mean` of an f32 tensor over its last dims (global average pooling of NCHW
//! planes): each output is one contiguous run of the input, summed by the kernel
//! library's [`etch_linalg::runs::sum_runs`] (sixteen runs at once with AVX-512, each
//! still summed left to right from 0, the general path's order and bits), split over
//! the pool.

use etch_base::ScalarType;
use etch_linalg::runs::sum_runs;

use super::Reduction;
use crate::{KernelContext, KernelError};

/// Fewest input values of one task: smaller reductions run on the calling thread.
const MIN_TASK_VALUES: usize = 16384;

/// Runs `red` (a sum, or a mean when `mean`) when it is such a reduction: f32 in and
/// out, both in their default dim order, and the reduced dims the input's last ones;
/// `Ok(false)`, touching nothing, otherwise.
pub(super) fn try_run(
    ctx: &KernelContext<'_>,
    red: &Reduction,
    mean: bool,
) -> Result<bool, KernelError> {
    let (x, out) = (&red.x, &red.out);
    let rank = x.rank();
    let f32s = x.dtype() == ScalarType::Float && out.dtype() == ScalarType::Float;
    if !f32s || !x.is_contiguous() || !out.is_contiguous() || rank == 0 {
        return Ok(false);
    }
    // The reduced dims must be a suffix: `first..rank`, at least one.
    let first = (0..rank).find(|&d| red.mask[d]).unwrap_or(rank);
    if first == rank || !red.mask[first..rank].iter().all(|&m| m) {
        return Ok(false);
    }
    let run: usize = x.sizes()[first..].iter().product();
    let runs: usize = x.sizes()[..first].iter().product();
    if out.numel() != runs {
        return Ok(false);
    }
    let xs = ctx.read::<f32>(x)?;
    let os = ctx.write::<f32>(out)?;
    let (Some(xs), Some(os)) = (xs.get(..runs * run), os.get_mut(..runs)) else {
        return Err(KernelError::invalid(
            "reduction operand shorter than its shape",
        ));
    };
    let isa = etch_linalg::dispatch().elementwise;
    let pool = ctx.pool();
    let tasks = (runs * run / MIN_TASK_VALUES).clamp(1, pool.threads());
    let per_task = runs.div_ceil(tasks).max(1);
    pool.for_each_chunk_mut(os, per_task, 1, |t, sums| {
        let first = t * per_task;
        sum_runs(isa, &xs[first * run..(first + sums.len()) * run], run, sums);
        if mean {
            let count = run as f32;
            sums.iter_mut().for_each(|s| *s /= count);
        }
    });
    Ok(true)
}
