//! Elementwise and data-movement loops of the interpreter: unary functions, broadcast
//! binary functions, softmax over the last axis, transpose, slice and the embedding a
//! constant pad needs. (The heavy kernels live in `etch-linalg`.)

use etch_kernels::KernelError;
use etch_linalg::elementwise::{self, Arithmetic, Operand};

use crate::dims::{Dims, MAX_DIMS};
use crate::plan::{BinaryOp, UnaryOp};

fn short(what: &str) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {what}: operand too short"))
}

/// `out[i] = f(x[i])`; `Clamp` clamps to `[min, max]`.
pub fn unary(f: UnaryOp, min: f32, max: f32, x: &[f32], out: &mut [f32]) {
    let map = |out: &mut [f32], g: &dyn Fn(f32) -> f32| {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = g(v);
        }
    };
    match f {
        UnaryOp::Abs => map(out, &|v| v.abs()),
        UnaryOp::Ceiling => map(out, &|v| v.ceil()),
        UnaryOp::Clamp => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v.max(min).min(max);
            }
        }
        UnaryOp::Cos => map(out, &|v| v.cos()),
        UnaryOp::Elu(alpha) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = if v > 0.0 { v } else { alpha * v.exp_m1() };
            }
        }
        UnaryOp::Exp => map(out, &|v| v.exp()),
        UnaryOp::Floor => map(out, &|v| v.floor()),
        UnaryOp::Gelu => map(out, &|v| {
            0.5 * v * (1.0 + libm::erff(v * std::f32::consts::FRAC_1_SQRT_2))
        }),
        UnaryOp::Hardswish => map(out, &|v| v * ((v + 3.0).clamp(0.0, 6.0) / 6.0)),
        UnaryOp::LeakyRelu(slope) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = if v >= 0.0 { v } else { v * slope };
            }
        }
        UnaryOp::Log => map(out, &|v| v.ln()),
        UnaryOp::Negate => map(out, &|v| -v),
        UnaryOp::ReciprocalSquareRoot => {
            etch_linalg::approx::rsqrt(etch_linalg::dispatch().elementwise, x, out)
        }
        UnaryOp::Sigmoid => {
            etch_linalg::approx::sigmoid(etch_linalg::dispatch().elementwise, x, out)
        }
        UnaryOp::Sin => map(out, &|v| v.sin()),
        UnaryOp::Square => map(out, &|v| v * v),
        UnaryOp::SquareRoot => map(out, &|v| v.sqrt()),
        UnaryOp::Tanh => map(out, &|v| v.tanh()),
    }
}

#[inline]
fn apply(f: BinaryOp, a: f32, b: f32) -> f32 {
    match f {
        BinaryOp::Add => a + b,
        BinaryOp::Subtract => a - b,
        BinaryOp::Multiply => a * b,
        BinaryOp::Divide => a / b,
        BinaryOp::Minimum => a.min(b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::PRelu => {
            if a >= 0.0 {
                a
            } else {
                a * b
            }
        }
    }
}

/// Element strides of `d` right-aligned to rank `rank`, 0 along broadcast axes.
fn broadcast_strides(d: &Dims, y: &Dims) -> [usize; MAX_DIMS] {
    let mut s = [0usize; MAX_DIMS];
    let lead = y.rank() - d.rank();
    let mut stride = 1usize;
    for i in (0..d.rank()).rev() {
        let size = d.get(i);
        s[lead + i] = if size == 1 && y.get(lead + i) != 1 {
            0
        } else {
            stride
        };
        stride *= size;
    }
    s
}

/// The two inputs of a broadcasting binary node: each operand's dims and elements, and
/// the output dims both are broadcast to (numpy rules).
#[derive(Debug, Clone, Copy)]
pub struct BroadcastOperands<'a, T> {
    /// Dims of the first operand.
    pub ad: &'a Dims,
    /// Elements of the first operand.
    pub a: &'a [T],
    /// Dims of the second operand.
    pub bd: &'a Dims,
    /// Elements of the second operand.
    pub b: &'a [T],
    /// Dims of the output.
    pub yd: &'a Dims,
}

