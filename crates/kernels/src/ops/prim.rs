//! Primitive ops on symbolic ints and views: `sym_size`, `_local_scalar_dense`, the
//! `executorch_prim` scalar arithmetic, and the aliasing `et_view`.

use etch_base::ScalarType;
use half::{bf16, f16};

use crate::ops::same_dtype;
use crate::schema::{OpArgs, OutArg, ResultSlot, op_args};
use crate::{
    Args, EValue, IntList, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor,
};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::sym_size.int", sym_size);
    r.register("aten::sym_numel", sym_numel);
    r.register("aten::_local_scalar_dense", local_scalar_dense);
    r.register("executorch_prim::et_view.default", et_view);
    r.register("executorch_prim::add.Scalar", |_, a| binary(a, Op::Add));
    r.register("executorch_prim::sub.Scalar", |_, a| binary(a, Op::Sub));
    r.register("executorch_prim::mul.Scalar", |_, a| binary(a, Op::Mul));
    r.register("executorch_prim::floordiv.Scalar", |_, a| {
        binary(a, Op::FloorDiv)
    });
    r.register("executorch_prim::floordiv.int", |_, a| {
        binary(a, Op::FloorDiv)
    });
    r.register("executorch_prim::truediv.Scalar", |_, a| {
        binary(a, Op::TrueDiv)
    });
    r.register("executorch_prim::mod.Scalar", |_, a| binary(a, Op::Mod));
    r.register("executorch_prim::mod.int", |_, a| binary(a, Op::Mod));
    r.register("executorch_prim::sym_max.Scalar", |_, a| binary(a, Op::Max));
    r.register("executorch_prim::sym_min.Scalar", |_, a| binary(a, Op::Min));
    r.register("executorch_prim::eq.Scalar", |_, a| {
        compare(a, |o| o.is_eq())
    });
    r.register("executorch_prim::gt.Scalar", |_, a| {
        compare(a, |o| o.is_gt())
    });
    r.register("executorch_prim::lt.Scalar", |_, a| {
        compare(a, |o| o.is_lt())
    });
    r.register("executorch_prim::ge.Scalar", |_, a| {
        compare(a, |o| o.is_ge())
    });
    r.register("executorch_prim::le.Scalar", |_, a| {
        compare(a, |o| o.is_le())
    });
    r.register("executorch_prim::neg.Scalar", neg);
    r.register("executorch_prim::sym_float.Scalar", sym_float);
    r.register("executorch_prim::ceil.Scalar", |_, a| {
        rounding(a, f64::ceil)
    });
    r.register("executorch_prim::round.Scalar", |_, a| {
        rounding(a, f64::round_ties_even)
    });
    r.register("executorch_prim::trunc.Scalar", |_, a| {
        rounding(a, f64::trunc)
    });
}

op_args! {
    /// `sym_size.int(Tensor self, int dim) -> SymInt`.
    struct SymSizeArgs = "aten::sym_size.int" {
        input: Tensor,
        dim: i64,
        result: ResultSlot,
    } returns 0
}

fn sym_size(_: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SymSizeArgs { input, dim, result } = SymSizeArgs::unpack(a)?;
    let size = input.size(dim)?;
    result.set(a, EValue::Int(size as i64))
}

op_args! {
    /// `sym_numel(Tensor self) -> SymInt`.
    struct SymNumelArgs = "aten::sym_numel" {
        input: Tensor,
        result: ResultSlot,
    } returns 0
}

fn sym_numel(_: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SymNumelArgs { input, result } = SymNumelArgs::unpack(a)?;
    result.set(a, EValue::Int(input.numel() as i64))
}

op_args! {
    /// `_local_scalar_dense(Tensor self) -> Scalar`: element 0 as a scalar (`.item()`).
    struct LocalScalarDenseArgs = "aten::_local_scalar_dense" {
        input: Tensor,
        result: ResultSlot,
    } returns 0
}

fn local_scalar_dense(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let LocalScalarDenseArgs { input: t, result } = LocalScalarDenseArgs::unpack(a)?;
    if t.numel() == 0 {
        return Err(KernelError::invalid("item() of an empty tensor"));
    }
    let v = match t.dtype() {
        ScalarType::Long => EValue::Int(ctx.read::<i64>(&t)?[0]),
        ScalarType::Int => EValue::Int(ctx.read::<i32>(&t)?[0] as i64),
        ScalarType::Short => EValue::Int(ctx.read::<i16>(&t)?[0] as i64),
        ScalarType::Char => EValue::Int(ctx.read::<i8>(&t)?[0] as i64),
        ScalarType::Byte => EValue::Int(ctx.read::<u8>(&t)?[0] as i64),
        ScalarType::Bool => EValue::Bool(ctx.read_raw::<u8>(&t)?[0] != 0),
        ScalarType::Float => EValue::Double(ctx.read::<f32>(&t)?[0] as f64),
        ScalarType::Double => EValue::Double(ctx.read::<f64>(&t)?[0]),
        ScalarType::Half => EValue::Double(ctx.read::<f16>(&t)?[0].to_f64()),
        ScalarType::BFloat16 => EValue::Double(ctx.read::<bf16>(&t)?[0].to_f64()),
        dtype => {
            return Err(KernelError::UnsupportedDtype {
                dtype,
                what: "_local_scalar_dense",
            });
        }
    };
    result.set(a, v)
}

