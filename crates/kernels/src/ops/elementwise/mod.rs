//! The elementwise engine shared by the binary, comparison, unary and conversion
//! kernels, and the dtype machinery they (and the reductions) share.
//!
//! An op is computed as ExecuTorch's portable kernels do: inputs are loaded into a
//! compute type `C` (f32 for f32/f16/bf16, f64, or i64 for integers and bool), rounded
//! through the op's common dtype when they differ from it, combined block by block
//! (stack buffers of [`BLOCK`] elements, no heap), rounded through the common dtype
//! again and cast to the out tensor's dtype on store. Operands already of type `C`
//! with unit stride are read in place and a matching out tensor is written in place,
//! so the f32 paths are plain contiguous loops the compiler vectorises. Large outputs
//! are split across the pool in contiguous chunks.

pub mod args_form;
pub mod broadcast;
pub mod dtype;
pub mod num;
pub mod promote;
#[cfg(test)]
pub mod testutil;

use etch_base::ScalarType;

use self::broadcast::Plan;
use self::dtype::{Element, In, Out, narrow_slice, narrows};
use crate::{GRAIN_SIZE, KernelContext, KernelError, MAX_RANK, Scalar, Tensor};

/// Elements per block of the engine's stack buffers.
pub const BLOCK: usize = 512;

/// An elementwise operand: a tensor or a Python number.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Operand {
    Tensor(Tensor),
    Scalar(Scalar),
}

impl Operand {
    /// The shape (`[]` for a scalar).
    pub fn sizes(&self) -> &[usize] {
        match self {
            Operand::Tensor(t) => t.sizes(),
            Operand::Scalar(_) => &[],
        }
    }

    /// The dtype (a scalar's natural dtype).
    pub fn dtype(&self) -> ScalarType {
        match self {
            Operand::Tensor(t) => t.dtype(),
            Operand::Scalar(s) => s.natural_dtype(),
        }
    }
}

/// A block of one input as the op sees it.
#[derive(Clone, Copy)]
pub enum Src<'a, C> {
    Slice(&'a [C]),
    Splat(C),
}

impl<C: Copy> Src<'_, C> {
    /// Element `i` of the block.
    #[inline(always)]
    pub fn at(&self, i: usize) -> C {
        match self {
            Src::Slice(s) => s[i],
            Src::Splat(v) => *v,
        }
    }
}

/// `out[i] = f(a[i])`.
#[inline(always)]
pub fn zip1<A: Copy, R: Copy>(a: Src<'_, A>, out: &mut [R], f: impl Fn(A) -> R) {
    match a {
        Src::Slice(a) => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = f(x);
            }
        }
        Src::Splat(x) => out.fill(f(x)),
    }
}

/// `out[i] = f(a[i], b[i])`, with a loop per slice/splat combination.
#[inline(always)]
pub fn zip2<A: Copy, B: Copy, R: Copy>(
    a: Src<'_, A>,
    b: Src<'_, B>,
    out: &mut [R],
    f: impl Fn(A, B) -> R,
) {
    match (a, b) {
        (Src::Slice(a), Src::Slice(b)) => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        (Src::Slice(a), Src::Splat(y)) => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        (Src::Splat(x), Src::Slice(b)) => {
            for (o, &y) in out.iter_mut().zip(b) {
                *o = f(x, y);
            }
        }
        (Src::Splat(x), Src::Splat(y)) => out.fill(f(x, y)),
    }
}

/// `out[i] = f(a[i], b[i], c[i])`.
#[inline(always)]
pub fn zip3<A: Copy, B: Copy, C: Copy, R: Copy>(
    a: Src<'_, A>,
    b: Src<'_, B>,
    c: Src<'_, C>,
    out: &mut [R],
    f: impl Fn(A, B, C) -> R,
) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = f(a.at(i), b.at(i), c.at(i));
    }
}

/// The sizes of `operands` broadcast together.
pub fn broadcast_operands<'b>(
    operands: &[Operand],
    buf: &'b mut [usize; MAX_RANK],
) -> Result<&'b [usize], KernelError> {
    let mut shapes: [&[usize]; 4] = [&[]; 4];
    if operands.len() > shapes.len() {
        return Err(KernelError::invalid("too many elementwise operands"));
    }
    for (s, o) in shapes.iter_mut().zip(operands) {
        *s = o.sizes();
    }
    broadcast::broadcast_shapes(&shapes[..operands.len()], buf)
}

enum Input<'a, C> {
    Scalar(C),
    Tensor {
        data: In<'a>,
        direct: Option<&'a [C]>,
        narrow: Option<ScalarType>,
    },
}

/// What an elementwise op needs besides its block function.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// The dtype inputs are rounded through when theirs differs (integer scalars too)
    /// and results are rounded through before the store.
    pub common: ScalarType,
    /// Whether results (of the compute type) are rounded through `common`.
    pub narrow_result: bool,
}

