//! More unary elementwise kernels of the portable library, on the same elementwise
//! machinery as [`super::unary`]:
//!
//! * float math (integer and bool inputs become f32, as PyTorch): `reciprocal`, `erf`,
//!   `expm1`, `log10`, `log1p`, `log2`, `tan`, `sinh`, `cosh`, `asin`, `acos`, `atan`,
//!   `asinh`, `acosh`, `atanh`;
//! * dtype-keeping rounding: `ceil`, `floor`, `round` (half to even), `trunc` (the
//!   identity on integers) and `sign`;
//! * the float tests `isnan` and `isinf` (bool out);
//! * activations with parameters: `leaky_relu(negative_slope)` and
//!   `elu(alpha, scale, input_scale)`;
//! * `logit(eps)` (float out).
//!
//! Float values are computed in f64 and rounded once into the compute type (f32 for
//! f32/f16/bf16, f64 for f64); integers stay in i64.

use etch_base::{Element, ScalarType};

use super::elementwise::dtype::{Bool8, is_supported, unsupported, with_compute};
use super::elementwise::num::Num;
use super::elementwise::promote::{check_can_cast, to_float};
use super::elementwise::{Operand, Spec, Src, map, zip1};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Registry, Scalar, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    macro_rules! float_op {
        ($($name:literal => $f:expr),* $(,)?) => {
            $(r.register(concat!("aten::", $name, ".out"), |c, a| float_unary(c, a, $f));)*
        };
    }
    float_op!(
        "reciprocal" => |x| 1.0 / x,
        "erf" => libm::erf,
        "expm1" => f64::exp_m1,
        "log10" => f64::log10,
        "log1p" => f64::ln_1p,
        "log2" => f64::log2,
        "tan" => f64::tan,
        "sinh" => f64::sinh,
        "cosh" => f64::cosh,
        "asin" => f64::asin,
        "acos" => f64::acos,
        "atan" => f64::atan,
        "asinh" => f64::asinh,
        "acosh" => f64::acosh,
        "atanh" => f64::atanh,
    );
    macro_rules! keep_op {
        ($($name:literal => $f:expr, $int:expr);* $(;)?) => {
            $(r.register(concat!("aten::", $name, ".out"), |c, a| keep_unary(c, a, $f, $int));)*
        };
    }
    keep_op!(
        "ceil" => f64::ceil, |v| v;
        "floor" => f64::floor, |v| v;
        "round" => f64::round_ties_even, |v| v;
        "trunc" => f64::trunc, |v| v;
        "sign" => float_sign, i64::signum;
    );
    r.register("aten::isnan.out", |c, a| float_test(c, a, f64::is_nan));
    r.register("aten::isinf.out", |c, a| float_test(c, a, f64::is_infinite));
    r.register("aten::leaky_relu.out", leaky_relu);
    r.register("aten::elu.out", elu);
    r.register("aten::logit.out", logit);
}

/// `sign` of a float: -1, 0 (keeping the zero's sign) or 1; NaN stays NaN.
fn float_sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x
    }
}

