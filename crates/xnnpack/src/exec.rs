//! The interpreter: binds the call's arguments, propagates shapes through every node,
//! then runs the nodes in order over one arena from the temp allocator (no heap
//! allocation per call).

use std::ops::Range;

use etch_format::ScalarType;
use etch_kernels::{Args, KernelContext, KernelError, ThreadPool};
use etch_linalg::conv::{self, ConvGeometry};
use etch_linalg::{GemmF32, RhsF32, gemm_f32, pool};
use rayon::prelude::*;

use crate::dims::{Dims, MAX_DIMS};
use crate::nodes::NodeOp;
use crate::nodes::call::{NodeCall, Scratch};
use crate::plan::{ALIGN_ELEMS, ConvKind, ConvOp, Loc, Op, Plan, PoolOp};
use crate::qs8;
use crate::shape;

/// Output pixels one im2col block of an fp32 convolution holds: rows enough for the
/// GEMM's tiles on every thread, few enough for the block to stay in cache.
pub const CONV_BLOCK_PIXELS: usize = 256;

/// Output pixels one im2col block of an int8 convolution holds (per thread).
pub const IM2COL_BLOCK: usize = 64;

fn short(what: &str) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {what}: operand too short"))
}

fn node_error(plan: &Plan, i: usize, reason: &str) -> KernelError {
    let kind = plan.kinds.get(i).map(|k| k.name()).unwrap_or("?");
    KernelError::invalid(format!("XNNPACK delegate node {i} ({kind}): {reason}"))
}

/// Runs `f` on each image of a batch of `batch`: the consecutive blocks of `in_len`
/// elements of `x` and of `out_len` elements of `out` (`what` names the node in the
/// error when either is short).
fn per_image<T, U>(
    what: &str,
    batch: usize,
    (x, in_len): (&[T], usize),
    (out, out_len): (&mut [U], usize),
    mut f: impl FnMut(&[T], &mut [U]) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    for b in 0..batch {
        let src = x
            .get(b * in_len..(b + 1) * in_len)
            .ok_or_else(|| short(what))?;
        let dst = out
            .get_mut(b * out_len..(b + 1) * out_len)
            .ok_or_else(|| short(what))?;
        f(src, dst)?;
    }
    Ok(())
}

