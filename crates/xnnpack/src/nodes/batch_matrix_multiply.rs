//! `BatchMatrixMultiply`: `y[.., m, n] = a[.., m, k] · b[.., k, n]` (`b` as `[.., n, k]`
//! with `XNN_FLAG_TRANSPOSE_B`), the batch dims broadcast, each batch a product of the
//! shared GEMM.

use etch_kernels::{BackendError, KernelError, ThreadPool};
use etch_linalg::{GemmF32, RhsF32, gemm_f32, gemm_f32_rows_alone};

use crate::dims::{Dims, MAX_DIMS};
use crate::graph::NodeDef;
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::{ShapeResult, broadcast, get, set};
use crate::plan_builder::Builder;
use crate::schema::FLAG_TRANSPOSE_WEIGHTS;

/// A batched matrix product node.
#[derive(Debug, Clone)]
pub struct BatchMatrixMultiply {
    a: usize,
    b: usize,
    y: usize,
    transpose_b: bool,
}

/// Reads a `BatchMatrixMultiply` node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    node.inputs = vec![
        Some(r.value(0, "input1_id")?),
        Some(r.value(1, "input2_id")?),
    ];
    node.outputs = vec![r.value(2, "output_id")?];
    node.flags = r.flags(3, FLAG_TRANSPOSE_WEIGHTS)?;
    Ok(())
}

/// Plans a `BatchMatrixMultiply` node.
pub fn plan(b: &mut Builder<'_>, node: &NodeDef) -> BatchMatrixMultiply {
    BatchMatrixMultiply {
        a: b.input(node, 0),
        b: b.input(node, 1),
        y: b.output(node),
        transpose_b: node.flags & FLAG_TRANSPOSE_WEIGHTS != 0,
    }
}

impl NodeOp for BatchMatrixMultiply {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.a, self.b])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let ad = get(shapes, self.a);
        let bd = get(shapes, self.b);
        if ad.rank() < 2 || bd.rank() < 2 {
            return Err("batch matrix multiply needs rank 2 or more");
        }
        let (m, k) = (ad.get(ad.rank() - 2), ad.get(ad.rank() - 1));
        let (kb, n) = if self.transpose_b {
            (bd.get(bd.rank() - 1), bd.get(bd.rank() - 2))
        } else {
            (bd.get(bd.rank() - 2), bd.get(bd.rank() - 1))
        };
        if k != kb {
            return Err("inner dimensions differ");
        }
        let ab = Dims::new(&ad.as_slice()[..ad.rank() - 2]).unwrap_or_default();
        let bb = Dims::new(&bd.as_slice()[..bd.rank() - 2]).unwrap_or_default();
        let batch = broadcast(&ab, &bb).ok_or("batch dimensions do not broadcast")?;
        let lead = batch.rank();
        let mut out = [0usize; MAX_DIMS + 2];
        out[..lead].copy_from_slice(batch.as_slice());
        out[lead..lead + 2].copy_from_slice(&[m, n]);
        set(
            shapes,
            self.y,
            Dims::new(&out[..lead + 2]).ok_or("too many dimensions")?,
        );
        Ok(())
    }

    fn gemm_scratch_len(&self, shapes: &[Dims], threads: usize) -> usize {
        let (ad, yd) = (&shapes[self.a], &shapes[self.y]);
        let (m, k) = (
            ad.get(ad.rank().saturating_sub(2)),
            ad.get(ad.rank().saturating_sub(1)),
        );
        let n = yd.get(yd.rank().saturating_sub(1));
        bmm_gemm(m, n, k, &[], &[], self.transpose_b).scratch_len(threads)
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let shapes = call.shapes;
        let mut scratch = call.scratch;
        let (_, gemm) = scratch.parts();
        batch_matmul(
            &shapes[self.a],
            call.inputs[0],
            &shapes[self.b],
            call.inputs[1],
            &shapes[self.y],
            self.transpose_b,
            call.pool,
            call.output,
            gemm,
        )
    }
}

/// Batched matrix products with broadcast batch dimensions.
#[allow(clippy::too_many_arguments)]
fn batch_matmul(
    ad: &Dims,
    a: &[f32],
    bd: &Dims,
    b: &[f32],
    yd: &Dims,
    transpose_b: bool,
    pool: &ThreadPool,
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), KernelError> {
    let (ar, yr) = (ad.rank(), yd.rank());
    let (m, k) = (ad.get(ar - 2), ad.get(ar - 1));
    let n = yd.get(yr - 1);
    let batches = yd.product(0..yr - 2);
    for bi in 0..batches {
        let (ao, bo) = batch_offsets(ad, bd, yd, bi);
        let dst = out
            .get_mut(bi * m * n..(bi + 1) * m * n)
            .ok_or_else(|| short("batch matmul"))?;
        let p = bmm_gemm(
            m,
            n,
            k,
            a.get(ao..).unwrap_or(&[]),
            b.get(bo..).unwrap_or(&[]),
            transpose_b,
        );
        gemm_f32(pool, &p, dst, scratch)?;
    }
    Ok(())
}

