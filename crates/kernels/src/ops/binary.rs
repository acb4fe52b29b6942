//! Broadcasting binary kernels: arithmetic (`add`, `sub`, `mul`, `div`, `rsub`, `pow`,
//! `maximum`, `minimum`, `floor_divide`, `fmod`, `remainder`), bitwise and logical ops,
//! bit shifts (`bitwise_left_shift`, `bitwise_right_shift`, in `binary/shift.rs`) and
//! `where`.
//!
//! Integer `remainder` follows PyTorch (the result takes the divisor's sign); the
//! official portable kernel 1.5.1 applies C's `%` to integers instead, so the two differ
//! on integer operands of opposite signs. An integer division by zero is an error in
//! every op that divides.
//!
//! All follow PyTorch: operands broadcast (up to 16 dims), the common dtype is
//! `torch.result_type` of the operands (a Scalar is a wrapped number), `div` of
//! integers is a float division, and the result is cast to the out tensor's dtype when
//! PyTorch allows the cast.

use std::sync::atomic::{AtomicBool, Ordering};

use etch_base::{Element, ScalarType};

use super::elementwise::args_form::args_form;
use super::elementwise::dtype::{Bool8, with_compute};
use super::elementwise::num::Num;
use super::elementwise::promote::{ResultType, check_can_cast, to_float};
use super::elementwise::{Operand, Spec, Src, broadcast_operands, map, zip2, zip3};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor};

mod dense_f32;
mod shift;

/// Registers `name => op` pairs as [`arith_op`] over the arguments of `schema`.
macro_rules! register_arith {
    ($r:ident, $schema:ident: $($name:literal => $op:ident),* $(,)?) => {
        $($r.register($name, |c, a| arith_op::<$schema>(c, a, Op::$op));)*
    };
}

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    register_arith!(r, TensorTensorAlphaArgs: "aten::add.out" => Add, "aten::sub.out" => Sub);
    register_arith!(r, TensorScalarAlphaArgs:
        "aten::add.Scalar_out" => Add,
        "aten::sub.Scalar_out" => Sub,
        "aten::rsub.Scalar_out" => Rsub,
    );
    register_arith!(r, TensorTensorArgs:
        "aten::mul.out" => Mul,
        "aten::div.out" => Div,
        "aten::pow.Tensor_Tensor_out" => Pow,
        "aten::floor_divide.out" => DivFloor,
        "aten::fmod.Tensor_out" => Fmod,
        "aten::remainder.Tensor_out" => Remainder,
        "aten::maximum.out" => Max,
        "aten::minimum.out" => Min,
        "aten::bitwise_and.Tensor_out" => BitAnd,
        "aten::bitwise_or.Tensor_out" => BitOr,
        "aten::bitwise_xor.Tensor_out" => BitXor,
        "aten::bitwise_left_shift.Tensor_out" => Shl,
        "aten::bitwise_right_shift.Tensor_out" => Shr,
    );
    register_arith!(r, TensorScalarArgs:
        "aten::mul.Scalar_out" => Mul,
        "aten::div.Scalar_out" => Div,
        "aten::pow.Tensor_Scalar_out" => Pow,
        "aten::fmod.Scalar_out" => Fmod,
        "aten::remainder.Scalar_out" => Remainder,
        "aten::bitwise_and.Scalar_out" => BitAnd,
        "aten::bitwise_or.Scalar_out" => BitOr,
        "aten::bitwise_xor.Scalar_out" => BitXor,
        "aten::bitwise_left_shift.Tensor_Scalar_out" => Shl,
        "aten::bitwise_right_shift.Tensor_Scalar_out" => Shr,
    );
    r.register("aten::div.out_mode", div_mode_tensor);
    r.register("aten::div.Scalar_mode_out", div_mode_scalar);
    r.register("aten::pow.Scalar_out", pow_scalar_base);
    r.register("aten::logical_and.out", |c, a| logical(c, a, Logic::And));
    r.register("aten::logical_or.out", |c, a| logical(c, a, Logic::Or));
    r.register("aten::logical_xor.out", |c, a| logical(c, a, Logic::Xor));
    r.register("aten::where.self_out", where_self);
    r.register("aten::masked_fill.Scalar_out", masked_fill);
    r.register("aten::atan2.out", atan2);
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
    /// `fmod`: the remainder with the sign of the dividend.
    Fmod,
    /// `remainder`: the remainder with the sign of the divisor (Python's `%`).
    Remainder,
    Pow,
    Max,
    Min,
    BitAnd,
    BitOr,
    BitXor,
    /// `self << other` in the common integer dtype ([`shift::left`]).
    Shl,
    /// `self >> other` in the common integer dtype ([`shift::right`]).
    Shr,
}