op_args! {
    /// `et_view.default(Tensor self, int[] size) -> Tensor`: the returned tensor (`out`,
    /// planned by the emitter) aliases `self`'s bytes with new sizes.
    struct EtViewArgs<'a> = "executorch_prim::et_view.default" {
        input: Tensor,
        size: IntList<'a>,
        out: OutArg,
    } returns 0
}

fn et_view(_: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let EtViewArgs { input, size, out } = EtViewArgs::unpack(a)?;
    let mut buf = [0i64; MAX_RANK];
    let requested = size.read_into(&mut buf)?;
    let mut sizes = [0usize; MAX_RANK];
    let sizes = infer_view_sizes(requested, input.numel(), &mut sizes)?;
    let mut view = out.tensor();
    same_dtype(&view, &input)?;
    view.resize(sizes)?;
    if view.numel() != input.numel() {
        return Err(KernelError::invalid(format!(
            "view of {} elements as {:?}",
            input.numel(),
            sizes
        )));
    }
    view.set_data(input.data());
    out.set(a, view)
}

/// Resolves one `-1` in a view's sizes from the element count.
pub fn infer_view_sizes<'b>(
    requested: &[i64],
    numel: usize,
    buf: &'b mut [usize; MAX_RANK],
) -> Result<&'b [usize], KernelError> {
    let mut infer_at = None;
    let mut known = 1usize;
    for (i, &s) in requested.iter().enumerate() {
        if s == -1 {
            if infer_at.replace(i).is_some() {
                return Err(KernelError::invalid("only one view dimension may be -1"));
            }
        } else if s < 0 {
            return Err(KernelError::invalid(format!("invalid view size {s}")));
        } else {
            buf[i] = s as usize;
            known = known
                .checked_mul(s as usize)
                .ok_or_else(|| KernelError::invalid("view sizes overflow"))?;
        }
    }
    if let Some(i) = infer_at {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(KernelError::invalid(format!(
                "cannot infer view size: {numel} elements over {known}"
            )));
        }
        buf[i] = numel / known;
    }
    Ok(&buf[..requested.len()])
}

#[derive(Clone, Copy)]
enum Op {
    Add,
    Sub,
    Mul,
    FloorDiv,
    TrueDiv,
    Mod,
    Max,
    Min,
}

op_args! {
    /// `op.Scalar(Scalar a, Scalar b) -> Scalar` (`add`, `sub`, `mul`, `floordiv`,
    /// `truediv`, `sym_max`, `sym_min`; `floordiv.int` and `mod` take `SymInt`s, which
    /// read as Scalars) and the comparisons `op.Scalar(Scalar a, Scalar b) -> bool`.
    struct BinaryScalarArgs = "executorch_prim::<binary>.Scalar" {
        a: Scalar,
        b: Scalar,
        result: ResultSlot,
    } returns 0
}

op_args! {
    /// `op.Scalar(Scalar a) -> Scalar` (`neg`, `sym_float`, `ceil`, `round`, `trunc`).
    struct UnaryScalarArgs = "executorch_prim::<unary>.Scalar" {
        a: Scalar,
        result: ResultSlot,
    } returns 0
}