/// Element offsets in `a` and `b` of batch `bi` of the output (broadcast dims of size 1
/// stay at 0).
fn batch_offsets(ad: &Dims, bd: &Dims, yd: &Dims, bi: usize) -> (usize, usize) {
    let (ar, br, yr) = (ad.rank(), bd.rank(), yd.rank());
    let batch_rank = yr - 2;
    let mut idx = [0usize; MAX_DIMS];
    let mut rem = bi;
    for d in (0..batch_rank).rev() {
        idx[d] = rem % yd.get(d).max(1);
        rem /= yd.get(d).max(1);
    }
    let offset = |dims: &Dims, rank: usize| {
        let lead = rank - 2;
        let mut off = 0usize;
        for d in 0..lead {
            let size = dims.get(d);
            let i = idx[batch_rank - lead + d];
            off = off * size + if size == 1 { 0 } else { i };
        }
        off
    };
    let (m, k) = (ad.get(ar - 2), ad.get(ar - 1));
    let n = yd.get(yr - 1);
    (offset(ad, ar) * m * k, offset(bd, br) * k * n)
}

/// Several sessions through one node whose `b` is a constant (the runtime's batched
/// step, `crate::batch`): for each batch of the output, every session's row of `a`
/// stacked and multiplied in one pass over that batch of `b`, each row with the bits
/// of its one-row product alone (`etch_linalg::gemm_f32_rows_alone`: the ordinary
/// product orders its sums differently once it has more than one row).
impl BatchMatrixMultiply {
    /// `(a, b)`: the node's input values.
    pub fn operands(&self) -> (usize, usize) {
        (self.a, self.b)
    }

    /// `(batches, k, n)` when sessions with these shapes can share the pass (one row
    /// of `a` per batch); `None` otherwise.
    pub fn stackable(&self, shapes: &[Dims]) -> Option<(usize, usize, usize)> {
        let (ad, yd) = (&shapes[self.a], &shapes[self.y]);
        let (ar, yr) = (ad.rank(), yd.rank());
        if ar < 2 || yr < 2 || ad.get(ar - 2) != 1 {
            return None;
        }
        Some((yd.product(0..yr - 2), ad.get(ar - 1), yd.get(yr - 1)))
    }

    /// Element offsets in `a` and `b` of output batch `bi` at `shapes`.
    pub fn offsets(&self, shapes: &[Dims], bi: usize) -> (usize, usize) {
        batch_offsets(&shapes[self.a], &shapes[self.b], &shapes[self.y], bi)
    }

    /// GEMM scratch of `rows` stacked rows on `threads` threads.
    pub fn stacked_scratch_len(&self, rows: usize, n: usize, k: usize, threads: usize) -> usize {
        bmm_gemm(rows, n, k, &[], &[], self.transpose_b).rows_alone_scratch_len(threads)
    }

    /// `rows` stacked rows `x` (`rows * k`) times batch `b` (from its offset) into
    /// `out` (`rows * n`).
    #[allow(clippy::too_many_arguments)]
    pub fn run_stacked(
        &self,
        pool: &ThreadPool,
        (rows, n, k): (usize, usize, usize),
        x: &[f32],
        b: &[f32],
        out: &mut [f32],
        scratch: &mut [f32],
    ) -> Result<(), KernelError> {
        let p = bmm_gemm(rows, n, k, x, b, self.transpose_b);
        Ok(gemm_f32_rows_alone(pool, &p, out, scratch)?)
    }
}

/// One batch of a batched matrix product: `b` is `[n, k]` when `transpose_b`, else
/// `[k, n]`.
fn bmm_gemm<'a>(
    m: usize,
    n: usize,
    k: usize,
    a: &'a [f32],
    b: &'a [f32],
    transpose_b: bool,
) -> GemmF32<'a> {
    GemmF32 {
        m,
        n,
        k,
        a,
        lda: k,
        b: if transpose_b {
            RhsF32::NK(b)
        } else {
            RhsF32::KN(b)
        },
        bias: None,
        clamp: None,
    }
}
