//! Unary elementwise kernels: activations (`relu`, `gelu`, `silu`, `sigmoid`, `tanh`,
//! `hardtanh`), math (`neg`, `abs`, `exp`, `log`, `sqrt`, `rsqrt`, `sin`, `cos`),
//! `clamp`, and the logical/bitwise `not`s.
//!
//! Float-only ops take integer and bool inputs as the default float dtype (f32);
//! f16/bf16 compute in f32 and round once on store. The out dtype decides the stored
//! type, within PyTorch's casting rules.

use etch_base::ScalarType;

use super::elementwise::args_form::args_form;
use super::elementwise::dtype::{Bool8, with_compute};
use super::elementwise::num::Num;
use super::elementwise::promote::{ResultType, check_can_cast, to_float};
use super::elementwise::{Operand, Spec, Src, map, zip1, zip3};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Registry, Scalar, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::relu.out", |c, a| unary(c, a, U::Relu));
    r.register("aten::silu.out", |c, a| unary(c, a, U::Silu));
    r.register("aten::sigmoid.out", |c, a| unary(c, a, U::Sigmoid));
    r.register("aten::tanh.out", |c, a| unary(c, a, U::Tanh));
    r.register("aten::neg.out", |c, a| unary(c, a, U::Neg));
    r.register("aten::abs.out", |c, a| unary(c, a, U::Abs));
    r.register("aten::exp.out", |c, a| unary(c, a, U::Exp));
    r.register("aten::log.out", |c, a| unary(c, a, U::Log));
    r.register("aten::sqrt.out", |c, a| unary(c, a, U::Sqrt));
    r.register("aten::rsqrt.out", |c, a| unary(c, a, U::Rsqrt));
    r.register("aten::sin.out", |c, a| unary(c, a, U::Sin));
    r.register("aten::cos.out", |c, a| unary(c, a, U::Cos));
    r.register("aten::bitwise_not.out", |c, a| unary(c, a, U::BitNot));
    r.register("aten::gelu.out", gelu);
    r.register("aten::logical_not.out", logical_not);
    r.register("aten::clamp.out", clamp_scalars::<ClampArgs>);
    r.register("aten::clamp.Tensor_out", clamp_tensor);
    r.register("aten::hardtanh.out", clamp_scalars::<HardtanhArgs>);
}

/// A unary op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum U {
    Relu,
    Silu,
    Sigmoid,
    Tanh,
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    BitNot,
    GeluErf,
    GeluTanh,
}

impl U {
    /// The result dtype for an input of `dtype`.
    fn result(self, dtype: ScalarType) -> Result<ScalarType, KernelError> {
        let refuse = |what| Err(KernelError::UnsupportedDtype { dtype, what });
        match self {
            U::Relu | U::Neg | U::Abs if dtype == ScalarType::Bool => {
                refuse("relu/neg/abs of bool")
            }
            U::Relu | U::Neg | U::Abs => Ok(dtype),
            U::BitNot if dtype.is_floating_point() => refuse("bitwise_not (integers and bool)"),
            U::BitNot => Ok(dtype),
            _ => Ok(to_float(dtype)),
        }
    }
}

