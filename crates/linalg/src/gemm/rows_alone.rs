//! Products whose rows are independent problems: several sessions' one-row products
//! against the same weights, run in one pass so the weights stream from memory once
//! (`etch-runtime`'s batched step). Each output row has the bits its row gives alone,
//! which the ordinary product does not promise: with more than one row it packs A and
//! runs the tiled micro-kernel, whose sums are ordered differently from the one-row
//! paths (`gemv_packed`, `gemv_rows`, `gemv_axpy`). Here every row runs the one-row path's
//! arithmetic (the same panel dots or dot-product rows, the same split of the columns
//! over the threads), one weight block at a time for all rows while the block is in
//! cache.

use super::kernels::{Tile, panel_dot};
use super::{
    DOT_ROWS_BLOCK, Elems, Gemm, MatRef, OutElem, PackedB, RightSource, axpy_depth_tasks,
    axpy_rows, axpy_split, dot_rows, dot_rows_split, finish, finish_row, gather, packed_gemv_split,
    run, scratch_len,
};
use crate::{Isa, LinalgError, ThreadPool};

/// Columns of B's rows one pass of [`axpy_blocks`] takes for all rows (`k` rows of them
/// stay in L2 while every row reads them). A column's sum does not depend on the
/// width: each column accumulates its own products in depth order.
const AXPY_ROWS_ALONE_COLS: usize = 256;

/// Scratch (f32 elements) that [`gemm_rows_alone`] needs for `g` on `threads`
/// threads.
pub fn rows_alone_scratch_len(isa: Isa, g: &Gemm<'_>, threads: usize) -> usize {
    let (m, n, k) = g.dims();
    let one_row = scratch_len(isa, &row_of(g, 0), threads);
    if m <= 1 {
        return one_row;
    }
    // The gathered rows, then the outputs block by block (panels padded to whole tiles),
    // or each depth task's partial sums.
    let tmp = m * n.next_multiple_of(Tile::of(isa).nr.max(1));
    let partials = m * n * axpy_depth_tasks(n, k, threads);
    one_row.max(m * k + tmp.max(partials))
}

/// `g` with every row of A computed as [`super::gemm`] computes it alone (bit for bit,
/// on the same pool): with B's rows contiguous (a `[n, k]` weight) or an f32 B with
/// contiguous columns (`[k, n]`) all rows share each pass over B; any other layout runs
/// row by row.
pub fn gemm_rows_alone<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    out: &mut [O],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    run_rows_alone(pool, isa, g, RightSource::View, out, scratch)
}

/// [`gemm_rows_alone`] with B from `src`.
pub(super) fn run_rows_alone<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    src: RightSource<'_>,
    out: &mut [O],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    let (m, n, k) = g.dims();
    if m <= 1 || n == 0 || k == 0 {
        return run(pool, isa, g, src, out, scratch);
    }
    g.validate(matches!(src, RightSource::Packed(_)))?;
    if out.len() < m * n {
        return Err(LinalgError::OutputTooSmall {
            what: "matrix product",
            need: m * n,
            len: out.len(),
        });
    }
    let need = rows_alone_scratch_len(isa, g, pool.threads());
    if scratch.len() < need {
        return Err(LinalgError::ScratchTooSmall {
            what: "matrix product of independent rows",
            need,
            len: scratch.len(),
        });
    }
    match src {
        RightSource::Packed(packed) => {
            let (xs, tmp) = scratch.split_at_mut(m * k);
            gather_rows(&g.a, xs);
            packed_rows(pool, g, packed, xs, tmp);
            let nr = Tile::of(packed.isa()).nr;
            scatter(g, packed_gemv_split(n, k, nr, pool.threads()), tmp, out);
            Ok(())
        }
        // B's columns contiguous (`[k, n]`, f32): the one-row product runs `gemv_axpy`.
        RightSource::View if row_of(g, 0).is_row_times_rows() => {
            let (xs, tmp) = scratch.split_at_mut(m * k);
            gather_rows(&g.a, xs);
            axpy_blocks(pool, isa, g, xs, tmp, out);
            Ok(())
        }
        // B's rows contiguous (`[n, k]`): the one-row product takes the dot-product rows.
        RightSource::View if g.b.rs == 1 && !g.b.data.is_f64() => {
            let (xs, tmp) = scratch.split_at_mut(m * k);
            gather_rows(&g.a, xs);
            weight_rows(pool, isa, g, xs, tmp);
            scatter(g, dot_rows_split(n, k, pool.threads()), tmp, out);
            Ok(())
        }
        _ => {
            for (i, row) in out.chunks_exact_mut(n).take(m).enumerate() {
                run(pool, isa, &row_of(g, i), src, row, scratch)?;
            }
            Ok(())
        }
    }
}

