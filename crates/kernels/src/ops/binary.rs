//! Broadcasting binary kernels: arithmetic (`add`, `sub`, `mul`, `div`, `rsub`, `pow`,
//! `maximum`, `minimum`), bitwise and logical ops, and `where`.
//!
//! All follow PyTorch: operands broadcast (up to 16 dims), the common dtype is
//! `torch.result_type` of the operands (a Scalar is a wrapped number), `div` of
//! integers is a float division, and the result is cast to the out tensor's dtype when
//! PyTorch allows the cast.

use std::sync::atomic::{AtomicBool, Ordering};

use etch_base::ScalarType;

use super::elementwise::dtype::{Bool8, with_compute};
use super::elementwise::num::Num;
use super::elementwise::promote::{ResultType, check_can_cast, to_float};
use super::elementwise::{Operand, Spec, Src, broadcast_operands, map, opt_string_arg, zip2, zip3};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Scalar};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::add.out", |c, a| tensor_op(c, a, Op::Add, true));
    r.register("aten::sub.out", |c, a| tensor_op(c, a, Op::Sub, true));
    r.register("aten::mul.out", |c, a| tensor_op(c, a, Op::Mul, false));
    r.register("aten::div.out", |c, a| tensor_op(c, a, Op::Div, false));
    r.register("aten::div.out_mode", div_mode_tensor);
    r.register("aten::add.Scalar_out", |c, a| {
        scalar_op(c, a, Op::Add, true)
    });
    r.register("aten::sub.Scalar_out", |c, a| {
        scalar_op(c, a, Op::Sub, true)
    });
    r.register("aten::mul.Scalar_out", |c, a| {
        scalar_op(c, a, Op::Mul, false)
    });
    r.register("aten::div.Scalar_out", |c, a| {
        scalar_op(c, a, Op::Div, false)
    });
    r.register("aten::div.Scalar_mode_out", div_mode_scalar);
    r.register("aten::rsub.Scalar_out", |c, a| {
        scalar_op(c, a, Op::Rsub, true)
    });
    r.register("aten::pow.Tensor_Scalar_out", |c, a| {
        scalar_op(c, a, Op::Pow, false)
    });
    r.register("aten::pow.Tensor_Tensor_out", |c, a| {
        tensor_op(c, a, Op::Pow, false)
    });
    r.register("aten::pow.Scalar_out", pow_scalar_base);
    r.register("aten::maximum.out", |c, a| tensor_op(c, a, Op::Max, false));
    r.register("aten::minimum.out", |c, a| tensor_op(c, a, Op::Min, false));
    r.register("aten::bitwise_and.Tensor_out", |c, a| {
        tensor_op(c, a, Op::BitAnd, false)
    });
    r.register("aten::bitwise_or.Tensor_out", |c, a| {
        tensor_op(c, a, Op::BitOr, false)
    });
    r.register("aten::bitwise_xor.Tensor_out", |c, a| {
        tensor_op(c, a, Op::BitXor, false)
    });
    r.register("aten::bitwise_and.Scalar_out", |c, a| {
        scalar_op(c, a, Op::BitAnd, false)
    });
    r.register("aten::bitwise_or.Scalar_out", |c, a| {
        scalar_op(c, a, Op::BitOr, false)
    });
    r.register("aten::bitwise_xor.Scalar_out", |c, a| {
        scalar_op(c, a, Op::BitXor, false)
    });
    r.register("aten::logical_and.out", |c, a| logical(c, a, Logic::And));
    r.register("aten::logical_or.out", |c, a| logical(c, a, Logic::Or));
    r.register("aten::logical_xor.out", |c, a| logical(c, a, Logic::Xor));
    r.register("aten::where.self_out", where_self);
}

/// A binary arithmetic op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    /// `other - alpha * self`.
    Rsub,
    Mul,
    Div,
    DivTrunc,
    DivFloor,
    Pow,
    Max,
    Min,
    BitAnd,
    BitOr,
    BitXor,
}

/// `op(self: Tensor, other: Tensor[, alpha], out)`.
fn tensor_op(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    op: Op,
    has_alpha: bool,
) -> Result<(), KernelError> {
    a.expect_len(if has_alpha { 5 } else { 4 })?;
    let x = Operand::Tensor(a.tensor(0)?);
    let y = Operand::Tensor(a.tensor(1)?);
    let alpha = if has_alpha { Some(a.scalar(2)?) } else { None };
    let out = a.len() - 2;
    arith(ctx, a, x, y, op, alpha, out)
}

