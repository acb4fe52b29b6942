//! The interpreter: binds the call's arguments, propagates shapes through every node,
//! then runs the nodes in order over one arena from the temp allocator (no heap
//! allocation per call).

use std::ops::Range;

use etch_format::ScalarType;
use etch_kernels::{Args, KernelContext, KernelError, Tensor, ThreadPool};

use crate::dims::{Dims, MAX_DIMS};
use crate::nodes::call::{MAX_INPUTS, NodeCall, Scratch};
use crate::nodes::{Node, NodeOp};
use crate::plan::{ALIGN_ELEMS, Loc, Plan};

fn short(what: &str) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {what}: operand too short"))
}

fn node_error(plan: &Plan, i: usize, reason: &str) -> KernelError {
    let kind = plan.kinds.get(i).map(|k| k.name()).unwrap_or("?");
    KernelError::invalid(format!("XNNPACK delegate node {i} ({kind}): {reason}"))
}

fn arena_range(
    plan: &Plan,
    offsets: &[usize],
    v: usize,
    shapes: &[Dims],
) -> Result<Range<usize>, KernelError> {
    let numel = arena_len_of(plan, v, shapes)?;
    let offset = offsets.get(v).copied().ok_or_else(|| short("value"))?;
    Ok(offset..offset + numel)
}

/// Arena elements value `v` occupies at `shapes`, checked against its bound.
fn arena_len_of(plan: &Plan, v: usize, shapes: &[Dims]) -> Result<usize, KernelError> {
    let numel = plan.values[v]
        .len(&shapes[v])
        .ok_or_else(|| short("shape overflow"))?;
    match plan.values[v].loc {
        Loc::Arena { capacity } if numel <= capacity => Ok(numel),
        Loc::Arena { capacity } => Err(KernelError::invalid(format!(
            "XNNPACK delegate: value {v} needs {numel} elements, more than its bound of {capacity}"
        ))),
        _ => Err(KernelError::invalid(format!(
            "XNNPACK delegate: value {v} has no run-time storage"
        ))),
    }
}

/// Places this call's arena values for their real shapes (first fit, in the plan's
/// order, values with overlapping lifetimes apart): `offsets[v]` for every placed value,
/// `by_offset` as working space; returns the arena length the call needs.
///
/// Planning once for the serialized upper bounds would leave a decode step's few
/// values spread over a prompt-sized arena; this costs O(values²) per call, with no
/// allocation.
fn place_values(
    plan: &Plan,
    shapes: &[Dims],
    offsets: &mut [usize],
    ends: &mut [usize],
    by_offset: &mut [usize],
) -> Result<usize, KernelError> {
    let mut placed = 0usize;
    let mut arena_len = 0usize;
    for &v in &plan.placement {
        let len = arena_len_of(plan, v, shapes)?.div_ceil(ALIGN_ELEMS) * ALIGN_ELEMS;
        let (start, end) = plan.lifetimes[v];
        let mut offset = 0usize;
        for &u in &by_offset[..placed] {
            let (us, ue) = plan.lifetimes[u];
            if us > end || start > ue {
                continue;
            }
            if offset + len <= offsets[u] {
                break;
            }
            offset = offset.max(ends[u]);
        }
        // Keep `by_offset` sorted by offset: insert after every value at or below it.
        let at = by_offset[..placed]
            .iter()
            .position(|&u| offsets[u] > offset)
            .unwrap_or(placed);
        by_offset.copy_within(at..placed, at + 1);
        by_offset[at] = v;
        placed += 1;
        offsets[v] = offset;
        ends[v] = offset + len;
        arena_len = arena_len.max(offset + len);
    }
    Ok(arena_len)
}