op_args! {
    /// `op.out(Tensor self, *, Tensor(a!) out)`.
    struct UnaryMathArgs = "aten::<unary math>.out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

/// Writes `float(x)` (floats) or `int(x)` (integers) of every element of `x` into
/// `out`, computing in the compute type of `common`.
fn apply(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    (x, out): (Tensor, OutArg),
    common: ScalarType,
    float: impl Fn(f64) -> f64 + Sync + Copy,
    int: impl Fn(i64) -> i64 + Sync + Copy,
) -> Result<(), KernelError> {
    if !is_supported(x.dtype()) {
        return Err(unsupported(x.dtype(), "unary ops"));
    }
    let out = out.resize(a, x.sizes())?;
    check_can_cast(common, out.dtype())?;
    let spec = Spec {
        common,
        narrow_result: true,
    };
    let ins = [Operand::Tensor(x)];
    with_compute!(common, C => {
        if C::FLOAT {
            map::<1, C, C, _>(ctx, &ins, &out, spec, |s: &[Src<'_, C>; 1], o: &mut [C]| {
                zip1(s[0], o, |v: C| C::from_f64(float(v.to_f64())))
            })
        } else {
            map::<1, i64, i64, _>(ctx, &ins, &out, spec, |s: &[Src<'_, i64>; 1], o: &mut [i64]| {
                zip1(s[0], o, int)
            })
        }
    })
}

/// `op.out(self, *, out)` of a float function.
fn float_unary(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    f: impl Fn(f64) -> f64 + Sync + Copy,
) -> Result<(), KernelError> {
    let UnaryMathArgs { input, out } = UnaryMathArgs::unpack(a)?;
    let common = to_float(input.dtype());
    // Never reached: `common` is a float dtype.
    let int = |v: i64| v;
    apply(ctx, a, (input, out), common, f, int)
}

/// `op.out(self, *, out)` of a function that keeps the dtype.
fn keep_unary(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    float: impl Fn(f64) -> f64 + Sync + Copy,
    int: impl Fn(i64) -> i64 + Sync + Copy,
) -> Result<(), KernelError> {
    let UnaryMathArgs { input, out } = UnaryMathArgs::unpack(a)?;
    let dtype = input.dtype();
    if dtype == ScalarType::Bool {
        return Err(KernelError::UnsupportedDtype {
            dtype,
            what: "rounding and sign of bool",
        });
    }
    apply(ctx, a, (input, out), dtype, float, int)
}

/// `isnan.out` / `isinf.out`: a bool per element (always false for integers).
fn float_test(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    f: impl Fn(f64) -> bool + Sync + Copy,
) -> Result<(), KernelError> {
    let UnaryMathArgs { input: x, out } = UnaryMathArgs::unpack(a)?;
    if !is_supported(x.dtype()) {
        return Err(unsupported(x.dtype(), "isnan/isinf"));
    }
    let out = out.resize(a, x.sizes())?;
    if out.dtype() != ScalarType::Bool {
        return Err(KernelError::UnsupportedDtype {
            dtype: out.dtype(),
            what: "isnan/isinf out (bool only)",
        });
    }
    let spec = Spec {
        common: ScalarType::Double,
        narrow_result: false,
    };
    map::<1, f64, Bool8, _>(ctx, &[Operand::Tensor(x)], &out, spec, |s, o| {
        zip1(s[0], o, |v| Bool8(f(v) as u8))
    })
}

/// The dtype of a float-only op's input.
fn float_input(x: &Tensor, what: &'static str) -> Result<ScalarType, KernelError> {
    let dtype = x.dtype();
    if dtype.is_floating_point() {
        Ok(dtype)
    } else {
        Err(KernelError::UnsupportedDtype { dtype, what })
    }
}

op_args! {
    /// `leaky_relu.out(Tensor self, Scalar negative_slope=0.01, *, Tensor(a!) out)`.
    struct LeakyReluArgs = "aten::leaky_relu.out" {
        input: Tensor,
        negative_slope: Scalar,
        out: OutArg,
    } returns 1
}

fn leaky_relu(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let LeakyReluArgs {
        input,
        negative_slope,
        out,
    } = LeakyReluArgs::unpack(a)?;
    let dtype = float_input(&input, "leaky_relu (floating point only)")?;
    let slope = negative_slope.cast::<f64>();
    let f = move |x: f64| if x > 0.0 { x } else { x * slope };
    apply(ctx, a, (input, out), dtype, f, |v| v)
}

op_args! {
    /// `elu.out(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1, *,
    /// Tensor(a!) out)`: `x > 0 ? x * scale : alpha * scale * (exp(x * input_scale) - 1)`.
    struct EluArgs = "aten::elu.out" {
        input: Tensor,
        alpha: Scalar,
        scale: Scalar,
        input_scale: Scalar,
        out: OutArg,
    } returns 1
}

fn elu(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let EluArgs {
        input,
        alpha,
        scale,
        input_scale,
        out,
    } = EluArgs::unpack(a)?;
    let dtype = float_input(&input, "elu (floating point only)")?;
    let (alpha, scale, input_scale) = (
        alpha.cast::<f64>(),
        scale.cast::<f64>(),
        input_scale.cast::<f64>(),
    );
    let f = move |x: f64| {
        if x > 0.0 {
            x * scale
        } else {
            alpha * scale * (x * input_scale).exp_m1()
        }
    };
    apply(ctx, a, (input, out), dtype, f, |v| v)
}

op_args! {
    /// `logit.out(Tensor self, float? eps=None, *, Tensor(a!) out)`: `log(x / (1 - x))`
    /// of `x` clamped to `[eps, 1 - eps]` when `eps` is given and not negative (as
    /// PyTorch; outside `[0, 1]` the result is NaN). Integer inputs give floats.
    struct LogitArgs = "aten::logit.out" {
        input: Tensor,
        eps: Option<f64>,
        out: OutArg,
    } returns 1
}

fn logit(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let LogitArgs { input, eps, out } = LogitArgs::unpack(a)?;
    if input.dtype() == ScalarType::Bool {
        return Err(KernelError::UnsupportedDtype {
            dtype: input.dtype(),
            what: "logit of bool",
        });
    }
    let common = to_float(input.dtype());
    let clamp = eps.filter(|&e| e >= 0.0);
    let f = move |x: f64| {
        let x = match clamp {
            Some(e) if x < e => e,
            Some(e) if x > 1.0 - e => 1.0 - e,
            _ => x,
        };
        (x / (1.0 - x)).ln()
    };
    apply(ctx, a, (input, out), common, f, |v| v)
}

#[cfg(test)]
mod tests;
