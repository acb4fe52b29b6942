//! The delegate run for several sessions at once (`DelegateHandle::execute_batch`):
//! every session binds its own call (its arena, from its own scratch), the nodes run
//! in order, each for every session, and a `FullyConnected` node with weights packed
//! at init, or a `BatchMatrixMultiply` whose `b` every session shares, runs once over
//! all sessions' rows, so its weights stream from memory once per step rather than once
//! per session. Each session gets the bits it gets alone (see
//! `FullyConnected::can_stack`, `BatchMatrixMultiply::stackable`).

use etch_kernels::{
    Args, Batch, Batched, KernelContext, KernelError, MAX_BATCH, ThreadPool, unpaired,
};

use crate::exec::{Call, begin, finish, node_operands, run_node, store_output};
use crate::nodes::batch_matrix_multiply::BatchMatrixMultiply;
use crate::nodes::fully_connected::FullyConnected;
use crate::nodes::{Node, NodeOp};
use crate::plan::Plan;

/// Runs the plan for each session of `args` (session `i` with `ctxs[i]`):
/// [`Batched::Done`] when some node ran once for all of them.
pub fn execute_batch(
    plan: &Plan,
    ctxs: &Batch<KernelContext<'_>>,
    args: &mut Batch<Args<'_>>,
) -> Result<Batched, KernelError> {
    let ctx0 = ctxs.get(0).ok_or_else(unpaired)?;
    let pool = ctx0.pool();
    let mut calls: Batch<Call<'_>> = Batch::new();
    for (i, a) in args.iter_mut().enumerate() {
        let ctx = ctxs.get(i).ok_or_else(unpaired)?;
        if calls.push(begin(plan, ctx, a)?).is_err() {
            return Err(unpaired());
        }
    }
    let mut work = StackedScratch::new(plan, ctx0, &calls)?;
    let mut shared = Batched::PerSession;
    for (i, op) in plan.ops.iter().enumerate() {
        let stacked = match op {
            Node::FullyConnected(fc) => run_stacked(plan, pool, &mut work, fc, &mut calls, i)?,
            Node::BatchMatrixMultiply(bmm) => {
                run_stacked_bmm(plan, pool, &mut work, bmm, &mut calls, i)?
            }
            _ => false,
        };
        if stacked {
            shared = Batched::Done;
            for call in calls.iter_mut() {
                store_output(plan, call, i)?;
            }
        } else {
            for call in calls.iter_mut() {
                run_node(plan, pool, call, i)?;
            }
        }
    }
    for (i, (a, call)) in args.iter_mut().zip(calls.iter()).enumerate() {
        finish(plan, ctxs.get(i).ok_or_else(unpaired)?, a, call)?;
    }
    Ok(shared)
}

/// Scratch of the stacked nodes of one batched call: the stacked input, the stacked
/// output and the GEMM scratch, taken once for the largest node (the temp allocator is
/// reset per delegate call, not per node, so one take per node would hold them all).
struct StackedScratch<'a> {
    x: &'a mut [f32],
    out: &'a mut [f32],
    gemm: &'a mut [f32],
}

impl<'a> StackedScratch<'a> {
    fn new(
        plan: &Plan,
        ctx: &'a KernelContext<'_>,
        calls: &Batch<Call<'_>>,
    ) -> Result<Self, KernelError> {
        let threads = ctx.pool().threads();
        let (mut x, mut out, mut gemm) = (0, 0, 0);
        for op in &plan.ops {
            let lens = match op {
                Node::FullyConnected(fc) => {
                    let (rows, count) = stack_rows(fc, calls);
                    let rows = &rows[..count];
                    let total: usize = rows.iter().sum();
                    fc.can_stack(rows).then(|| {
                        (
                            fc.stacked_input_len(total),
                            fc.stacked_output_len(total),
                            fc.stacked_scratch_len(total, threads),
                        )
                    })
                }
                Node::BatchMatrixMultiply(bmm) => calls.get(0).and_then(|c| {
                    let (_, k, n) = bmm.stackable(c.shapes)?;
                    let rows = calls.len();
                    Some((
                        rows * k,
                        rows * n,
                        bmm.stacked_scratch_len(rows, n, k, threads),
                    ))
                }),
                _ => None,
            };
            if let Some((a, b, c)) = lens {
                (x, out, gemm) = (x.max(a), out.max(b), gemm.max(c));
            }
        }
        Ok(Self {
            x: ctx.scratch_dirty::<f32>(x)?,
            out: ctx.scratch_dirty::<f32>(out)?,
            gemm: ctx.scratch_dirty::<f32>(gemm)?,
        })
    }
}

/// Each session's rows of fully connected node `fc`, and the number of sessions.
fn stack_rows(fc: &FullyConnected, calls: &Batch<Call<'_>>) -> ([usize; MAX_BATCH], usize) {
    let mut rows = [0usize; MAX_BATCH];
    for (r, call) in rows.iter_mut().zip(calls.iter()) {
        *r = fc.call_rows(call.shapes);
    }
    (rows, calls.len())
}