/// The call's external inputs that nodes read in place (the caller's tensors, not a
/// copy in the arena), and the external outputs that the nodes computing them write in
/// place: at most [`Direct::MAX`] of each; the others go through the arena.
struct Direct<'a> {
    inputs: [(usize, &'a [f32]); Direct::MAX],
    n_inputs: usize,
    outputs: [(usize, &'a mut [f32]); Direct::MAX],
    n_outputs: usize,
}

impl<'a> Direct<'a> {
    const MAX: usize = 8;

    fn new() -> Self {
        Direct {
            inputs: [(usize::MAX, &[]); Direct::MAX],
            n_inputs: 0,
            outputs: std::array::from_fn(|_| (usize::MAX, &mut [][..])),
            n_outputs: 0,
        }
    }

    /// Reads value `v` from `x` from now on; false (nothing kept) when full.
    fn add_input(&mut self, v: usize, x: &'a [f32]) -> bool {
        let Some(slot) = self.inputs.get_mut(self.n_inputs) else {
            return false;
        };
        *slot = (v, x);
        self.n_inputs += 1;
        true
    }

    /// Has the node computing value `v` write `y`; false (nothing kept) when full.
    fn add_output(&mut self, v: usize, y: &'a mut [f32]) -> bool {
        let Some(slot) = self.outputs.get_mut(self.n_outputs) else {
            return false;
        };
        *slot = (v, y);
        self.n_outputs += 1;
        true
    }

    /// True when no further output can be written in place.
    fn outputs_full(&self) -> bool {
        self.n_outputs == Direct::MAX
    }

    fn input(&self, v: usize) -> Option<&'a [f32]> {
        self.inputs[..self.n_inputs]
            .iter()
            .find(|(u, _)| *u == v)
            .map(|(_, x)| *x)
    }

    fn output(&mut self, v: usize) -> Option<&mut [f32]> {
        self.outputs[..self.n_outputs]
            .iter_mut()
            .find(|(u, _)| *u == v)
            .map(|(_, y)| &mut **y)
    }

    fn has_output(&self, v: usize) -> bool {
        self.outputs[..self.n_outputs].iter().any(|(u, _)| *u == v)
    }
}

/// The output slice and input slices of `op`.
fn operands<'s>(
    plan: &'s Plan,
    offsets: &[usize],
    arena: &'s mut [f32],
    shapes: &[Dims],
    op: &Node,
    direct: &Direct<'s>,
) -> Result<(&'s mut [f32], [&'s [f32]; MAX_INPUTS]), KernelError> {
    let yr = arena_range(plan, offsets, op.output(), shapes)?;
    if yr.end > arena.len() {
        return Err(short("arena"));
    }
    let (left, rest) = arena.split_at_mut(yr.start);
    let (out, right) = rest.split_at_mut(yr.len());
    let (left, right): (&[f32], &[f32]) = (left, right);
    let mut ins: [&[f32]; MAX_INPUTS] = [&[]; MAX_INPUTS];
    for (slot, &v) in ins.iter_mut().zip(op.inputs().as_slice()) {
        // Elements for f32 values, words for int8 ones.
        let numel = plan.values[v]
            .len(&shapes[v])
            .ok_or_else(|| short("shape overflow"))?;
        *slot = match plan.values[v].loc {
            Loc::Constant => plan.constants[v]
                .as_deref()
                .and_then(|c| c.get(..numel))
                .ok_or_else(|| short("constant"))?,
            Loc::PackedOnly => return Err(short("packed-only constant read as a value")),
            Loc::Arena { .. } if let Some(x) = direct.input(v) => {
                x.get(..numel).ok_or_else(|| short("input"))?
            }
            Loc::Arena { .. } => {
                let r = arena_range(plan, offsets, v, shapes)?;
                if r.is_empty() {
                    &[]
                } else if r.end <= yr.start {
                    &left[r]
                } else if r.start >= yr.end {
                    right
                        .get(r.start - yr.end..r.end - yr.end)
                        .ok_or_else(|| short("arena"))?
                } else {
                    return Err(KernelError::invalid(
                        "XNNPACK delegate: an input overlaps the output (memory plan)",
                    ));
                }
            }
        };
    }
    Ok((out, ins))
}

/// The sizes (in dim order: logical) of an output tensor that holds value dims `d`,
/// which are physical (the tensor's dim order), as `XNNExecutor::resize_outputs`.
fn physical_sizes(t: &etch_kernels::Tensor, d: &Dims) -> [usize; MAX_DIMS] {
    let mut sizes = [0usize; MAX_DIMS];
    for (j, &o) in t.dim_order().iter().enumerate() {
        sizes[o as usize] = d.get(j);
    }
    sizes
}

/// Errs unless the call's `role` ("input" or "output") argument `arg`, of rank `found`,
/// has the rank `graph` of the graph's value.
fn check_rank(role: &str, arg: usize, found: usize, graph: usize) -> Result<(), KernelError> {
    if found == graph {
        return Ok(());
    }
    Err(KernelError::invalid(format!(
        "XNNPACK delegate: {role} argument {arg} has rank {found}, the graph's value {graph}"
    )))
}