/// Row `i` of the product as a product of its own.
fn row_of<'a>(g: &Gemm<'a>, i: usize) -> Gemm<'a> {
    let mut row = *g;
    row.a.offset += i * g.a.rs;
    row.a.rows = 1.min(g.a.rows);
    if let Some((c, _)) = &mut row.addend {
        c.offset += i * c.rs;
        c.rows = 1.min(c.rows);
    }
    row
}

/// A's rows as f32, one after another, into `xs` (`m * k` values).
fn gather_rows(a: &MatRef<'_>, xs: &mut [f32]) {
    let k = a.cols;
    for (i, x) in xs.chunks_exact_mut(k).take(a.rows).enumerate() {
        gather(&a.data, a.offset + i * a.rs, a.cs, x);
    }
}

/// The outputs of a packed B, each thread's run of columns as one block of all rows
/// (`tmp[block_start * m + r * width + c]`), as `gemv_packed` splits and computes them.
fn packed_rows(pool: &ThreadPool, g: &Gemm<'_>, packed: &PackedB, xs: &[f32], tmp: &mut [f32]) {
    let (m, n, k) = g.dims();
    let (isa, nr) = (packed.isa(), Tile::of(packed.isa()).nr);
    let run = |first: usize, block: &mut [f32]| {
        let width = block.len() / m;
        let mut dots = [0f32; super::kernels::MAX_NR];
        let dots = &mut dots[..nr];
        for c in (0..width).step_by(nr) {
            let c0 = first + c;
            let panel = packed.panel(c0 / nr, 0, k);
            for (r, x) in xs.chunks_exact(k).enumerate() {
                panel_dot(isa, x, panel, dots);
                let len = nr.min(width - c);
                let row = &mut block[r * width + c..][..len];
                for (jj, (o, &d)) in row.iter_mut().zip(dots.iter()).enumerate() {
                    *o = finish(g, d, r, c0 + jj);
                }
            }
        }
    };
    let tmp = &mut tmp[..m * n];
    match packed_gemv_split(n, k, nr, pool.threads()) {
        Some(per) => pool.for_each_chunk_mut(tmp, per * m, 1, |ci, b| run(ci * per, b)),
        None => run(0, tmp),
    }
}

/// The outputs of a B with contiguous rows, blocked as [`packed_rows`], as
/// `gemv_rows` splits and computes them.
fn weight_rows(pool: &ThreadPool, isa: Isa, g: &Gemm<'_>, xs: &[f32], tmp: &mut [f32]) {
    let (m, n, k) = g.dims();
    let (w, ldw) = (&g.b, g.b.cs);
    let run = |first: usize, block: &mut [f32]| {
        let width = block.len() / m;
        let mut buf = [0f32; DOT_ROWS_BLOCK];
        for c in (0..width).step_by(DOT_ROWS_BLOCK) {
            let j0 = first + c;
            let len = DOT_ROWS_BLOCK.min(width - c);
            let dots = &mut buf[..len];
            let start = w.offset + j0 * ldw;
            for (r, x) in xs.chunks_exact(k).enumerate() {
                match w.data {
                    Elems::F32(s) => dot_rows(isa, x, &s[start..], ldw, dots),
                    Elems::F16(s) => dot_rows(isa, x, &s[start..], ldw, dots),
                    Elems::BF16(s) => dot_rows(isa, x, &s[start..], ldw, dots),
                    Elems::F64(s) => dot_rows(isa, x, &s[start..], ldw, dots),
                }
                let row = &mut block[r * width + c..][..len];
                for (jj, (o, &d)) in row.iter_mut().zip(dots.iter()).enumerate() {
                    *o = finish(g, d, r, j0 + jj);
                }
            }
        }
    };
    let tmp = &mut tmp[..m * n];
    match dot_rows_split(n, k, pool.threads()) {
        Some(per) => pool.for_each_chunk_mut(tmp, per * m, 1, |ci, b| run(ci * per, b)),
        None => run(0, tmp),
    }
}