/// The first `len` elements of a stacked buffer.
fn part<'b>(buffer: &'b mut [f32], len: usize, what: &str) -> Result<&'b mut [f32], KernelError> {
    buffer
        .get_mut(..len)
        .ok_or_else(|| crate::nodes::call::short(what))
}

/// Runs fully connected node `i` once over every session's rows, when it can give each
/// session its own bits; false (nothing done) when it cannot.
fn run_stacked(
    plan: &Plan,
    pool: &ThreadPool,
    work: &mut StackedScratch<'_>,
    fc: &FullyConnected,
    calls: &mut Batch<Call<'_>>,
    i: usize,
) -> Result<bool, KernelError> {
    let (rows, count) = stack_rows(fc, calls);
    let rows = &rows[..count];
    if !fc.can_stack(rows) {
        return Ok(false);
    }
    let total: usize = rows.iter().sum();
    let what = "stacked fully connected";
    let x = part(work.x, fc.stacked_input_len(total), what)?;
    let mut first = 0;
    for (call, &r) in calls.iter_mut().zip(rows) {
        let src = node_operands(plan, call, i)?.1[0];
        fc.stack_input((first, r, total), src, x)?;
        first += r;
    }
    let n_out = fc.stacked_output_len(total);
    let out = part(work.out, n_out, what)?;
    let scratch = part(
        work.gemm,
        fc.stacked_scratch_len(total, pool.threads()),
        what,
    )?;
    fc.run_stacked(pool, total, x, out, scratch)?;
    let per_row = n_out / total.max(1);
    let mut first = 0;
    for (call, &r) in calls.iter_mut().zip(rows) {
        let dst = node_operands(plan, call, i)?.0;
        let src = &out[first * per_row..(first + r) * per_row];
        dst.get_mut(..src.len())
            .ok_or_else(|| crate::nodes::call::short("stacked fully connected output"))?
            .copy_from_slice(src);
        first += r;
    }
    Ok(true)
}

/// Runs batch matrix multiply node `i` once per batch over every session's row, when
/// every session's `b` is the same bytes (a constant of the graph, or a constant of the
/// program that the call passes in) and every session has the same shapes with one row
/// of `a` per batch; false (nothing done) otherwise.
fn run_stacked_bmm(
    plan: &Plan,
    pool: &ThreadPool,
    work: &mut StackedScratch<'_>,
    bmm: &BatchMatrixMultiply,
    calls: &mut Batch<Call<'_>>,
    i: usize,
) -> Result<bool, KernelError> {
    let (a, b) = bmm.operands();
    let y = plan.ops[i].output();
    let Some(first) = calls.get(0) else {
        return Ok(false);
    };
    let shapes0 = first.shapes;
    let Some((batches, k, n)) = bmm.stackable(shapes0) else {
        return Ok(false);
    };
    let same_shapes = calls
        .iter()
        .all(|c| (c.shapes[a], c.shapes[b], c.shapes[y]) == (shapes0[a], shapes0[b], shapes0[y]));
    if calls.len() < 2 || !same_shapes {
        return Ok(false);
    }
    let mut shared = None;
    for call in calls.iter_mut() {
        let w = node_operands(plan, call, i)?.1[1];
        let at = (w.as_ptr() as usize, w.len());
        if *shared.get_or_insert(at) != at {
            return Ok(false);
        }
    }
    let rows = calls.len();
    let what = "stacked batch matrix multiply";
    let too_short = || crate::nodes::call::short(what);
    let x = part(work.x, rows * k, what)?;
    let out = part(work.out, rows * n, what)?;
    let scratch = part(
        work.gemm,
        bmm.stacked_scratch_len(rows, n, k, pool.threads()),
        what,
    )?;
    for bi in 0..batches {
        let (ao, bo) = bmm.offsets(shapes0, bi);
        for (call, row) in calls.iter_mut().zip(x.chunks_exact_mut(k)) {
            let src = node_operands(plan, call, i)?.1[0];
            row.copy_from_slice(src.get(ao..ao + k).ok_or_else(too_short)?);
        }
        let first = calls.get_mut(0).ok_or_else(too_short)?;
        let w = node_operands(plan, first, i)?.1[1]
            .get(bo..)
            .ok_or_else(too_short)?;
        bmm.run_stacked(pool, (rows, n, k), x, w, out, scratch)?;
        for (call, row) in calls.iter_mut().zip(out.chunks_exact(n)) {
            let dst = node_operands(plan, call, i)?.0;
            dst.get_mut(bi * n..(bi + 1) * n)
                .ok_or_else(too_short)?
                .copy_from_slice(row);
        }
    }
    Ok(true)
}