/// `Ok` when a linalg kernel that reports success as a `bool` succeeded.
fn checked(ok: bool, what: &str) -> Result<(), KernelError> {
    if ok { Ok(()) } else { Err(short(what)) }
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
    op: &Op,
    direct: &Direct<'s>,
) -> Result<(&'s mut [f32], [&'s [f32]; 5]), KernelError> {
    let yr = arena_range(plan, offsets, op.output(), shapes)?;
    if yr.end > arena.len() {
        return Err(short("arena"));
    }
    let (left, rest) = arena.split_at_mut(yr.start);
    let (out, right) = rest.split_at_mut(yr.len());
    let (left, right): (&[f32], &[f32]) = (left, right);
    let mut ins: [&[f32]; 5] = [&[]; 5];
    let (vs, n) = op.inputs();
    for (slot, &v) in ins.iter_mut().zip(&vs[..n]) {
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
        if t.dtype() != ScalarType::Float {
            return Err(KernelError::DtypeMismatch {
                expected: ScalarType::Float,
                found: t.dtype(),
            });
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

/// Runs the plan on one call.
pub fn execute(
    plan: &Plan,
    ctx: &KernelContext<'_>,
    args: &mut Args<'_>,
) -> Result<(), KernelError> {
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
                    shape::infer(op, shapes).map_err(|r| node_error(plan, i, r))?;
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
        if !in_place || t.rank() == 0 {
            continue;
        }
        check_rank("output", arg, t.rank(), d.rank())?;
        let t = args.resize_tensor(arg, &physical_sizes(&t, &d)[..d.rank()])?;
        let numel = arena_range(plan, offsets, v, shapes)?.len();
        let dst = ctx.write::<f32>(&t)?;
        let dst = dst.get_mut(..numel).ok_or_else(|| short("output"))?;
        direct.add_output(v, dst);
    }
    for (i, op) in plan.ops.iter().enumerate() {
        if shapes[op.output()].numel() == Some(0) {
            continue;
        }
        let (out, ins) = operands(plan, offsets, arena, shapes, op, &direct)?;
        let out = match direct.output(op.output()) {
            Some(y) => y,
            None => out,
        };
        let scratch = Scratch::new(&mut *scratch, im2col_len);
        run_op(op, ctx.pool(), shapes, out, &ins, scratch)
            .map_err(|e| node_error(plan, i, &e.to_string()))?;
    }
    for &(v, arg) in &plan.outputs {
        if direct.has_output(v) {
            continue;
        }
        let d = shapes[v];
        let t = args.tensor(arg)?;
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

#[allow(clippy::too_many_arguments)]
fn run_op(
    op: &Op,
    pool: &ThreadPool,
    shapes: &[Dims],
    out: &mut [f32],
    ins: &[&[f32]; 5],
    scratch: Scratch<'_>,
) -> Result<(), KernelError> {
    if let Op::Node(n) = op {
        let call = NodeCall {
            pool,
            shapes,
            inputs: *ins,
            output: out,
            scratch,
        };
        return n.run(call);
    }
    let mut scratch = scratch;
    let (col, gemm) = scratch.parts();
    let x = ins[0];
    match op {
        Op::Node(_) => {}
        Op::Conv(c) if c.q.is_some() => {
            let (xd, yd) = (&shapes[c.x], &shapes[c.y]);
            let g = geometry(c, xd, yd);
            let q = c.q.as_deref().ok_or_else(|| short("convolution"))?;
            let in_img = g.in_h * g.in_w * g.in_channels();
            let out_img = g.out_pixels() * g.out_channels();
            let depthwise = c.kind == ConvKind::Depthwise;
            per_image(
                "convolution",
                xd.get(0),
                (bytes(x), in_img),
                (bytes_mut(out), out_img),
                |s, d| qs8::convolution(&g, q, depthwise, pool, s, d, col),
            )?
        }
        Op::Pool(p) if p.q.is_some() => {
            let (min, max) = p.q.unwrap_or((i8::MIN, i8::MAX));
            let g = pool_geometry(p, &shapes[p.x], &shapes[p.y]);
            let in_img = g.in_h * g.in_w * g.channels;
            let out_img = g.out_h * g.out_w * g.channels;
            per_image(
                "pooling",
                shapes[p.x].get(0),
                (bytes(x), in_img),
                (bytes_mut(out), out_img),
                |s, d| qs8::max_pool(&g, s, min, max, d),
            )?
        }
        Op::GlobalAvgPool {
            x: xv, q: Some(q), ..
        } => {
            let d = shapes[*xv];
            let r = d.rank();
            let (h, w, c) = (d.get(r - 3), d.get(r - 2), d.get(r - 1));
            qs8::mean(q, d.product(0..r - 3), h * w, c, x, out)?
        }
        Op::Conv(c) => convolution(c, pool, &shapes[c.x], &shapes[c.y], x, out, col, gemm)?,
        Op::Pool(p) => pooling(p, &shapes[p.x], &shapes[p.y], x, out)?,
        Op::GlobalAvgPool {
            x: xv, min, max, ..
        } => {
            let d = shapes[*xv];
            let r = d.rank();
            let (h, w, c) = (d.get(r - 3), d.get(r - 2), d.get(r - 1));
            per_image(
                "global average pooling",
                d.product(0..r - 3),
                (x, h * w * c),
                (out, c),
                |src, dst| {
                    let ok = pool::global_avg_pool_nhwc(h * w, c, src, *min, *max, dst);
                    checked(ok, "global average pooling")
                },
            )?
        }
    }
    Ok(())
}

/// Scratch the fully-connected nodes need at the current shapes: the largest of them
/// (they run one at a time).
fn gemm_scratch_len(plan: &Plan, shapes: &[Dims], threads: usize) -> usize {
    plan.ops
        .iter()
        .filter_map(|op| match op {
            Op::Node(n) => Some(n.gemm_scratch_len(shapes, threads)),
            Op::Conv(c) if c.kind == ConvKind::Conv && c.q.is_none() => {
                let g = geometry(c, &shapes[c.x], &shapes[c.y]);
                Some(threads.max(1) * conv_gemm_scratch_len(&g, c))
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

fn geometry(c: &ConvOp, xd: &Dims, yd: &Dims) -> ConvGeometry {
    let w = &c.window;
    ConvGeometry {
        in_h: xd.get(1),
        in_w: xd.get(2),
        out_h: yd.get(1),
        out_w: yd.get(2),
        kernel_h: w.kernel_h,
        kernel_w: w.kernel_w,
        stride_h: w.stride_h,
        stride_w: w.stride_w,
        dilation_h: w.dilation_h,
        dilation_w: w.dilation_w,
        pad_top: w.pad_top,
        pad_left: w.pad_left,
        groups: w.groups,
        group_in: w.group_in,
        group_out: w.group_out,
    }
}

#[allow(clippy::too_many_arguments)]
fn convolution(
    c: &ConvOp,
    pool: &ThreadPool,
    xd: &Dims,
    yd: &Dims,
    x: &[f32],
    out: &mut [f32],
    col: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), KernelError> {
    let g = geometry(c, xd, yd);
    let in_img = g.in_h * g.in_w * g.in_channels();
    let out_img = g.out_pixels() * g.out_channels();
    per_image(
        "convolution",
        xd.get(0),
        (x, in_img),
        (out, out_img),
        |src, dst| {
            let ok = match c.kind {
                ConvKind::Conv => {
                    conv_gemm(&g, pool, src, c, dst, col, scratch)?;
                    true
                }
                ConvKind::Depthwise => {
                    let row = g.out_w * g.out_channels();
                    let rows = g.out_h.div_ceil(pool.threads()).max(1);
                    let ok = std::sync::atomic::AtomicBool::new(true);
                    pool.for_each_chunk_mut(dst, rows * row.max(1), 1, |i, chunk| {
                        let r0 = i * rows;
                        let r1 = (r0 + chunk.len() / row.max(1)).min(g.out_h);
                        if !conv::depthwise_conv2d_nhwc(
                            etch_linalg::dispatch().gemm,
                            &g,
                            src,
                            &c.filter,
                            &c.bias,
                            c.min,
                            c.max,
                            r0..r1,
                            chunk,
                        ) {
                            ok.store(false, std::sync::atomic::Ordering::Relaxed);
                        }
                    });
                    ok.into_inner()
                }
                ConvKind::Transposed => {
                    conv::conv_transpose2d_nhwc(&g, src, &c.filter, &c.bias, c.min, c.max, dst)
                }
            };
            checked(ok, "convolution")
        },
    )
}

/// An fp32 convolution as GEMMs against the filter packed at init. Each thread of the
/// pool takes one share of the output pixels and walks it in blocks of
/// [`CONV_BLOCK_PIXELS`]: a pointwise convolution multiplies the image rows themselves,
/// the others an im2col block per group, with that thread's own `col` and GEMM scratch
/// (one hand-off per convolution, not one per block).
fn conv_gemm(
    g: &ConvGeometry,
    pool: &ThreadPool,
    src: &[f32],
    c: &ConvOp,
    dst: &mut [f32],
    col: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), KernelError> {
    let (co, pixels) = (g.out_channels(), g.out_pixels());
    if c.packed.len() != g.groups || c.bias.len() < co || dst.len() < pixels * co {
        return Err(short("convolution"));
    }
    let threads = pool.threads().max(1);
    let per_task = pixels.div_ceil(threads).max(1);
    let tasks = pixels.div_ceil(per_task);
    let (col_len, gemm_len) = (conv_col_len(g), conv_gemm_scratch_len(g, c));
    if col.len() < tasks * col_len || scratch.len() < tasks * gemm_len {
        return Err(short("convolution scratch"));
    }
    let dst = &mut dst[..pixels * co];
    let task = |t: usize, out: &mut [f32], col: &mut [f32], scratch: &mut [f32]| {
        let first = t * per_task;
        conv_pixels(
            g,
            c,
            src,
            first..first + out.len() / co.max(1),
            out,
            col,
            scratch,
        )
    };
    if tasks == 1 {
        return task(0, dst, col, scratch);
    }
    pool.install(|| {
        dst.par_chunks_mut(per_task * co)
            .zip(col.par_chunks_mut(col_len.max(1)))
            .zip(scratch.par_chunks_mut(gemm_len.max(1)))
            .enumerate()
            .try_for_each(|(t, ((out, col), scratch))| task(t, out, col, scratch))
    })
}

/// Output pixels `pixels` of one image into `out` (their rows only), on this thread.
fn conv_pixels(
    g: &ConvGeometry,
    c: &ConvOp,
    src: &[f32],
    pixels: Range<usize>,
    out: &mut [f32],
    col: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), KernelError> {
    let serial = ThreadPool::serial();
    let (co, go, patch) = (g.out_channels(), g.group_out, g.patch_len());
    let clamp = clamp_of(c.min, c.max);
    let pointwise = g.is_pointwise();
    let mut p0 = pixels.start;
    while p0 < pixels.end {
        let nb = CONV_BLOCK_PIXELS.min(pixels.end - p0);
        let rows = &mut out[(p0 - pixels.start) * co..][..nb * co];
        for (grp, packed) in c.packed.iter().enumerate() {
            let (cols, grouped) = col
                .split_at_mut_checked(if pointwise { 0 } else { nb * patch })
                .ok_or_else(|| short("convolution im2col"))?;
            let a: &[f32] = if pointwise {
                src.get(p0 * patch..(p0 + nb) * patch)
                    .ok_or_else(|| short("convolution input"))?
            } else {
                if !conv::im2col_nhwc(g, src, grp, p0..p0 + nb, cols) {
                    return Err(short("convolution im2col"));
                }
                cols
            };
            let p = GemmF32 {
                m: nb,
                n: go,
                k: patch,
                a,
                lda: patch,
                b: RhsF32::Packed(packed),
                bias: Some(&c.bias[grp * go..(grp + 1) * go]),
                clamp,
            };
            if g.groups == 1 {
                gemm_f32(&serial, &p, rows, scratch)?;
            } else {
                let block = grouped
                    .get_mut(..nb * go)
                    .ok_or_else(|| short("convolution group block"))?;
                gemm_f32(&serial, &p, block, scratch)?;
                for (r, row) in block.chunks_exact(go.max(1)).enumerate() {
                    rows[r * co + grp * go..][..go].copy_from_slice(row);
                }
            }
        }
        p0 += nb;
    }
    Ok(())
}

/// `col` elements one thread of an fp32 convolution needs: an im2col block (none when
/// pointwise) and, with several groups, a block of one group's outputs.
fn conv_col_len(g: &ConvGeometry) -> usize {
    let patch = if g.is_pointwise() { 0 } else { g.patch_len() };
    let grouped = if g.groups > 1 { g.group_out } else { 0 };
    CONV_BLOCK_PIXELS * (patch + grouped)
}

/// GEMM scratch one thread of an fp32 convolution needs.
fn conv_gemm_scratch_len(g: &ConvGeometry, c: &ConvOp) -> usize {
    let Some(packed) = c.packed.first() else {
        return 0;
    };
    GemmF32 {
        m: CONV_BLOCK_PIXELS.min(g.out_pixels()),
        n: g.group_out,
        k: g.patch_len(),
        a: &[],
        lda: g.patch_len(),
        b: RhsF32::Packed(packed),
        bias: None,
        clamp: None,
    }
    .scratch_len(1)
}

/// XNNPACK's `output_min/max` as a GEMM clamp (`None` when it clamps nothing).
fn clamp_of(min: f32, max: f32) -> Option<(f32, f32)> {
    (min > f32::NEG_INFINITY || max < f32::INFINITY).then_some((min, max))
}

fn bytes(words: &[f32]) -> &[i8] {
    bytemuck::cast_slice(words)
}

fn bytes_mut(words: &mut [f32]) -> &mut [i8] {
    bytemuck::cast_slice_mut(words)
}

fn pool_geometry(p: &PoolOp, xd: &Dims, yd: &Dims) -> pool::PoolGeometry {
    let w = &p.window;
    pool::PoolGeometry {
        in_h: xd.get(1),
        in_w: xd.get(2),
        channels: xd.get(3),
        out_h: yd.get(1),
        out_w: yd.get(2),
        kernel_h: w.kernel_h,
        kernel_w: w.kernel_w,
        stride_h: w.stride_h,
        stride_w: w.stride_w,
        dilation_h: w.dilation_h,
        dilation_w: w.dilation_w,
        pad_top: w.pad_top,
        pad_left: w.pad_left,
    }
}

fn pooling(
    p: &PoolOp,
    xd: &Dims,
    yd: &Dims,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let g = pool_geometry(p, xd, yd);
    let in_img = g.in_h * g.in_w * g.channels;
    let out_img = g.out_h * g.out_w * g.channels;
    per_image(
        "pooling",
        xd.get(0),
        (x, in_img),
        (out, out_img),
        |src, dst| {
            let ok = if p.max_pool {
                pool::max_pool2d_nhwc(&g, src, p.min, p.max, dst)
            } else {
                pool::avg_pool2d_nhwc(&g, src, p.min, p.max, dst)
            };
            checked(ok, "pooling")
        },
    )
}