fn binary(a: &mut Args<'_>, op: Op) -> Result<(), KernelError> {
    let BinaryScalarArgs { a: x, b: y, result } = BinaryScalarArgs::unpack(a)?;
    let value = match (x, y, op) {
        (_, _, Op::TrueDiv) => EValue::Double(x.to_f64() / y.to_f64()),
        (Scalar::Double(_), _, _) | (_, Scalar::Double(_), _) => {
            let (p, q) = (x.to_f64(), y.to_f64());
            EValue::Double(match op {
                Op::Add => p + q,
                Op::Sub => p - q,
                Op::Mul => p * q,
                Op::FloorDiv => (p / q).floor(),
                Op::Mod => p - q * (p / q).floor(),
                Op::Max => p.max(q),
                Op::Min => p.min(q),
                Op::TrueDiv => p / q,
            })
        }
        _ => {
            let (p, q) = (x.to_i64(), y.to_i64());
            let zero_div = || KernelError::invalid("integer division by zero");
            EValue::Int(match op {
                Op::Add => p.wrapping_add(q),
                Op::Sub => p.wrapping_sub(q),
                Op::Mul => p.wrapping_mul(q),
                Op::FloorDiv => {
                    if q == 0 {
                        return Err(zero_div());
                    }
                    p.wrapping_div_euclid(q) - i64::from(q < 0 && p.rem_euclid(q) != 0)
                }
                Op::Mod => {
                    if q == 0 {
                        return Err(zero_div());
                    }
                    let r = p.wrapping_rem(q);
                    if r != 0 && ((r < 0) != (q < 0)) {
                        r + q
                    } else {
                        r
                    }
                }
                Op::Max => p.max(q),
                Op::Min => p.min(q),
                Op::TrueDiv => unreachable!("handled above"),
            })
        }
    };
    result.set(a, value)
}

fn compare(a: &mut Args<'_>, pick: fn(std::cmp::Ordering) -> bool) -> Result<(), KernelError> {
    let BinaryScalarArgs { a: x, b: y, result } = BinaryScalarArgs::unpack(a)?;
    let ord = match (x, y) {
        (Scalar::Double(_), _) | (_, Scalar::Double(_)) => x
            .to_f64()
            .partial_cmp(&y.to_f64())
            .map(pick)
            .unwrap_or(false),
        _ => pick(x.to_i64().cmp(&y.to_i64())),
    };
    result.set(a, EValue::Bool(ord))
}

fn neg(_: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let UnaryScalarArgs { a: x, result } = UnaryScalarArgs::unpack(a)?;
    let v = match x {
        Scalar::Double(d) => EValue::Double(-d),
        s => EValue::Int(s.to_i64().wrapping_neg()),
    };
    result.set(a, v)
}

fn sym_float(_: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let UnaryScalarArgs { a: x, result } = UnaryScalarArgs::unpack(a)?;
    result.set(a, EValue::Double(x.to_f64()))
}

fn rounding(a: &mut Args<'_>, f: fn(f64) -> f64) -> Result<(), KernelError> {
    let UnaryScalarArgs { a: x, result } = UnaryScalarArgs::unpack(a)?;
    let v = match x {
        Scalar::Double(d) => EValue::Int(f(d) as i64),
        s => EValue::Int(s.to_i64()),
    };
    result.set(a, v)
}

#[cfg(test)]
mod tests {
    use crate::EValue;
    use crate::testing::Harness;
    use etch_base::ScalarType;

    #[test]
    fn scalar_arithmetic() {
        let mut h = Harness::new();
        let cases = [
            ("executorch_prim::add.Scalar", 7, 3, EValue::Int(10)),
            ("executorch_prim::sub.Scalar", 7, 3, EValue::Int(4)),
            ("executorch_prim::floordiv.Scalar", -7, 2, EValue::Int(-4)),
            ("executorch_prim::mod.Scalar", -7, 3, EValue::Int(2)),
            ("executorch_prim::truediv.Scalar", 7, 2, EValue::Double(3.5)),
            ("executorch_prim::lt.Scalar", 2, 3, EValue::Bool(true)),
        ];
        for (op, x, y, want) in cases {
            let (a, b, o) = (h.int(x), h.int(y), h.none());
            h.call(op, &[a, b, o]).unwrap();
            assert_eq!(h.value(o), &want, "{op}");
        }
        let (a, b, o) = (h.int(1), h.int(0), h.none());
        assert!(
            h.call("executorch_prim::floordiv.Scalar", &[a, b, o])
                .is_err()
        );
    }

    #[test]
    fn et_view_aliases_and_infers() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &[0f32, 1., 2., 3., 4., 5.]);
        let size = h.int_list(&[3, -1]);
        let out = h.out(ScalarType::Float, &[6, 1]);
        h.call("executorch_prim::et_view.default", &[x, size, out])
            .unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[3, 2]);
        assert_eq!(h.tensor_meta(out).data(), h.tensor_meta(x).data());
        let bad = h.int_list(&[4, -1]);
        assert!(
            h.call("executorch_prim::et_view.default", &[x, bad, out])
                .is_err()
        );
    }

    #[test]
    fn item_and_sym_size() {
        let mut h = Harness::new();
        let x = h.tensor(&[1], &[5i64]);
        let o = h.none();
        h.call("aten::_local_scalar_dense", &[x, o]).unwrap();
        assert_eq!(h.value(o), &EValue::Int(5));
        let d = h.int(-1);
        h.call("aten::sym_size.int", &[x, d, o]).unwrap();
        assert_eq!(h.value(o), &EValue::Int(1));
    }
}