/// `op(self: Tensor, other: Scalar[, alpha], out)`.
fn scalar_op(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    op: Op,
    has_alpha: bool,
) -> Result<(), KernelError> {
    a.expect_len(if has_alpha { 5 } else { 4 })?;
    let x = Operand::Tensor(a.tensor(0)?);
    let y = Operand::Scalar(a.scalar(1)?);
    let alpha = if has_alpha { Some(a.scalar(2)?) } else { None };
    let out = a.len() - 2;
    arith(ctx, a, x, y, op, alpha, out)
}

/// `pow.Scalar_out(Scalar self, Tensor exponent, out)`.
fn pow_scalar_base(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    a.expect_len(4)?;
    let x = Operand::Scalar(a.scalar(0)?);
    let y = Operand::Tensor(a.tensor(1)?);
    arith(ctx, a, x, y, Op::Pow, None, 2)
}

fn rounding_op(mode: Option<&str>) -> Result<Op, KernelError> {
    match mode {
        None => Ok(Op::Div),
        Some("trunc") => Ok(Op::DivTrunc),
        Some("floor") => Ok(Op::DivFloor),
        Some(other) => Err(KernelError::invalid(format!(
            "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{other}'"
        ))),
    }
}

/// `div.out_mode(self, other, *, rounding_mode, out)`.
fn div_mode_tensor(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    a.expect_len(5)?;
    let x = Operand::Tensor(a.tensor(0)?);
    let y = Operand::Tensor(a.tensor(1)?);
    let op = rounding_op(opt_string_arg(a, 2)?)?;
    arith(ctx, a, x, y, op, None, 3)
}

/// `div.Scalar_mode_out(self, Scalar other, *, rounding_mode, out)`.
fn div_mode_scalar(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    a.expect_len(5)?;
    let x = Operand::Tensor(a.tensor(0)?);
    let y = Operand::Scalar(a.scalar(1)?);
    let op = rounding_op(opt_string_arg(a, 2)?)?;
    arith(ctx, a, x, y, op, None, 3)
}

fn check_alpha(common: ScalarType, alpha: Scalar) -> Result<(), KernelError> {
    if matches!(alpha, Scalar::Bool(_)) && common != ScalarType::Bool {
        return Err(KernelError::invalid(
            "Boolean alpha only supported for Boolean results",
        ));
    }
    if !common.is_floating_point() && matches!(alpha, Scalar::Double(_)) {
        return Err(KernelError::invalid(
            "for integral input tensors, argument alpha must not be a floating point number",
        ));
    }
    Ok(())
}

/// The common dtype of `op` over `x` and `y`, after the op's own rules.
pub fn arith_dtype(x: &Operand, y: &Operand, op: Op) -> Result<ScalarType, KernelError> {
    let common = ResultType::new().operand(x)?.operand(y)?.finish()?;
    match op {
        Op::Div => return Ok(to_float(common)),
        Op::Sub | Op::Rsub if common == ScalarType::Bool => {
            return Err(KernelError::invalid(
                "subtraction with two bool tensors is not supported; use logical_xor",
            ));
        }
        Op::DivTrunc | Op::DivFloor if common == ScalarType::Bool => {
            return Err(KernelError::UnsupportedDtype {
                dtype: common,
                what: "div with rounding_mode",
            });
        }
        Op::BitAnd | Op::BitOr | Op::BitXor if common.is_floating_point() => {
            return Err(KernelError::UnsupportedDtype {
                dtype: common,
                what: "bitwise ops (integers and bool only)",
            });
        }
        Op::Pow if !common.is_floating_point() => {
            if let Operand::Scalar(s) = y {
                if s.to_i64() < 0 && !matches!(s, Scalar::Double(_)) {
                    return Err(KernelError::invalid(
                        "integers to negative integer powers are not allowed",
                    ));
                }
            }
        }
        _ => {}
    }
    Ok(common)
}

#[allow(clippy::too_many_arguments)]
fn arith(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    x: Operand,
    y: Operand,
    op: Op,
    alpha: Option<Scalar>,
    out_index: usize,
) -> Result<(), KernelError> {
    let common = arith_dtype(&x, &y, op)?;
    if let Some(al) = alpha {
        check_alpha(common, al)?;
    }
    let mut buf = [0usize; MAX_RANK];
    let sizes = broadcast_operands(&[x, y], &mut buf)?;
    let out = a.resize_tensor(out_index, sizes)?;
    check_can_cast(common, out.dtype())?;
    let spec = Spec {
        common,
        narrow_result: true,
    };
    with_compute!(common, C => run_arith::<C>(ctx, [x, y], &out, spec, op, alpha))
}