/// Writes the dims of the external inputs into `shapes`: the physical dims, in the
/// tensor's dim order (as `XNNExecutor::prepare_args`); a scalar keeps its serialized
/// `[1]`.
fn set_input_dims(
    plan: &Plan,
    args: &mut Args<'_>,
    shapes: &mut [Dims],
) -> Result<(), KernelError> {
    for &(v, arg) in &plan.inputs {
        let t = args.tensor(arg)?;
        let expected = if plan.values[v].int8 {
            ScalarType::Char
        } else if plan.values[v].half {
            ScalarType::Half
        } else {
            ScalarType::Float
        };
        if t.dtype() != expected {
            return Err(KernelError::invalid(format!(
                "XNNPACK delegate: input argument {arg} is {}, the graph's value {v} is {expected}",
                t.dtype()
            )));
        }
        let serialized = plan.values[v].dims;
        if t.rank() == 0 && serialized.as_slice() == [1] {
            shapes[v] = serialized;
            continue;
        }
        check_rank("input", arg, t.rank(), serialized.rank())?;
        let mut d = [0usize; MAX_DIMS];
        for (j, &o) in t.dim_order().iter().enumerate() {
            d[j] = t.sizes()[o as usize];
        }
        shapes[v] = Dims::new(&d[..t.rank()]).ok_or_else(|| short("rank"))?;
    }
    Ok(())
}

/// One call's working state between its steps: every value's dims and arena offset,
/// the arena, the nodes' scratch, and the call's own tensors that nodes read and write
/// in place.
pub(crate) struct Call<'a> {
    pub(crate) shapes: &'a [Dims],
    offsets: &'a [usize],
    arena: &'a mut [f32],
    scratch: &'a mut [f32],
    im2col_len: usize,
    direct: Direct<'a>,
}

/// Runs the plan on one call.
pub fn execute(
    plan: &Plan,
    ctx: &KernelContext<'_>,
    args: &mut Args<'_>,
) -> Result<(), KernelError> {
    let mut call = begin(plan, ctx, args)?;
    match ctx.profiler() {
        None => {
            for i in 0..plan.ops.len() {
                run_node(plan, ctx.pool(), &mut call, i)?;
            }
        }
        Some(profiler) => {
            for i in 0..plan.ops.len() {
                let started = std::time::Instant::now();
                run_node(plan, ctx.pool(), &mut call, i)?;
                let name = plan.profile_names.get(i).map_or("?", String::as_str);
                profiler.record(name, started.elapsed().as_nanos() as u64);
            }
        }
    }
    finish(plan, ctx, args, &call)
}