/// Runs a block function over `inputs` broadcast to `out` (already resized to the
/// broadcast shape). `f(srcs, out_block)` computes one block.
pub fn map<const N: usize, C, R, F>(
    ctx: &KernelContext<'_>,
    inputs: &[Operand; N],
    out: &Tensor,
    spec: Spec,
    f: F,
) -> Result<(), KernelError>
where
    C: Element,
    R: Element,
    F: Fn(&[Src<'_, C>; N], &mut [R]) + Sync,
{
    let mut shapes: [Option<(&[usize], &[usize])>; N] = [None; N];
    for (s, o) in shapes.iter_mut().zip(inputs) {
        if let Operand::Tensor(t) = o {
            *s = Some((t.sizes(), t.strides()));
        }
    }
    let plan = Plan::<N>::new(out.sizes(), out.strides(), &shapes)?;
    let numel = out.numel();
    if numel == 0 {
        return Ok(());
    }
    let mut ins: [Input<'_, C>; N] = std::array::from_fn(|_| Input::Scalar(C::default()));
    for (k, (slot, operand)) in ins.iter_mut().zip(inputs).enumerate() {
        *slot = match operand {
            Operand::Scalar(s) => {
                let mut v = [s.cast::<C>()];
                if !spec.common.is_floating_point() {
                    narrow_slice(spec.common, &mut v);
                }
                Input::Scalar(v[0])
            }
            Operand::Tensor(t) => {
                let data = In::read(ctx, t)?;
                if plan.max_offset(&plan.in_strides[k]) >= data.len() {
                    return Err(KernelError::invalid("input strides exceed its storage"));
                }
                let narrow =
                    (t.dtype() != spec.common && narrows::<C>(spec.common)).then_some(spec.common);
                let direct = if narrow.is_none() {
                    data.as_slice::<C>()
                } else {
                    None
                };
                Input::Tensor {
                    data,
                    direct,
                    narrow,
                }
            }
        };
    }
    let mut dst = Out::write(ctx, out)?;
    if plan.max_offset(&plan.out_strides) >= dst.len() {
        return Err(KernelError::invalid("out strides exceed its storage"));
    }
    let narrow_result = (spec.narrow_result && narrows::<R>(spec.common)).then_some(spec.common);
    let threads = ctx.pool().threads();
    if threads > 1 && numel >= GRAIN_SIZE && plan.out_contiguous() {
        let chunk = numel.div_ceil(threads).max(GRAIN_SIZE).next_multiple_of(64);
        dst.par_chunks(ctx.pool(), chunk, &|start, mut part| {
            let end = start + part.len();
            run_range(&plan, &ins, start, end, &mut part, start, narrow_result, &f);
        });
    } else {
        run_range(&plan, &ins, 0, numel, &mut dst, 0, narrow_result, &f);
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Fetch<C> {
    Direct(usize),
    Splat(C),
    Buf,
}

/// Computes output elements `e0..e1` (in plan order) into `out`, whose element 0 is
/// plan offset `base`.
#[allow(clippy::too_many_arguments)]
fn run_range<const N: usize, C, R, F>(
    plan: &Plan<N>,
    ins: &[Input<'_, C>; N],
    e0: usize,
    e1: usize,
    out: &mut Out<'_>,
    base: usize,
    narrow_result: Option<ScalarType>,
    f: &F,
) where
    C: Element,
    R: Element,
    F: Fn(&[Src<'_, C>; N], &mut [R]),
{
    let inner = plan.inner();
    let last = plan.rank - 1;
    let mut bufs = [[C::default(); BLOCK]; N];
    let mut rbuf = [R::default(); BLOCK];
    let mut idx = [0usize; MAX_RANK];
    let (mut out_off, mut in_offs) = plan.row_start(e0 / inner, &mut idx);
    let mut col = e0 % inner;
    let mut e = e0;
    while e < e1 {
        let len = (inner - col).min(e1 - e);
        let mut j = 0;
        while j < len {
            let n = BLOCK.min(len - j);
            let c = col + j;
            let mut fetch = [Fetch::Buf; N];
            for k in 0..N {
                fetch[k] = match &ins[k] {
                    Input::Scalar(v) => Fetch::Splat(*v),
                    Input::Tensor {
                        data,
                        direct,
                        narrow,
                    } => {
                        let stride = plan.in_strides[k][last];
                        let off = in_offs[k] + c * stride;
                        if stride == 0 {
                            let mut v = [data.get::<C>(off)];
                            if let Some(t) = narrow {
                                narrow_slice(*t, &mut v);
                            }
                            Fetch::Splat(v[0])
                        } else if stride == 1 && direct.is_some() {
                            Fetch::Direct(off)
                        } else {
                            data.load(off, stride, &mut bufs[k][..n]);
                            if let Some(t) = narrow {
                                narrow_slice(*t, &mut bufs[k][..n]);
                            }
                            Fetch::Buf
                        }
                    }
                };
            }
            let srcs: [Src<'_, C>; N] = std::array::from_fn(|k| match fetch[k] {
                Fetch::Splat(v) => Src::Splat(v),
                Fetch::Direct(off) => match &ins[k] {
                    Input::Tensor {
                        direct: Some(d), ..
                    } => Src::Slice(&d[off..off + n]),
                    _ => Src::Splat(C::default()),
                },
                Fetch::Buf => Src::Slice(&bufs[k][..n]),
            });
            let out_stride = plan.out_strides[last];
            let o = out_off + c * out_stride - base;
            let mut done = false;
            if out_stride == 1
                && let Some(d) = out.as_mut_slice::<R>()
            {
                let d = &mut d[o..o + n];
                f(&srcs, d);
                if let Some(t) = narrow_result {
                    narrow_slice(t, d);
                }
                done = true;
            }
            if !done {
                let r = &mut rbuf[..n];
                f(&srcs, r);
                if let Some(t) = narrow_result {
                    narrow_slice(t, r);
                }
                out.store(o, out_stride, r);
            }
            j += n;
        }
        e += len;
        col = 0;
        if e < e1 {
            plan.next_row(&mut idx, &mut out_off, &mut in_offs);
        }
    }
}