/// `out = clamp(f(a, b))` with numpy broadcasting of both operands to the output dims.
pub fn binary(
    f: BinaryOp,
    min: f32,
    max: f32,
    operands: BroadcastOperands<'_, f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let bounded = min > f32::NEG_INFINITY || max < f32::INFINITY;
    let arithmetic = match f {
        BinaryOp::Add => Some(Arithmetic::Add),
        BinaryOp::Subtract => Some(Arithmetic::Subtract),
        BinaryOp::Multiply => Some(Arithmetic::Multiply),
        BinaryOp::Divide => Some(Arithmetic::Divide),
        BinaryOp::Minimum | BinaryOp::Maximum | BinaryOp::PRelu => None,
    };
    if let Some(op) = arithmetic {
        // The vector loops of the kernel library, run by run.
        let isa = etch_linalg::dispatch().elementwise;
        let clamp = bounded.then_some((min, max));
        return for_each_operand_run(operands, out, |x, y, o| {
            elementwise::arithmetic(isa, op, x, y, clamp, o)
        });
    }
    if bounded {
        binary_with(&|p, q| apply(f, p, q).max(min).min(max), operands, out)
    } else {
        binary_with(&|p, q| apply(f, p, q), operands, out)
    }
}

/// `out = g(a, b)` with numpy broadcasting of both operands to the output dims, for
/// any element type (the int8 nodes use it too).
#[inline(always)]
pub fn binary_with<T: Copy, U: Copy>(
    g: &impl Fn(T, T) -> U,
    operands: BroadcastOperands<'_, T>,
    out: &mut [U],
) -> Result<(), KernelError> {
    for_each_operand_run(operands, out, |x, y, o| elementwise::zip_with(x, y, o, g))
}

/// Visits the output of a broadcast binary node run by run: `row(a_run, b_run, out_run)`
/// where each operand run is as long as the output run or one value. The whole output
/// is one run when both operands are as long as it (or one value); otherwise each
/// output row (the innermost axis) is one.
#[inline(always)]
fn for_each_operand_run<T: Copy, U>(
    operands: BroadcastOperands<'_, T>,
    out: &mut [U],
    mut row: impl FnMut(Operand<'_, T>, Operand<'_, T>, &mut [U]),
) -> Result<(), KernelError> {
    let BroadcastOperands { ad, a, bd, b, yd } = operands;
    let n = out.len();
    fn flat<T: Copy>(x: &[T], n: usize) -> Option<Operand<'_, T>> {
        match x.len() {
            len if len == n => Some(Operand::Run(x)),
            1 => Some(Operand::Splat(x[0])),
            _ => None,
        }
    }
    if let (Some(x), Some(y)) = (flat(a, n), flat(b, n)) {
        row(x, y, out);
        return Ok(());
    }
    let r = yd.rank();
    let sa = broadcast_strides(ad, yd);
    let sb = broadcast_strides(bd, yd);
    let inner = yd.get(r - 1);
    let (ia, ib) = (sa[r - 1], sb[r - 1]);
    // The operand run of one output row: contiguous (stride 1) or one broadcast value.
    let run = |x: &[T], off: usize, stride: usize| -> Result<(usize, bool), KernelError> {
        let last = off + (inner.max(1) - 1) * stride;
        if last >= x.len() {
            return Err(short("binary"));
        }
        Ok((off, stride == 0))
    };
    let mut idx = [0usize; MAX_DIMS];
    for o in out.chunks_exact_mut(inner.max(1)) {
        let (mut oa, mut ob) = (0usize, 0usize);
        for d in 0..r - 1 {
            oa += idx[d] * sa[d];
            ob += idx[d] * sb[d];
        }
        let (oa, a_one) = run(a, oa, ia)?;
        let (ob, b_one) = run(b, ob, ib)?;
        let w = o.len();
        let x = if a_one {
            Operand::Splat(a[oa])
        } else {
            Operand::Run(&a[oa..oa + w])
        };
        let y = if b_one {
            Operand::Splat(b[ob])
        } else {
            Operand::Run(&b[ob..ob + w])
        };
        row(x, y, o);
        for d in (0..r.saturating_sub(1)).rev() {
            idx[d] += 1;
            if idx[d] < yd.get(d) {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: &[usize]) -> Dims {
        Dims::new(v).unwrap()
    }

    #[test]
    fn broadcast_rows_and_columns() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let col = [10.0, 20.0];
        let mut out = [0f32; 6];
        binary(
            BinaryOp::Add,
            f32::NEG_INFINITY,
            f32::INFINITY,
            BroadcastOperands {
                ad: &d(&[2, 3]),
                a: &a,
                bd: &d(&[2, 1]),
                b: &col,
                yd: &d(&[2, 3]),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [11.0, 12.0, 13.0, 24.0, 25.0, 26.0]);
        let row = [1.0, 0.0, -1.0];
        binary(
            BinaryOp::Multiply,
            f32::NEG_INFINITY,
            f32::INFINITY,
            BroadcastOperands {
                ad: &d(&[2, 3]),
                a: &a,
                bd: &d(&[3]),
                b: &row,
                yd: &d(&[2, 3]),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [1.0, 0.0, -3.0, 4.0, 0.0, -6.0]);
    }
}