op_args! {
    /// `op.out(Tensor self, *, Tensor(a!) out)`.
    struct UnaryArgs = "aten::<unary>.out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

fn unary(ctx: &KernelContext<'_>, a: &mut Args<'_>, op: U) -> Result<(), KernelError> {
    let UnaryArgs { input, out } = UnaryArgs::unpack(a)?;
    run_unary(ctx, a, input, op, out)
}

fn run_unary(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    x: Tensor,
    op: U,
    out: OutArg,
) -> Result<(), KernelError> {
    if !super::elementwise::dtype::is_supported(x.dtype()) {
        return Err(super::elementwise::dtype::unsupported(
            x.dtype(),
            "unary ops",
        ));
    }
    let common = op.result(x.dtype())?;
    let out = out.resize(a, x.sizes())?;
    check_can_cast(common, out.dtype())?;
    let spec = Spec {
        common,
        narrow_result: true,
    };
    with_compute!(common, C => apply::<C>(ctx, x, &out, spec, op))
}

fn apply<C: Num>(
    ctx: &KernelContext<'_>,
    x: Tensor,
    out: &Tensor,
    spec: Spec,
    op: U,
) -> Result<(), KernelError> {
    let ins = [Operand::Tensor(x)];
    macro_rules! go {
        ($f:expr) => {
            map::<1, C, C, _>(ctx, &ins, out, spec, |s: &[Src<'_, C>; 1], o: &mut [C]| {
                zip1(s[0], o, $f)
            })
        };
    }
    match op {
        // As the portable kernel: NaN and -0.0 pass through (`v >= 0`).
        U::Relu => go!(|v: C| if v.is_nan() || v >= C::ZERO {
            v
        } else {
            C::ZERO
        }),
        U::Silu => go!(|v: C| v.div(C::ONE.add(v.neg().exp()))),
        U::Sigmoid => go!(|v: C| v.sigmoid()),
        U::Tanh => go!(|v: C| v.tanh()),
        U::Neg => go!(|v: C| v.neg()),
        U::Abs => go!(|v: C| v.abs()),
        U::Exp => go!(|v: C| v.exp()),
        U::Log => go!(|v: C| v.ln()),
        U::Sqrt => go!(|v: C| v.sqrt()),
        U::Rsqrt => go!(|v: C| v.rsqrt()),
        U::Sin => go!(|v: C| v.sin()),
        U::Cos => go!(|v: C| v.cos()),
        U::BitNot => {
            if x.dtype() == ScalarType::Bool {
                go!(|v: C| if v == C::ZERO { C::ONE } else { C::ZERO })
            } else {
                go!(|v: C| v.bitnot())
            }
        }
        U::GeluErf => {
            let half = C::from_f64(0.5);
            let inv_sqrt2 = C::from_f64(std::f64::consts::FRAC_1_SQRT_2);
            go!(|v: C| half.mul(v).mul(C::ONE.add(v.mul(inv_sqrt2).erf())))
        }
        U::GeluTanh => {
            let half = C::from_f64(0.5);
            let beta =
                C::from_f64(std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5);
            let kappa = C::from_f64(0.044715);
            go!(|v: C| {
                let cube = v.mul(v).mul(v);
                let inner = beta.mul(v.add(kappa.mul(cube)));
                half.mul(v).mul(C::ONE.add(inner.tanh()))
            })
        }
    }
}

op_args! {
    /// `gelu.out(Tensor self, *, str approximate="none", Tensor(a!) out)`.
    struct GeluArgs<'a> = "aten::gelu.out" {
        input: Tensor,
        approximate: &'a str,
        out: OutArg,
    } returns 1
}

fn gelu(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let GeluArgs {
        input,
        approximate,
        out,
    } = GeluArgs::unpack(a)?;
    let op = match approximate {
        "none" => U::GeluErf,
        "tanh" => U::GeluTanh,
        other => {
            return Err(KernelError::invalid(format!(
                "gelu: approximate must be 'none' or 'tanh', got '{other}'"
            )));
        }
    };
    if !input.dtype().is_floating_point() {
        return Err(KernelError::UnsupportedDtype {
            dtype: input.dtype(),
            what: "gelu (floating point only)",
        });
    }
    run_unary(ctx, a, input, op, out)
}

/// `logical_not.out(Tensor self, *, Tensor(a!) out)`: `x == 0`, into any out dtype.
fn logical_not(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let UnaryArgs { input: x, out } = UnaryArgs::unpack(a)?;
    let out = out.resize(a, x.sizes())?;
    let spec = Spec {
        common: ScalarType::Double,
        narrow_result: false,
    };
    map::<1, f64, Bool8, _>(ctx, &[Operand::Tensor(x)], &out, spec, |s, o| {
        zip1(s[0], o, |v| Bool8((v == 0.0) as u8))
    })
}

/// The arguments of `clamp.out` and `hardtanh.out`, in one form.
struct ScalarBounds {
    input: Tensor,
    min: Option<Scalar>,
    max: Option<Scalar>,
    /// The result keeps the input's dtype (`hardtanh`) rather than promoting it
    /// with the bounds (`clamp`).
    keep_dtype: bool,
    out: OutArg,
}

args_form! {
    ScalarBounds { input, out }:
    ClampArgs => |a| { min: a.min, max: a.max, keep_dtype: false };
    HardtanhArgs => |a| { min: Some(a.min_val), max: Some(a.max_val), keep_dtype: true };
}