/// The blocks of `tmp` (runs of `per` columns, all rows each; `None`: one run) into
/// the row-major `out`.
fn scatter<O: OutElem>(g: &Gemm<'_>, per: Option<usize>, tmp: &[f32], out: &mut [O]) {
    let (m, n, _) = g.dims();
    let per = per.unwrap_or(n).max(1);
    for (bi, block) in tmp[..m * n].chunks(per * m).enumerate() {
        let (first, width) = (bi * per, block.len() / m);
        for (r, src) in block.chunks_exact(width).enumerate() {
            for (o, &v) in out[r * n + first..][..width].iter_mut().zip(src) {
                *o = O::from_f32(v);
            }
        }
    }
}

/// The outputs of an f32 `[k, n]` B, as `gemv_axpy` computes one row: each column's
/// products added in depth order, by depth tasks whose partial sums are added in task
/// order where it splits the depth, else by runs of columns. All rows share each block
/// of B's rows while it is in cache.
fn axpy_blocks<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    xs: &[f32],
    tmp: &mut [f32],
    out: &mut [O],
) {
    let (m, n, k) = g.dims();
    let Elems::F32(b) = g.b.data else {
        return;
    };
    let ld = g.b.rs;
    // `acc[r * n + c]` += the products of depth `depth` for every row and column.
    let accumulate =
        |depth: std::ops::Range<usize>, c_first: usize, width: usize, acc: &mut [f32]| {
            for c in (0..width).step_by(AXPY_ROWS_ALONE_COLS) {
                let len = AXPY_ROWS_ALONE_COLS.min(width - c);
                let start = g.b.offset + depth.start * ld + c_first + c;
                for (r, x) in xs.chunks_exact(k).enumerate() {
                    let row = &mut acc[r * width + c..][..len];
                    axpy_rows(isa, &x[depth.clone()], b, start, ld, row);
                }
            }
        };
    let tasks = axpy_depth_tasks(n, k, pool.threads());
    if tasks > 1 {
        let per = k.div_ceil(tasks);
        let partials = &mut tmp[..tasks * m * n];
        pool.for_each_chunk_mut(partials, m * n, 1, |t, acc| {
            acc.fill(0.0);
            accumulate((t * per).min(k)..((t + 1) * per).min(k), 0, n, acc);
        });
        let (sum, rest) = partials.split_at_mut(m * n);
        for part in rest.chunks_exact(m * n) {
            for (s, &v) in sum.iter_mut().zip(part) {
                *s += v;
            }
        }
        for (r, row) in out.chunks_exact_mut(n).take(m).enumerate() {
            finish_row(g, &sum[r * n..(r + 1) * n], r, 0, row);
        }
        return;
    }
    let per = axpy_split(n, k, pool.threads());
    let tmp = &mut tmp[..m * n];
    let run = |first: usize, block: &mut [f32]| {
        let width = block.len() / m;
        block.fill(0.0);
        accumulate(0..k, first, width, block);
    };
    match per {
        Some(per) => pool.for_each_chunk_mut(tmp, per * m, 1, |ci, blk| run(ci * per, blk)),
        None => run(0, tmp),
    }
    let per = per.unwrap_or(n).max(1);
    for (bi, block) in tmp.chunks(per * m).enumerate() {
        let (first, width) = (bi * per, block.len() / m);
        for (r, src) in block.chunks_exact(width).enumerate() {
            finish_row(g, src, r, first, &mut out[r * n + first..][..width]);
        }
    }
}