/// Binds the call's arguments: checks them, sets the input dims, infers every value's
/// dims (or restores those of the last call with the same input dims), places the
/// arena, and brings the inputs in. Everything comes from `ctx`'s scratch.
pub(crate) fn begin<'a>(
    plan: &Plan,
    ctx: &'a KernelContext<'_>,
    args: &mut Args<'_>,
) -> Result<Call<'a>, KernelError> {
    if args.len() < plan.num_args {
        return Err(KernelError::ArgCount {
            expected: plan.num_args,
            got: args.len(),
        });
    }
    // The shapes of every value and the arena placed for them: those of the last call
    // when its input dims were the same (each decode step of an LLM), else inferred.
    let n = plan.values.len();
    let threads = ctx.pool().threads();
    let shapes = ctx.scratch::<Dims>(n)?;
    set_input_dims(plan, args, shapes)?;
    let offsets = ctx.scratch::<usize>(n)?;
    let (arena_len, gemm_len) =
        match plan
            .call_cache
            .restore(&plan.inputs, threads, shapes, offsets)
        {
            Some(lens) => lens,
            None => {
                for (s, v) in shapes.iter_mut().zip(&plan.values) {
                    *s = v.dims;
                }
                set_input_dims(plan, args, shapes)?;
                for (i, op) in plan.ops.iter().enumerate() {
                    op.infer_shape(shapes).map_err(|r| node_error(plan, i, r))?;
                    arena_len_of(plan, op.output(), shapes)
                        .map_err(|e| node_error(plan, i, &e.to_string()))?;
                }
                let ends = ctx.scratch::<usize>(n)?;
                let by_offset = ctx.scratch::<usize>(plan.placement.len())?;
                let lens = (
                    place_values(plan, shapes, offsets, ends, by_offset)?,
                    gemm_scratch_len(plan, shapes, threads),
                );
                plan.call_cache
                    .store(&plan.inputs, threads, shapes, offsets, lens);
                lens
            }
        };
    let shapes: &[Dims] = shapes;
    let offsets: &[usize] = offsets;
    // Dirty scratch (not cleared): every node writes all of its output before a later
    // node reads it, and the im2col and GEMM buffers are written before they are read
    // (debug builds hand out NaN-filled scratch, so the tests would show a node that
    // does not).
    let arena = ctx.scratch_dirty::<f32>(arena_len)?;
    let im2col_len = plan.im2col_len(threads);
    let scratch = ctx.scratch_dirty::<f32>(im2col_len + gemm_len)?;
    let mut direct = Direct::new();
    for &(v, arg) in &plan.inputs {
        let t = args.tensor(arg)?;
        if plan.values[v].int8 {
            // A qint8 value at the boundary (another delegate's output, a quantized
            // constant the program passes in): its bytes, four to an arena word.
            let src = ctx.read::<i8>(&t)?;
            let r = arena_range(plan, offsets, v, shapes)?;
            let words = arena.get_mut(r).ok_or_else(|| short("arena"))?;
            let bytes: &mut [i8] = bytemuck::cast_slice_mut(words);
            let n = shapes[v].numel().unwrap_or(0);
            let (dst, src) = bytes
                .get_mut(..n)
                .zip(src.get(..n))
                .ok_or_else(|| short("input"))?;
            dst.copy_from_slice(src);
            continue;
        }
        if plan.values[v].half {
            let src = ctx.read::<half::f16>(&t)?;
            let r = arena_range(plan, offsets, v, shapes)?;
            let dst = arena.get_mut(r).ok_or_else(|| short("arena"))?;
            let src = src.get(..dst.len()).ok_or_else(|| short("input"))?;
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s.to_f32();
            }
            continue;
        }
        let src = ctx.read::<f32>(&t)?;
        let r = arena_range(plan, offsets, v, shapes)?;
        let n = r.len();
        let src = src.get(..n).ok_or_else(|| short("input"))?;
        if !direct.add_input(v, src) {
            arena
                .get_mut(r)
                .ok_or_else(|| short("arena"))?
                .copy_from_slice(src);
        }
    }
    for (&(v, arg), &in_place) in plan.outputs.iter().zip(&plan.outputs_in_place) {
        let d = shapes[v];
        let t = args.tensor(arg)?;
        // Past the in-place slots, the output goes through the arena and `finish`
        // (borrowing it here as well would hold it twice).
        if !in_place || t.rank() == 0 || direct.outputs_full() {
            continue;
        }
        check_rank("output", arg, t.rank(), d.rank())?;
        let t = args.resize_tensor(arg, &physical_sizes(&t, &d)[..d.rank()])?;
        let numel = arena_range(plan, offsets, v, shapes)?.len();
        let dst = ctx.write::<f32>(&t)?;
        let dst = dst.get_mut(..numel).ok_or_else(|| short("output"))?;
        direct.add_output(v, dst);
    }
    Ok(Call {
        shapes,
        offsets,
        arena,
        scratch,
        im2col_len,
        direct,
    })
}

/// Runs node `i` of the plan on the call.
pub(crate) fn run_node(
    plan: &Plan,
    pool: &ThreadPool,
    call: &mut Call<'_>,
    i: usize,
) -> Result<(), KernelError> {
    let shapes = call.shapes;
    if shapes[plan.ops[i].output()].numel() == Some(0) {
        return Ok(());
    }
    let im2col_len = call.im2col_len;
    // The scratch is not among the operands: take it out of the call while they live.
    let scratch = std::mem::take(&mut call.scratch);
    let (out, ins) = node_operands(plan, call, i)?;
    let node = NodeCall {
        pool,
        shapes,
        inputs: ins,
        output: out,
        scratch: Scratch::new(&mut *scratch, im2col_len),
    };
    let result = plan.ops[i].run(node);
    call.scratch = scratch;
    result.map_err(|e| node_error(plan, i, &e.to_string()))?;
    store_output(plan, call, i)
}

/// Stores what node `i` wrote as its value's type: an fp16 value is rounded to half
/// precision (nothing to do for the others).
pub(crate) fn store_output(plan: &Plan, call: &mut Call<'_>, i: usize) -> Result<(), KernelError> {
    if plan.values[plan.ops[i].output()].half {
        let (out, _) = node_operands(plan, call, i)?;
        round_to_half(out);
    }
    Ok(())
}

/// The output slice and input slices of node `i` in the call: the output in the
/// arena or, where the node writes one of the call's outputs in place, that tensor.
pub(crate) fn node_operands<'c>(
    plan: &'c Plan,
    call: &'c mut Call<'_>,
    i: usize,
) -> Result<(&'c mut [f32], [&'c [f32]; MAX_INPUTS]), KernelError> {
    let op = &plan.ops[i];
    let (out, ins) = operands(
        plan,
        call.offsets,
        call.arena,
        call.shapes,
        op,
        &call.direct,
    )?;
    let out = match call.direct.output(op.output()) {
        Some(y) => y,
        None => out,
    };
    Ok((out, ins))
}