/// Clamps the input (any shape) between the optional bounds of schema `S`: NaN stays
/// NaN, and when `min > max` every element becomes `max`.
fn clamp_scalars<S>(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError>
where
    S: for<'x> OpArgs<'x> + Into<ScalarBounds>,
{
    let ScalarBounds {
        input: x,
        min,
        max,
        keep_dtype,
        out,
    } = S::unpack(a)?.into();
    if min.is_none() && max.is_none() {
        return Err(KernelError::invalid(
            "clamp: at least one of 'min' or 'max' must not be None",
        ));
    }
    let common = if keep_dtype {
        x.dtype()
    } else {
        let mut rt = ResultType::new().tensor(&x)?;
        for s in [min, max].into_iter().flatten() {
            rt = rt.scalar(s)?;
        }
        rt.finish()?
    };
    if common == ScalarType::Bool {
        return Err(KernelError::UnsupportedDtype {
            dtype: common,
            what: "clamp of bool",
        });
    }
    if !super::elementwise::dtype::is_supported(common) {
        return Err(super::elementwise::dtype::unsupported(common, "clamp"));
    }
    let out = out.resize(a, x.sizes())?;
    check_can_cast(common, out.dtype())?;
    let spec = Spec {
        common,
        narrow_result: true,
    };
    with_compute!(common, C => {
        let lo = min.map(Scalar::cast::<C>);
        let hi = max.map(Scalar::cast::<C>);
        // The bounds are tested once per block, so each arm's loop has no branch and
        // vectorises.
        map::<1, C, C, _>(ctx, &[Operand::Tensor(x)], &out, spec, |s: &[Src<'_, C>; 1], o: &mut [C]| {
            match (lo, hi) {
                (Some(l), _) if l.is_nan() => o.fill(l),
                (_, Some(h)) if h.is_nan() => o.fill(h),
                (Some(l), Some(h)) => zip1(s[0], o, |v: C| at_most(at_least(v, l), h)),
                (Some(l), None) => zip1(s[0], o, |v: C| at_least(v, l)),
                (None, Some(h)) => zip1(s[0], o, |v: C| at_most(v, h)),
                (None, None) => zip1(s[0], o, |v: C| v),
            }
        })
    })
}

/// `v` clamped to the bounds present; a NaN bound is the result.
#[inline(always)]
fn clamp_one<C: Num>(v: C, lo: Option<C>, hi: Option<C>) -> C {
    match (lo, hi) {
        (Some(l), _) if l.is_nan() => l,
        (_, Some(h)) if h.is_nan() => h,
        (lo, hi) => {
            let r = lo.map_or(v, |l| at_least(v, l));
            hi.map_or(r, |h| at_most(r, h))
        }
    }
}

/// `v` raised to `l` (a NaN `v` stays NaN).
#[inline(always)]
fn at_least<C: Num>(v: C, l: C) -> C {
    if v < l { l } else { v }
}

/// `v` lowered to `h` (a NaN `v` stays NaN).
#[inline(always)]
fn at_most<C: Num>(v: C, h: C) -> C {
    if v > h { h } else { v }
}

op_args! {
    /// `clamp.out(Tensor self, Scalar? min=None, Scalar? max=None, *, Tensor(a!) out)`.
    struct ClampArgs = "aten::clamp.out" {
        input: Tensor,
        min: Option<Scalar>,
        max: Option<Scalar>,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `hardtanh.out(Tensor self, Scalar min_val=-1, Scalar max_val=1, *,
    /// Tensor(a!) out)`.
    struct HardtanhArgs = "aten::hardtanh.out" {
        input: Tensor,
        min_val: Scalar,
        max_val: Scalar,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `clamp.Tensor_out(Tensor self, Tensor? min=None, Tensor? max=None, *,
    /// Tensor(a!) out)`: bounds broadcast.
    struct ClampTensorArgs = "aten::clamp.Tensor_out" {
        input: Tensor,
        min: Option<Tensor>,
        max: Option<Tensor>,
        out: OutArg,
    } returns 1
}

fn clamp_tensor(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ClampTensorArgs {
        input: x,
        min,
        max,
        out,
    } = ClampTensorArgs::unpack(a)?;
    if min.is_none() && max.is_none() {
        return Err(KernelError::invalid(
            "clamp: at least one of 'min' or 'max' must not be None",
        ));
    }
    let mut rt = ResultType::new().tensor(&x)?;
    for t in [&min, &max].into_iter().flatten() {
        rt = rt.tensor(t)?;
    }
    let common = rt.finish()?;
    if common == ScalarType::Bool {
        return Err(KernelError::UnsupportedDtype {
            dtype: common,
            what: "clamp of bool",
        });
    }
    // A missing bound is the identity: clamp against x itself.
    let ins = [
        Operand::Tensor(x),
        Operand::Tensor(min.unwrap_or(x)),
        Operand::Tensor(max.unwrap_or(x)),
    ];
    let (has_lo, has_hi) = (min.is_some(), max.is_some());
    let mut buf = [0usize; crate::MAX_RANK];
    let sizes = super::elementwise::broadcast_operands(&ins, &mut buf)?;
    let out = out.resize(a, sizes)?;
    check_can_cast(common, out.dtype())?;
    let spec = Spec {
        common,
        narrow_result: true,
    };
    with_compute!(common, C => map::<3, C, C, _>(ctx, &ins, &out, spec, |s: &[Src<'_, C>; 3], o: &mut [C]| {
        zip3(s[0], s[1], s[2], o, |v: C, l: C, h: C| {
            clamp_one(v, has_lo.then_some(l), has_hi.then_some(h))
        })
    }))
}

#[cfg(test)]
mod tests;