op_args! {
    /// `op.out(Tensor self, Tensor other, *, Tensor(a!) out)` (`mul`, `div`, `pow`,
    /// `maximum`, `minimum`, `bitwise_*`).
    struct TensorTensorArgs = "aten::<binary>.out" {
        input: Tensor,
        other: Tensor,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `op.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out)` (`add`, `sub`).
    struct TensorTensorAlphaArgs = "aten::<add|sub>.out" {
        input: Tensor,
        other: Tensor,
        alpha: Scalar,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `op.Scalar_out(Tensor self, Scalar other, *, Tensor(a!) out)`.
    struct TensorScalarArgs = "aten::<binary>.Scalar_out" {
        input: Tensor,
        other: Scalar,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `op.Scalar_out(Tensor self, Scalar other, Scalar alpha=1, *, Tensor(a!) out)`
    /// (`add`, `sub`, `rsub`).
    struct TensorScalarAlphaArgs = "aten::<add|sub|rsub>.Scalar_out" {
        input: Tensor,
        other: Scalar,
        alpha: Scalar,
        out: OutArg,
    } returns 1
}

/// The arguments of the four arithmetic schemas above, in one form (`alpha` is none
/// where the schema has none).
struct ArithOperands {
    input: Tensor,
    other: Operand,
    alpha: Option<Scalar>,
    out: OutArg,
}

args_form! {
    ArithOperands { input, out }:
    TensorTensorArgs => |a| { other: Operand::Tensor(a.other), alpha: None };
    TensorTensorAlphaArgs => |a| { other: Operand::Tensor(a.other), alpha: Some(a.alpha) };
    TensorScalarArgs => |a| { other: Operand::Scalar(a.other), alpha: None };
    TensorScalarAlphaArgs => |a| { other: Operand::Scalar(a.other), alpha: Some(a.alpha) };
}

/// `op(self: Tensor, other: Tensor or Scalar[, alpha], out)`, with the arguments of
/// schema `S`.
fn arith_op<S>(ctx: &KernelContext<'_>, a: &mut Args<'_>, op: Op) -> Result<(), KernelError>
where
    S: for<'x> OpArgs<'x> + Into<ArithOperands>,
{
    let ArithOperands {
        input,
        other,
        alpha,
        out,
    } = S::unpack(a)?.into();
    arith(ctx, a, Operand::Tensor(input), other, op, alpha, out)
}

op_args! {
    /// `pow.Scalar_out(Scalar self, Tensor exponent, *, Tensor(a!) out)`.
    struct PowScalarArgs = "aten::pow.Scalar_out" {
        input: Scalar,
        exponent: Tensor,
        out: OutArg,
    } returns 1
}

fn pow_scalar_base(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let PowScalarArgs {
        input,
        exponent,
        out,
    } = PowScalarArgs::unpack(a)?;
    let (x, y) = (Operand::Scalar(input), Operand::Tensor(exponent));
    arith(ctx, a, x, y, Op::Pow, None, out)
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

op_args! {
    /// `div.out_mode(Tensor self, Tensor other, *, str? rounding_mode, Tensor(a!) out)`.
    struct DivModeArgs<'a> = "aten::div.out_mode" {
        input: Tensor,
        other: Tensor,
        rounding_mode: Option<&'a str>,
        out: OutArg,
    } returns 1
}

fn div_mode_tensor(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let args = DivModeArgs::unpack(a)?;
    let op = rounding_op(args.rounding_mode)?;
    let (x, y) = (Operand::Tensor(args.input), Operand::Tensor(args.other));
    arith(ctx, a, x, y, op, None, args.out)
}

op_args! {
    /// `div.Scalar_mode_out(Tensor self, Scalar other, *, str? rounding_mode,
    /// Tensor(a!) out)`.
    struct DivScalarModeArgs<'a> = "aten::div.Scalar_mode_out" {
        input: Tensor,
        other: Scalar,
        rounding_mode: Option<&'a str>,
        out: OutArg,
    } returns 1
}

fn div_mode_scalar(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let args = DivScalarModeArgs::unpack(a)?;
    let op = rounding_op(args.rounding_mode)?;
    let (x, y) = (Operand::Tensor(args.input), Operand::Scalar(args.other));
    arith(ctx, a, x, y, op, None, args.out)
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

/// The common dtype of two operands (`torch.result_type`), before any op's own rules.
fn common_dtype(x: &Operand, y: &Operand) -> Result<ScalarType, KernelError> {
    ResultType::new().operand(x)?.operand(y)?.finish()
}

/// Refuses the first of `dtypes` that the elementwise engine cannot compute with,
/// naming `what` in the error.
fn check_supported(
    dtypes: impl IntoIterator<Item = ScalarType>,
    what: &'static str,
) -> Result<(), KernelError> {
    for dtype in dtypes {
        if !super::elementwise::dtype::is_supported(dtype) {
            return Err(super::elementwise::dtype::unsupported(dtype, what));
        }
    }
    Ok(())
}

/// Resizes `out` to the shape the operands `ins` broadcast to.
fn resize_to_broadcast(
    a: &mut Args<'_>,
    ins: &[Operand],
    out: OutArg,
) -> Result<Tensor, KernelError> {
    let mut buf = [0usize; MAX_RANK];
    let sizes = broadcast_operands(ins, &mut buf)?;
    out.resize(a, sizes)
}

/// The common dtype of `op` over `x` and `y`, after the op's own rules.
pub fn arith_dtype(x: &Operand, y: &Operand, op: Op) -> Result<ScalarType, KernelError> {
    let common = common_dtype(x, y)?;
    match op {
        Op::Div => return Ok(to_float(common)),
        Op::Sub | Op::Rsub if common == ScalarType::Bool => {
            return Err(KernelError::invalid(
                "subtraction with two bool tensors is not supported; use logical_xor",
            ));
        }
        Op::DivTrunc | Op::DivFloor | Op::Fmod | Op::Remainder if common == ScalarType::Bool => {
            return Err(KernelError::UnsupportedDtype {
                dtype: common,
                what: "division and remainder ops (numbers only)",
            });
        }
        Op::BitAnd | Op::BitOr | Op::BitXor | Op::Shl | Op::Shr if common.is_floating_point() => {
            return Err(KernelError::UnsupportedDtype {
                dtype: common,
                what: "bitwise ops (integers and bool only)",
            });
        }
        Op::Pow if !common.is_floating_point() => {
            if let Operand::Scalar(s) = y
                && s.to_i64() < 0
                && !matches!(s, Scalar::Double(_))
            {
                return Err(KernelError::invalid(
                    "integers to negative integer powers are not allowed",
                ));
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
    out: OutArg,
) -> Result<(), KernelError> {
    let common = arith_dtype(&x, &y, op)?;
    if let Some(al) = alpha {
        check_alpha(common, al)?;
    }
    let out = resize_to_broadcast(a, &[x, y], out)?;
    check_can_cast(common, out.dtype())?;
    if dense_f32::try_run(ctx, (&x, &y), &out, op, alpha)? {
        return Ok(());
    }
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
        Op::Fmod => go!(|x: C, y: C| {
            checked(y);
            x.fmod(y)
        }),
        Op::Remainder => go!(|x: C, y: C| {
            checked(y);
            x.remainder(y)
        }),
        Op::Pow => go!(|x: C, y: C| x.pow(y)),
        Op::Max => go!(|x: C, y: C| x.maximum(y)),
        Op::Min => go!(|x: C, y: C| x.minimum(y)),
        Op::BitAnd => go!(|x: C, y: C| x.bitand(y)),
        Op::BitOr => go!(|x: C, y: C| x.bitor(y)),
        Op::BitXor => go!(|x: C, y: C| x.bitxor(y)),
        Op::Shl => {
            let bits = shift::Bits::of(spec.common);
            go!(|x: C, y: C| C::from_i64(shift::left(x.to_i64(), y.to_i64(), bits)))
        }
        Op::Shr => {
            let bits = shift::Bits::of(spec.common);
            go!(|x: C, y: C| C::from_i64(shift::right(x.to_i64(), y.to_i64(), bits)))
        }
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

/// `logical_{and,or,xor}.out(Tensor self, Tensor other, *, Tensor(a!) out)`: non-zero
/// tests, any out dtype.
fn logical(ctx: &KernelContext<'_>, a: &mut Args<'_>, op: Logic) -> Result<(), KernelError> {
    let TensorTensorArgs { input, other, out } = TensorTensorArgs::unpack(a)?;
    let ins = [Operand::Tensor(input), Operand::Tensor(other)];
    check_supported(ins.iter().map(Operand::dtype), "logical ops")?;
    let out = resize_to_broadcast(a, &ins, out)?;
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

op_args! {
    /// `where.self_out(Tensor condition, Tensor self, Tensor other, *, Tensor(a!) out)`.
    struct WhereArgs = "aten::where.self_out" {
        condition: Tensor,
        input: Tensor,
        other: Tensor,
        out: OutArg,
    } returns 1
}

fn where_self(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let WhereArgs {
        condition: cond,
        input,
        other,
        out,
    } = WhereArgs::unpack(a)?;
    if !matches!(cond.dtype(), ScalarType::Bool | ScalarType::Byte) {
        return Err(KernelError::UnsupportedDtype {
            dtype: cond.dtype(),
            what: "where condition (bool or uint8)",
        });
    }
    let x = Operand::Tensor(input);
    let y = Operand::Tensor(other);
    let common = common_dtype(&x, &y)?;
    let ins = [Operand::Tensor(cond), x, y];
    let out = resize_to_broadcast(a, &ins, out)?;
    check_can_cast(common, out.dtype())?;
    let spec = Spec {
        common,
        narrow_result: false,
    };
    with_compute!(common, C => map::<3, C, C, _>(ctx, &ins, &out, spec, |s: &[Src<'_, C>; 3], o: &mut [C]| {
        zip3(s[0], s[1], s[2], o, |c: C, x: C, y: C| if c != C::ZERO { x } else { y })
    }))
}

op_args! {
    /// `masked_fill.Scalar_out(Tensor self, Tensor mask, Scalar value, *,
    /// Tensor(a!) out)`: `value` where the (bool) mask is set, `self` elsewhere; the
    /// two tensors broadcast, `out` has `self`'s dtype and `value` is cast to it.
    struct MaskedFillArgs = "aten::masked_fill.Scalar_out" {
        input: Tensor,
        mask: Tensor,
        value: Scalar,
        out: OutArg,
    } returns 1
}

fn masked_fill(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let MaskedFillArgs {
        input,
        mask,
        value,
        out,
    } = MaskedFillArgs::unpack(a)?;
    if mask.dtype() != ScalarType::Bool {
        return Err(KernelError::UnsupportedDtype {
            dtype: mask.dtype(),
            what: "masked_fill mask (bool)",
        });
    }
    let common = input.dtype();
    check_supported([common], "masked_fill")?;
    let ins = [
        Operand::Tensor(mask),
        Operand::Tensor(input),
        Operand::Scalar(value),
    ];
    let out = resize_to_broadcast(a, &ins[..2], out)?;
    crate::ops::same_dtype(&input, &out)?;
    let spec = Spec {
        common,
        narrow_result: true,
    };
    with_compute!(common, C => map::<3, C, C, _>(ctx, &ins, &out, spec, |s: &[Src<'_, C>; 3], o: &mut [C]| {
        zip3(s[0], s[1], s[2], o, |m: C, x: C, v: C| if m != C::ZERO { v } else { x })
    }))
}

/// `atan2.out(Tensor self, Tensor other, *, Tensor(a!) out)`: the angle of
/// `(other, self)`, broadcast, in the float type of the operands' common dtype
/// (computed in f64, rounded once).
fn atan2(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let TensorTensorArgs { input, other, out } = TensorTensorArgs::unpack(a)?;
    let ins = [Operand::Tensor(input), Operand::Tensor(other)];
    check_supported(ins.iter().map(Operand::dtype), "atan2")?;
    let common = to_float(common_dtype(&ins[0], &ins[1])?);
    let out = resize_to_broadcast(a, &ins, out)?;
    check_can_cast(common, out.dtype())?;
    let spec = Spec {
        common,
        narrow_result: true,
    };
    with_compute!(common, C => map::<2, C, C, _>(ctx, &ins, &out, spec, |s: &[Src<'_, C>; 2], o: &mut [C]| {
        zip2(s[0], s[1], o, |y: C, x: C| C::from_f64(y.to_f64().atan2(x.to_f64())))
    }))
}

#[cfg(test)]
mod tests;
