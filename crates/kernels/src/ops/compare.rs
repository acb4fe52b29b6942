//! Comparisons `eq`, `ne`, `lt`, `le`, `gt`, `ge` (Tensor and Scalar overloads):
//! operands broadcast and are compared in their promoted dtype; the bool result is
//! cast to the out dtype (bool by default, any dtype allowed).

use super::elementwise::dtype::{Bool8, with_compute};
use super::elementwise::num::Num;
use super::elementwise::promote::ResultType;
use super::elementwise::{Operand, Spec, Src, broadcast_operands, map, zip2};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    macro_rules! both {
        ($name:literal, $cmp:expr) => {
            r.register(concat!("aten::", $name, ".Tensor_out"), |c, a| {
                compare(c, a, $cmp, false)
            });
            r.register(concat!("aten::", $name, ".Scalar_out"), |c, a| {
                compare(c, a, $cmp, true)
            });
        };
    }
    both!("eq", Cmp::Eq);
    both!("ne", Cmp::Ne);
    both!("lt", Cmp::Lt);
    both!("le", Cmp::Le);
    both!("gt", Cmp::Gt);
    both!("ge", Cmp::Ge);
}

/// A comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

op_args! {
    /// `op.Tensor_out(Tensor self, Tensor other, *, Tensor(a!) out)`.
    struct CompareTensorArgs = "aten::<eq|ne|lt|le|gt|ge>.Tensor_out" {
        input: Tensor,
        other: Tensor,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `op.Scalar_out(Tensor self, Scalar other, *, Tensor(a!) out)`.
    struct CompareScalarArgs = "aten::<eq|ne|lt|le|gt|ge>.Scalar_out" {
        input: Tensor,
        other: Scalar,
        out: OutArg,
    } returns 1
}

/// `op.Tensor_out` / `op.Scalar_out`.
fn compare(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    op: Cmp,
    scalar: bool,
) -> Result<(), KernelError> {
    let (x, y, out) = if scalar {
        let CompareScalarArgs { input, other, out } = CompareScalarArgs::unpack(a)?;
        (Operand::Tensor(input), Operand::Scalar(other), out)
    } else {
        let CompareTensorArgs { input, other, out } = CompareTensorArgs::unpack(a)?;
        (Operand::Tensor(input), Operand::Tensor(other), out)
    };
    let common = ResultType::new().operand(&x)?.operand(&y)?.finish()?;
    let ins = [x, y];
    let mut buf = [0usize; MAX_RANK];
    let sizes = broadcast_operands(&ins, &mut buf)?;
    let out = out.resize(a, sizes)?;
    if !super::elementwise::dtype::is_supported(out.dtype()) {
        return Err(super::elementwise::dtype::unsupported(
            out.dtype(),
            "comparison out",
        ));
    }
    let spec = Spec {
        common,
        narrow_result: false,
    };
    with_compute!(common, C => run::<C>(ctx, &ins, &out, spec, op))
}

fn run<C: Num>(
    ctx: &KernelContext<'_>,
    ins: &[Operand; 2],
    out: &crate::Tensor,
    spec: Spec,
    op: Cmp,
) -> Result<(), KernelError> {
    macro_rules! go {
        ($f:expr) => {
            map::<2, C, Bool8, _>(
                ctx,
                ins,
                out,
                spec,
                |s: &[Src<'_, C>; 2], o: &mut [Bool8]| {
                    zip2(s[0], s[1], o, |x: C, y: C| Bool8($f(x, y) as u8))
                },
            )
        };
    }
    match op {
        Cmp::Eq => go!(|x: C, y: C| x == y),
        Cmp::Ne => go!(|x: C, y: C| x != y),
        Cmp::Lt => go!(|x: C, y: C| x < y),
        Cmp::Le => go!(|x: C, y: C| x <= y),
        Cmp::Gt => go!(|x: C, y: C| x > y),
        Cmp::Ge => go!(|x: C, y: C| x >= y),
    }
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ops::elementwise::testutil::{
        DTYPES, Lcg, bcast_index, broadcast_pair, read, round_through, small_ints, tensor,
    };
    use crate::testing::Harness;

    const NAMES: [&str; 6] = ["eq", "ne", "lt", "le", "gt", "ge"];

    fn cmp(op: usize, x: f64, y: f64) -> bool {
        match op {
            0 => x == y,
            1 => x != y,
            2 => x < y,
            3 => x <= y,
            4 => x > y,
            _ => x >= y,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn tensor_tensor(da in 0usize..10, db in 0usize..10, op in 0usize..6, (out_shape, sa, sb) in broadcast_pair(), seed in any::<u64>(), out_float in any::<bool>()) {
            let (da, db) = (DTYPES[da], DTYPES[db]);
            let mut rng = Lcg(seed);
            let va = small_ints(&mut rng, da, sa.iter().product());
            let vb = small_ints(&mut rng, db, sb.iter().product());
            let mut h = Harness::new();
            let a = tensor(&mut h, da, &sa, &va);
            let b = tensor(&mut h, db, &sb, &vb);
            let od = if out_float { ScalarType::Float } else { ScalarType::Bool };
            let out = h.out(od, &out_shape);
            h.call(&format!("aten::{}.Tensor_out", NAMES[op]), &[a, b, out, out]).unwrap();
            let common = crate::ops::elementwise::promote::ResultType::new()
                .tensor(&h.tensor_meta(a)).unwrap()
                .tensor(&h.tensor_meta(b)).unwrap()
                .finish().unwrap();
            let n: usize = out_shape.iter().product();
            let want: Vec<f64> = (0..n).map(|i| {
                let x = round_through(common, round_through(da, va[bcast_index(&out_shape, &sa, i)]));
                let y = round_through(common, round_through(db, vb[bcast_index(&out_shape, &sb, i)]));
                cmp(op, x, y) as u8 as f64
            }).collect();
            prop_assert_eq!(read(&mut h, out), want);
        }
    }

    #[test]
    fn scalar_overloads_and_promotion() {
        let mut h = Harness::new();
        let x = tensor(&mut h, ScalarType::Int, &[4], &[1.0, 2.0, 3.0, -1.0]);
        let two = h.int(2);
        let out = h.out(ScalarType::Bool, &[4]);
        h.call("aten::eq.Scalar_out", &[x, two, out, out]).unwrap();
        assert_eq!(read(&mut h, out), vec![0.0, 1.0, 0.0, 0.0]);
        // 2.5 promotes the comparison to float: nothing equals it, 3 > 2.5.
        let f = h.double(2.5);
        h.call("aten::gt.Scalar_out", &[x, f, out, out]).unwrap();
        assert_eq!(read(&mut h, out), vec![0.0, 0.0, 1.0, 0.0]);
        let nan = h.double(f64::NAN);
        let xf = tensor(&mut h, ScalarType::Float, &[4], &[1.0, f64::NAN, 0.0, 2.0]);
        h.call("aten::ne.Scalar_out", &[xf, nan, out, out]).unwrap();
        assert_eq!(read(&mut h, out), vec![1.0; 4]);
        h.call("aten::le.Tensor_out", &[xf, xf, out, out]).unwrap();
        assert_eq!(read(&mut h, out), vec![1.0, 0.0, 1.0, 1.0]);
        // Bad calls.
        let y = tensor(&mut h, ScalarType::Float, &[3], &[0.0; 3]);
        assert!(h.call("aten::eq.Tensor_out", &[xf, y, out, out]).is_err());
        assert!(h.call("aten::eq.Tensor_out", &[xf, two, out, out]).is_err());
        assert!(h.call("aten::eq.Scalar_out", &[xf, two, out]).is_err());
        let q = h.tensor_raw(ScalarType::QInt8, &[4], &[0; 4]);
        assert!(h.call("aten::eq.Scalar_out", &[xf, two, q, q]).is_err());
    }

    #[test]
    fn large_compare_on_a_pool() {
        let mut h = crate::ops::elementwise::testutil::harness(2);
        let mut rng = Lcg(1);
        let n = 70_000;
        let v = rng.vec(n, 1.0);
        let x = tensor(&mut h, ScalarType::Float, &[n], &v);
        let z = h.double(0.0);
        let out = h.out(ScalarType::Bool, &[n]);
        h.call("aten::lt.Scalar_out", &[x, z, out, out]).unwrap();
        let want: Vec<f64> = v.iter().map(|&x| ((x as f32) < 0.0) as u8 as f64).collect();
        assert_eq!(read(&mut h, out), want);
    }
}