/// Writes the call's outputs (those the nodes did not write in place) and their sizes.
pub(crate) fn finish(
    plan: &Plan,
    ctx: &KernelContext<'_>,
    args: &mut Args<'_>,
    call: &Call<'_>,
) -> Result<(), KernelError> {
    let (shapes, offsets, arena) = (call.shapes, call.offsets, &*call.arena);
    for &(v, arg) in &plan.outputs {
        if call.direct.has_output(v) {
            continue;
        }
        let d = shapes[v];
        let t = args.tensor(arg)?;
        if plan.values[v].int8 {
            finish_int8(plan, ctx, args, call, v, arg)?;
            continue;
        }
        if plan.values[v].half {
            finish_half(plan, ctx, args, call, v, arg)?;
            continue;
        }
        if t.rank() == 0 && d.numel() == Some(1) {
            let dst = ctx.write::<f32>(&t)?;
            let r = arena_range(plan, offsets, v, shapes)?;
            let src = arena.get(r).ok_or_else(|| short("arena"))?;
            dst.get_mut(..1)
                .zip(src.first())
                .map(|(d, s)| d[0] = *s)
                .ok_or_else(|| short("output"))?;
            continue;
        }
        check_rank("output", arg, t.rank(), d.rank())?;
        let t = args.resize_tensor(arg, &physical_sizes(&t, &d)[..d.rank()])?;
        let dst = ctx.write::<f32>(&t)?;
        let r = arena_range(plan, offsets, v, shapes)?;
        let src = arena.get(r).ok_or_else(|| short("arena"))?;
        dst.get_mut(..src.len())
            .ok_or_else(|| short("output"))?
            .copy_from_slice(src);
    }
    Ok(())
}

/// The call's output tensor `arg` resized to value `v`'s dims (a 0-d tensor holding a
/// one-element value stays as it is).
fn resized_output(
    args: &mut Args<'_>,
    call: &Call<'_>,
    v: usize,
    arg: usize,
) -> Result<Tensor, KernelError> {
    let d = call.shapes[v];
    let t = args.tensor(arg)?;
    if t.rank() == 0 && d.numel() == Some(1) {
        return Ok(t);
    }
    check_rank("output", arg, t.rank(), d.rank())?;
    args.resize_tensor(arg, &physical_sizes(&t, &d)[..d.rank()])
}

/// Writes the qint8 output value `v` to the call's int8 tensor `arg`.
fn finish_int8(
    plan: &Plan,
    ctx: &KernelContext<'_>,
    args: &mut Args<'_>,
    call: &Call<'_>,
    v: usize,
    arg: usize,
) -> Result<(), KernelError> {
    let d = call.shapes[v];
    let t = resized_output(args, call, v, arg)?;
    let dst = ctx.write::<i8>(&t)?;
    let r = arena_range(plan, call.offsets, v, call.shapes)?;
    let words = call.arena.get(r).ok_or_else(|| short("arena"))?;
    let bytes: &[i8] = bytemuck::cast_slice(words);
    let n = d.numel().unwrap_or(0);
    let (dst, src) = dst
        .get_mut(..n)
        .zip(bytes.get(..n))
        .ok_or_else(|| short("output"))?;
    dst.copy_from_slice(src);
    Ok(())
}

/// Writes the fp16 output value `v` (held as fp32) to the call's half tensor `arg`.
fn finish_half(
    plan: &Plan,
    ctx: &KernelContext<'_>,
    args: &mut Args<'_>,
    call: &Call<'_>,
    v: usize,
    arg: usize,
) -> Result<(), KernelError> {
    let t = resized_output(args, call, v, arg)?;
    let dst = ctx.write::<half::f16>(&t)?;
    let r = arena_range(plan, call.offsets, v, call.shapes)?;
    let src = call.arena.get(r).ok_or_else(|| short("arena"))?;
    let dst = dst.get_mut(..src.len()).ok_or_else(|| short("output"))?;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(s);
    }
    Ok(())
}

/// Rounds every value of `x` to the nearest half-precision number.
fn round_to_half(x: &mut [f32]) {
    for v in x {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

/// GEMM scratch the nodes need at the current shapes: the largest of them (they run one
/// at a time).
fn gemm_scratch_len(plan: &Plan, shapes: &[Dims], threads: usize) -> usize {
    plan.ops
        .iter()
        .map(|op| op.gemm_scratch_len(shapes, threads))
        .max()
        .unwrap_or(0)
}