fn run_arith<C: Num>(
    ctx: &KernelContext<'_>,
    ins: [Operand; 2],
    out: &crate::Tensor,
    spec: Spec,
    op: Op,
    alpha: Option<Scalar>,
) -> Result<(), KernelError> {
    let alpha = alpha.map(Scalar::cast::<C>).unwrap_or(C::ONE);
    let zero_div = AtomicBool::new(false);
    let zd = &zero_div;
    macro_rules! go {
        ($f:expr) => {
            map::<2, C, C, _>(ctx, &ins, out, spec, |s: &[Src<'_, C>; 2], o: &mut [C]| {
                zip2(s[0], s[1], o, $f)
            })
        };
    }
    let checked = |y: C| {
        if !C::FLOAT && y == C::ZERO {
            zd.store(true, Ordering::Relaxed);
        }
    };
    match op {
        Op::Add if alpha == C::ONE => go!(|x: C, y: C| x.add(y)),
        Op::Add => go!(|x: C, y: C| x.add(alpha.mul(y))),
        Op::Sub if alpha == C::ONE => go!(|x: C, y: C| x.sub(y)),
        Op::Sub => go!(|x: C, y: C| x.sub(alpha.mul(y))),
        Op::Rsub => go!(|x: C, y: C| y.sub(alpha.mul(x))),
        Op::Mul => go!(|x: C, y: C| x.mul(y)),
        Op::Div => go!(|x: C, y: C| x.div(y)),
        Op::DivTrunc => go!(|x: C, y: C| {
            checked(y);
            x.div_trunc(y)
        }),
        Op::DivFloor => go!(|x: C, y: C| {
            checked(y);
            x.div_floor(y)
        }),
        Op::Pow => go!(|x: C, y: C| x.pow(y)),
        Op::Max => go!(|x: C, y: C| x.maximum(y)),
        Op::Min => go!(|x: C, y: C| x.minimum(y)),
        Op::BitAnd => go!(|x: C, y: C| x.bitand(y)),
        Op::BitOr => go!(|x: C, y: C| x.bitor(y)),
        Op::BitXor => go!(|x: C, y: C| x.bitxor(y)),
    }?;
    if zero_div.load(Ordering::Relaxed) {
        return Err(KernelError::invalid("integer division by zero"));
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Logic {
    And,
    Or,
    Xor,
}

/// `logical_{and,or,xor}.out(self, other, out)`: non-zero tests, any out dtype.
fn logical(ctx: &KernelContext<'_>, a: &mut Args<'_>, op: Logic) -> Result<(), KernelError> {
    a.expect_len(4)?;
    let ins = [Operand::Tensor(a.tensor(0)?), Operand::Tensor(a.tensor(1)?)];
    for o in &ins {
        if !super::elementwise::dtype::is_supported(o.dtype()) {
            return Err(super::elementwise::dtype::unsupported(
                o.dtype(),
                "logical ops",
            ));
        }
    }
    let mut buf = [0usize; MAX_RANK];
    let sizes = broadcast_operands(&ins, &mut buf)?;
    let out = a.resize_tensor(2, sizes)?;
    let spec = Spec {
        common: ScalarType::Double,
        narrow_result: false,
    };
    let f = |s: &[Src<'_, f64>; 2], o: &mut [Bool8]| match op {
        Logic::And => zip2(s[0], s[1], o, |x, y| Bool8((x != 0.0 && y != 0.0) as u8)),
        Logic::Or => zip2(s[0], s[1], o, |x, y| Bool8((x != 0.0 || y != 0.0) as u8)),
        Logic::Xor => zip2(s[0], s[1], o, |x, y| {
            Bool8(((x != 0.0) != (y != 0.0)) as u8)
        }),
    };
    map::<2, f64, Bool8, _>(ctx, &ins, &out, spec, f)
}

/// `where.self_out(condition, self, other, out)`.
fn where_self(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    a.expect_len(5)?;
    let cond = a.tensor(0)?;
    if !matches!(cond.dtype(), ScalarType::Bool | ScalarType::Byte) {
        return Err(KernelError::UnsupportedDtype {
            dtype: cond.dtype(),
            what: "where condition (bool or uint8)",
        });
    }
    let x = Operand::Tensor(a.tensor(1)?);
    let y = Operand::Tensor(a.tensor(2)?);
    let common = ResultType::new().operand(&x)?.operand(&y)?.finish()?;
    let ins = [Operand::Tensor(cond), x, y];
    let mut buf = [0usize; MAX_RANK];
    let sizes = broadcast_operands(&ins, &mut buf)?;
    let out = a.resize_tensor(3, sizes)?;
    check_can_cast(common, out.dtype())?;
    let spec = Spec {
        common,
        narrow_result: false,
    };
    with_compute!(common, C => map::<3, C, C, _>(ctx, &ins, &out, spec, |s: &[Src<'_, C>; 3], o: &mut [C]| {
        zip3(s[0], s[1], s[2], o, |c: C, x: C, y: C| if c != C::ZERO { x } else { y })
    }))
}

#[cfg(test)]
mod tests;
