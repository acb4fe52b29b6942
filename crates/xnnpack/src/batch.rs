//! The delegate run for several sessions at once (`DelegateHandle::execute_batch`):
//! every session binds its own call (its arena, from its own scratch), the nodes run
//! in order, each for every session, and a `FullyConnected` node with weights packed
//! at init runs once over all sessions' rows, so its weights stream from memory once
//! per step rather than once per session. Each session gets the bits it gets alone
//! (see `FullyConnected::can_stack`).

use etch_kernels::{Args, Batch, Batched, KernelContext, KernelError, MAX_BATCH, unpaired};

use crate::exec::{Call, begin, finish, node_operands, run_node};
use crate::nodes::Node;
use crate::nodes::fully_connected::FullyConnected;
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
    let mut shared = Batched::PerSession;
    for (i, op) in plan.ops.iter().enumerate() {
        let stacked = match op {
            Node::FullyConnected(fc) => run_stacked(plan, ctx0, fc, &mut calls, i)?,
            _ => false,
        };
        if stacked {
            shared = Batched::Done;
        }
        if !stacked {
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

/// Runs fully connected node `i` once over every session's rows, when it can give each
/// session its own bits; false (nothing done) when it cannot. Scratch: `ctx`'s.
fn run_stacked(
    plan: &Plan,
    ctx: &KernelContext<'_>,
    fc: &FullyConnected,
    calls: &mut Batch<Call<'_>>,
    i: usize,
) -> Result<bool, KernelError> {
    let mut rows = [0usize; MAX_BATCH];
    for (r, call) in rows.iter_mut().zip(calls.iter()) {
        *r = fc.call_rows(call.shapes);
    }
    let rows = &rows[..calls.len()];
    if !fc.can_stack(rows) {
        return Ok(false);
    }
    let total: usize = rows.iter().sum();
    let pool = ctx.pool();
    let x = ctx.scratch_dirty::<f32>(fc.stacked_input_len(total))?;
    let mut first = 0;
    for (call, &r) in calls.iter_mut().zip(rows) {
        let src = node_operands(plan, call, i)?.1[0];
        fc.stack_input((first, r, total), src, x)?;
        first += r;
    }
    let n_out = fc.stacked_output_len(total);
    let out = ctx.scratch_dirty::<f32>(n_out)?;
    let scratch = ctx.scratch_dirty::<f32>(fc.stacked_scratch_len(total, pool.threads()))?;
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
