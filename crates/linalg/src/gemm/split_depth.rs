//! The product split over its depth (K) rather than its rows or columns: each task
//! multiplies one contiguous range of A's columns and B's rows into a partial product
//! of the whole output, and the partials are then summed and finished row by row.
//!
//! A row or column split makes every task read all of B's rows. Where B was just
//! written split by rows over the same threads (a projecting pointwise convolution
//! after a depthwise one that split its channels), half of what each task reads sits in
//! the other core's cache. A depth split, its ranges cut as that depthwise split its
//! channels, reads only what the task's own thread wrote.
//!
//! The sums differ from the serial product in the last bits (two partial sums added,
//! rather than one running sum), and do not depend on which thread runs which task.

use std::sync::Mutex;

use super::{
    Gemm, MatRef, OutElem, RightSource, check_im2col, finish_row, im2col_scratch_len, run,
    scratch_len,
};
use crate::conv_nchw::Im2col;
use crate::{Isa, LinalgError, ThreadPool};

/// Into how many depth ranges [`gemm_split_depth`] cuts a product of depth `k` on
/// `threads` threads: one per thread, of equal length but the last, as a depthwise
/// convolution cuts its planes into one run per thread.
fn ranges(k: usize, threads: usize) -> usize {
    let per = k.div_ceil(threads.max(1)).max(1);
    k.div_ceil(per).max(1)
}

/// Rows of each depth range but the last (which may be shorter).
fn range_len(k: usize, threads: usize) -> usize {
    k.div_ceil(ranges(k, threads)).max(1)
}

/// The part of `g` over depth `k0..k1`: A's columns and B's rows in that range, with no
/// scale, addend or clamp (the finish comes once, after the sum).
fn depth_part<'a>(g: &Gemm<'a>, (k0, k1): (usize, usize)) -> Gemm<'a> {
    let a = MatRef {
        offset: g.a.offset + k0 * g.a.cs,
        cols: k1 - k0,
        ..g.a
    };
    let b = MatRef {
        offset: g.b.offset + k0 * g.b.rs,
        rows: k1 - k0,
        ..g.b
    };
    Gemm {
        a,
        b,
        alpha: 1.0,
        addend: None,
        clamp: None,
    }
}

/// f32 elements of one task's share of the scratch: its partial product, then the
/// serial product's scratch of its (longest) depth range, B read as a view or packed
/// from an im2col image.
fn task_len(isa: Isa, g: &Gemm<'_>, threads: usize) -> usize {
    let (m, n, k) = (g.a.rows, g.b.cols, g.a.cols);
    let part = depth_part(g, (0, range_len(k, threads).min(k)));
    m * n + scratch_len(isa, &part, 1).max(im2col_scratch_len(isa, &part, 1))
}

/// Scratch (f32 elements) that [`gemm_split_depth`] needs on `threads` threads: each
/// range's task share, then a row per thread for summing (or, with one range, what the
/// product needs unsplit).
pub fn split_depth_scratch_len(isa: Isa, g: &Gemm<'_>, threads: usize) -> usize {
    let (n, k) = (g.b.cols, g.a.cols);
    if ranges(k, threads) < 2 {
        return scratch_len(isa, g, threads).max(im2col_scratch_len(isa, g, threads));
    }
    ranges(k, threads) * task_len(isa, g, threads) + threads * n
}

/// Where [`gemm_split_depth`] reads B from.
#[derive(Clone, Copy)]
pub enum DepthSplitB<'a> {
    /// The product's own `g.b`.
    View,
    /// The im2col matrix of one convolution group's image, packed from it as
    /// [`gemm_im2col`](super::gemm_im2col) does (`g.b` only gives the shape): each task
    /// packs the rows of its own range of input channels and taps.
    Im2col(&'a Im2col<'a>),
}

/// `g` into `out` (`m*n`, row-major), split over its depth into one contiguous range
/// of A's columns and B's rows per thread (see the module's notes); `scratch` holds at
/// least [`split_depth_scratch_len`] elements. With one range it is the unsplit
/// product.
pub fn gemm_split_depth<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    b: DepthSplitB<'_>,
    out: &mut [O],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    match b {
        DepthSplitB::View => split_depth(pool, isa, g, RightSource::View, out, scratch),
        DepthSplitB::Im2col(image) => {
            check_im2col(g, image)?;
            split_depth(pool, isa, g, RightSource::Im2col(image, 0), out, scratch)
        }
    }
}

fn split_depth<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    src: RightSource<'_>,
    out: &mut [O],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    let (m, n, k) = g.dims();
    let threads = pool.threads();
    let parts = ranges(k, threads);
    if parts < 2 || m == 0 || n == 0 || matches!(src, RightSource::Packed(_)) {
        return run(pool, isa, g, src, out, scratch);
    }
    g.validate(!matches!(src, RightSource::View))?;
    let need = split_depth_scratch_len(isa, g, threads);
    if scratch.len() < need {
        return Err(LinalgError::ScratchTooSmall {
            what: "depth-split matrix product",
            need,
            len: scratch.len(),
        });
    }
    if out.len() < m * n {
        return Err(LinalgError::OutputTooSmall {
            what: "depth-split matrix product",
            need: m * n,
            len: out.len(),
        });
    }
    let (per_task, per_range) = (task_len(isa, g, threads), range_len(k, threads));
    let (tasks, sums) = scratch[..need].split_at_mut(parts * per_task);
    let failed: Mutex<Option<LinalgError>> = Mutex::new(None);
    let serial = ThreadPool::serial();
    pool.for_each_chunk_mut(tasks, per_task, 1, |t, chunk| {
        let depth = (t * per_range, ((t + 1) * per_range).min(k));
        let src = match src {
            RightSource::Im2col(image, first) => RightSource::Im2col(image, first + depth.0),
            other => other,
        };
        let (partial, work) = chunk.split_at_mut(m * n);
        if let Err(e) = run(&serial, isa, &depth_part(g, depth), src, partial, work)
            && let Ok(mut first) = failed.lock()
        {
            first.get_or_insert(e);
        }
    });
    if let Some(e) = failed.into_inner().ok().flatten() {
        return Err(e);
    }
    let tasks = &*tasks;
    let partial = |t: usize, i: usize| &tasks[t * per_task + i * n..][..n];
    // Rows per summing task: a few thousand values at least.
    let min_rows = (crate::GRAIN_SIZE / 8).div_ceil(n).max(1);
    pool.for_each_chunk_mut_with_scratch(&mut out[..m * n], n, min_rows, sums, n, |i, row, sum| {
        sum.copy_from_slice(partial(0, i));
        for t in 1..parts {
            for (s, &v) in sum.iter_mut().zip(partial(t, i)) {
                *s += v;
            }
        }
        finish_row(g, sum, i, 0, row);
    });
    Ok(())
}
