use etch_base::ScalarType;
use proptest::prelude::*;

use super::Op;
use crate::ops::elementwise::testutil::{
    DTYPES, Lcg, assert_close, assert_refused, bcast_index, broadcast_pair, harness, read,
    round_through, small_ints, tensor,
};
use crate::testing::Harness;
use crate::{EValue, KernelError};

/// PyTorch's result of `op` on two values already of the common dtype.
fn reference(op: Op, x: f64, y: f64, alpha: f64, common: ScalarType) -> f64 {
    let x = round_through(common, x);
    let y = round_through(common, y);
    let r = if common.is_floating_point() {
        match op {
            Op::Add => x + alpha * y,
            Op::Sub => x - alpha * y,
            Op::Rsub => y - alpha * x,
            Op::Mul => x * y,
            Op::Div => x / y,
            Op::DivTrunc => (x / y).trunc(),
            Op::DivFloor => (x / y).floor(),
            Op::Pow => x.powf(y),
            Op::Max => {
                if x.is_nan() || y.is_nan() {
                    f64::NAN
                } else {
                    x.max(y)
                }
            }
            Op::Min => {
                if x.is_nan() || y.is_nan() {
                    f64::NAN
                } else {
                    x.min(y)
                }
            }
            _ => unreachable!(),
        }
    } else {
        let (x, y, al) = (x as i64, y as i64, alpha as i64);
        (match op {
            Op::Add => x.wrapping_add(al.wrapping_mul(y)),
            Op::Sub => x.wrapping_sub(al.wrapping_mul(y)),
            Op::Rsub => y.wrapping_sub(al.wrapping_mul(x)),
            Op::Mul => x.wrapping_mul(y),
            Op::DivTrunc => x / y,
            Op::DivFloor => x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0),
            Op::Max => x.max(y),
            Op::Min => x.min(y),
            Op::BitAnd => x & y,
            Op::BitOr => x | y,
            Op::BitXor => x ^ y,
            _ => unreachable!(),
        }) as f64
    };
    round_through(common, r)
}

fn run(
    h: &mut Harness,
    name: &str,
    a: usize,
    b: usize,
    alpha: Option<usize>,
    out: usize,
) -> Result<(), KernelError> {
    match alpha {
        Some(al) => h.call(name, &[a, b, al, out, out]),
        None => h.call(name, &[a, b, out, out]),
    }
}

fn op_name(op: Op) -> (&'static str, bool) {
    match op {
        Op::Add => ("aten::add.out", true),
        Op::Sub => ("aten::sub.out", true),
        Op::Mul => ("aten::mul.out", false),
        Op::Div => ("aten::div.out", false),
        Op::Max => ("aten::maximum.out", false),
        Op::Min => ("aten::minimum.out", false),
        Op::BitAnd => ("aten::bitwise_and.Tensor_out", false),
        Op::BitOr => ("aten::bitwise_or.Tensor_out", false),
        Op::BitXor => ("aten::bitwise_xor.Tensor_out", false),
        Op::Pow => ("aten::pow.Tensor_Tensor_out", false),
        _ => unreachable!(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// f32 broadcasting against a naive reference, serial and on 2 threads.
    #[test]
    fn f32_broadcast((out_shape, sa, sb) in broadcast_pair(), op in 0usize..6, seed in any::<u64>(), alpha in -2i64..=3, threads in 1usize..=2) {
        let op = [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Max, Op::Min][op];
        let mut rng = Lcg(seed);
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let va = rng.vec(na, 4.0);
        let vb = rng.vec(nb, 4.0);
        let mut h = harness(threads);
        let a = tensor(&mut h, ScalarType::Float, &sa, &va);
        let b = tensor(&mut h, ScalarType::Float, &sb, &vb);
        let out = h.out(ScalarType::Float, &out_shape);
        let (name, has_alpha) = op_name(op);
        let al = has_alpha.then(|| h.int(alpha));
        run(&mut h, name, a, b, al, out).unwrap();
        prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), out_shape.clone());
        let n: usize = out_shape.iter().product();
        let want: Vec<f64> = (0..n).map(|i| {
            let x = round_through(ScalarType::Float, va[bcast_index(&out_shape, &sa, i)]);
            let y = round_through(ScalarType::Float, vb[bcast_index(&out_shape, &sb, i)]);
            let al = if has_alpha { alpha as f64 } else { 1.0 };
            reference(op, x, y, al, ScalarType::Float)
        }).collect();
        assert_close(&read(&mut h, out), &want, 1e-6, 1e-6);
    }

    /// Type promotion over every pair of dtypes, with out of the result type.
    #[test]
    fn promotion(da in 0usize..10, db in 0usize..10, op in 0usize..6, (out_shape, sa, sb) in broadcast_pair(), seed in any::<u64>()) {
        let (da, db) = (DTYPES[da], DTYPES[db]);
        let op = [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Max, Op::BitXor][op];
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let mut rng = Lcg(seed);
        let va = small_ints(&mut rng, da, na);
        let vb = small_ints(&mut rng, db, nb);
        let mut h = Harness::new();
        let a = tensor(&mut h, da, &sa, &va);
        let b = tensor(&mut h, db, &sb, &vb);
        let ta = h.tensor_meta(a);
        let tb = h.tensor_meta(b);
        let common = super::arith_dtype(&super::Operand::Tensor(ta), &super::Operand::Tensor(tb), op);
        let (name, has_alpha) = op_name(op);
        let al = has_alpha.then(|| h.int(2));
        let Ok(common) = common else {
            let out = h.out(ScalarType::Double, &out_shape);
            prop_assert!(run(&mut h, name, a, b, al, out).is_err());
            return Ok(());
        };
        let out = h.out(common, &out_shape);
        run(&mut h, name, a, b, al, out).unwrap();
        let n: usize = out_shape.iter().product();
        let want: Vec<f64> = (0..n).map(|i| {
            let x = va[bcast_index(&out_shape, &sa, i)];
            let y = vb[bcast_index(&out_shape, &sb, i)];
            let x = round_through(da, x);
            let y = round_through(db, y);
            reference(op, x, y, if has_alpha { 2.0 } else { 1.0 }, common)
        }).collect();
        let got = read(&mut h, out);
        let rel = crate::ops::elementwise::testutil::tol(common);
        assert_close(&got, &want, rel, 0.0);
    }
}

#[test]
fn llm_broadcasts_on_a_pool() {
    // [1,S,D]*[D], [1,S,H,D]*[1,S,1,D], [1,S,1]+[] with enough elements to split.
    for threads in [1, 3] {
        let mut h = harness(threads);
        let mut rng = Lcg(7);
        let (s, d, heads) = (300, 128, 4);
        let x = rng.vec(s * d, 1.0);
        let w = rng.vec(d, 1.0);
        let a = tensor(&mut h, ScalarType::Float, &[1, s, d], &x);
        let b = tensor(&mut h, ScalarType::Float, &[d], &w);
        let out = h.out(ScalarType::Float, &[1, s, d]);
        h.call("aten::mul.out", &[a, b, out, out]).unwrap();
        let got = read(&mut h, out);
        for i in 0..s * d {
            assert_eq!(got[i], (x[i] as f32 * w[i % d] as f32) as f64);
        }

        let q = rng.vec(s * heads * 32, 1.0);
        let c = rng.vec(s * 32, 1.0);
        let qa = tensor(&mut h, ScalarType::Float, &[1, s, heads, 32], &q);
        let ca = tensor(&mut h, ScalarType::Float, &[1, s, 1, 32], &c);
        let out = h.out(ScalarType::Float, &[1, s, heads, 32]);
        h.call("aten::mul.out", &[qa, ca, out, out]).unwrap();
        let got = read(&mut h, out);
        for i in 0..s * heads * 32 {
            let (si, di) = (i / (heads * 32), i % 32);
            assert_eq!(got[i], (q[i] as f32 * c[si * 32 + di] as f32) as f64);
        }

        let m = rng.vec(s, 1.0);
        let ma = tensor(&mut h, ScalarType::Float, &[1, s, 1], &m);
        let eps = tensor(&mut h, ScalarType::Float, &[], &[1e-5]);
        let one = h.int(1);
        let out = h.out(ScalarType::Float, &[1, s, 1]);
        h.call("aten::add.out", &[ma, eps, one, out, out]).unwrap();
        let got = read(&mut h, out);
        for i in 0..s {
            assert_eq!(got[i], (m[i] as f32 + 1e-5f32) as f64);
        }

        // Same shape, big enough to run on the pool.
        let n = 100_000;
        let u = rng.vec(n, 1.0);
        let v = rng.vec(n, 1.0);
        let ua = tensor(&mut h, ScalarType::Float, &[n], &u);
        let va = tensor(&mut h, ScalarType::Float, &[n], &v);
        let out = h.out(ScalarType::Float, &[n]);
        let al = h.double(0.5);
        h.call("aten::sub.out", &[ua, va, al, out, out]).unwrap();
        let got = read(&mut h, out);
        for i in 0..n {
            assert_eq!(got[i], (u[i] as f32 - 0.5f32 * v[i] as f32) as f64);
        }
    }
}

#[test]
fn wrapped_scalars_keep_the_tensor_dtype() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Int, &[3], &[1.0, -2.0, 3.0]);
    let two = h.int(2);
    let one = h.int(1);
    let out = h.out(ScalarType::Int, &[3]);
    h.call("aten::add.Scalar_out", &[x, two, one, out, out])
        .unwrap();
    assert_eq!(h.read::<i32>(out), vec![3, 0, 5]);
    // i32 + 2.5 is f32: an i32 out is refused, an f32 out is fine.
    let f = h.double(2.5);
    assert_refused(&mut h, "aten::add.Scalar_out", &[x, f, one, out, out]);
    let outf = h.out(ScalarType::Float, &[3]);
    h.call("aten::add.Scalar_out", &[x, f, one, outf, outf])
        .unwrap();
    assert_eq!(h.read::<f32>(outf), vec![3.5, 0.5, 5.5]);
    // Wrapped ints wrap in the tensor's dtype.
    let i8t = tensor(&mut h, ScalarType::Char, &[2], &[100.0, -100.0]);
    let big = h.int(100);
    let out8 = h.out(ScalarType::Char, &[2]);
    h.call("aten::mul.Scalar_out", &[i8t, big, out8, out8])
        .unwrap();
    assert_eq!(
        h.read::<i8>(out8),
        vec![(100i32 * 100) as i8, (-100i32 * 100) as i8]
    );
    // rsub: other - alpha * self.
    let three = h.int(3);
    let outr = h.out(ScalarType::Int, &[3]);
    h.call("aten::rsub.Scalar_out", &[x, three, two, outr, outr])
        .unwrap();
    assert_eq!(h.read::<i32>(outr), vec![1, 7, -3]);
    // A float out for an int result: cast on store.
    let outd = h.out(ScalarType::Double, &[3]);
    h.call("aten::mul.Scalar_out", &[x, two, outd, outd])
        .unwrap();
    assert_eq!(h.read::<f64>(outd), vec![2.0, -4.0, 6.0]);
}

#[test]
fn division_modes() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Long, &[4], &[7.0, -7.0, 7.0, -7.0]);
    let y = tensor(&mut h, ScalarType::Long, &[4], &[2.0, 2.0, -2.0, -2.0]);
    let out = h.out(ScalarType::Float, &[4]);
    h.call("aten::div.out", &[x, y, out, out]).unwrap();
    assert_eq!(h.read::<f32>(out), vec![3.5, -3.5, -3.5, 3.5]);
    let trunc = h.push(EValue::String("trunc".into()));
    let floor = h.push(EValue::String("floor".into()));
    let none = h.none();
    let outi = h.out(ScalarType::Long, &[4]);
    h.call("aten::div.out_mode", &[x, y, trunc, outi, outi])
        .unwrap();
    assert_eq!(h.read::<i64>(outi), vec![3, -3, -3, 3]);
    h.call("aten::div.out_mode", &[x, y, floor, outi, outi])
        .unwrap();
    assert_eq!(h.read::<i64>(outi), vec![3, -4, -4, 3]);
    // No mode: true division, which an int out cannot hold.
    assert_refused(&mut h, "aten::div.out_mode", &[x, y, none, outi, outi]);
    let bad = h.push(EValue::String("round".into()));
    assert_refused(&mut h, "aten::div.out_mode", &[x, y, bad, outi, outi]);
    let z = tensor(&mut h, ScalarType::Long, &[4], &[1.0, 0.0, 1.0, 1.0]);
    assert_refused(&mut h, "aten::div.out_mode", &[x, z, floor, outi, outi]);
    // Float floor division and division by zero.
    let xf = tensor(&mut h, ScalarType::Float, &[3], &[7.5, -7.5, 1.0]);
    let yf = tensor(&mut h, ScalarType::Float, &[3], &[2.0, 2.0, 0.0]);
    let outf = h.out(ScalarType::Float, &[3]);
    h.call("aten::div.out_mode", &[xf, yf, floor, outf, outf])
        .unwrap();
    assert_eq!(h.read::<f32>(outf), vec![3.0, -4.0, f32::INFINITY]);
    let two = h.double(2.0);
    h.call("aten::div.Scalar_mode_out", &[xf, two, trunc, outf, outf])
        .unwrap();
    assert_eq!(h.read::<f32>(outf), vec![3.0, -3.0, 0.0]);
    h.call("aten::div.Scalar_out", &[xf, two, outf, outf])
        .unwrap();
    assert_eq!(h.read::<f32>(outf), vec![3.75, -3.75, 0.5]);
}

#[test]
fn pow_variants() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[3], &[2.0, -3.0, 0.5]);
    let e = h.int(2);
    let out = h.out(ScalarType::Float, &[3]);
    h.call("aten::pow.Tensor_Scalar_out", &[x, e, out, out])
        .unwrap();
    assert_eq!(h.read::<f32>(out), vec![4.0, 9.0, 0.25]);
    let xi = tensor(&mut h, ScalarType::Int, &[3], &[2.0, -3.0, 5.0]);
    let e3 = h.int(3);
    let outi = h.out(ScalarType::Int, &[3]);
    h.call("aten::pow.Tensor_Scalar_out", &[xi, e3, outi, outi])
        .unwrap();
    assert_eq!(h.read::<i32>(outi), vec![8, -27, 125]);
    let neg = h.int(-1);
    assert_refused(
        &mut h,
        "aten::pow.Tensor_Scalar_out",
        &[xi, neg, outi, outi],
    );
    let half = h.double(0.5);
    let outf = h.out(ScalarType::Float, &[3]);
    h.call("aten::pow.Tensor_Scalar_out", &[xi, half, outf, outf])
        .unwrap();
    let got = h.read::<f32>(outf);
    assert_eq!(got[0], 2f32.sqrt());
    assert!(got[1].is_nan());
    let base = h.double(2.0);
    let ex = tensor(&mut h, ScalarType::Float, &[3], &[1.0, 3.0, -1.0]);
    h.call("aten::pow.Scalar_out", &[base, ex, outf, outf])
        .unwrap();
    assert_eq!(h.read::<f32>(outf), vec![2.0, 8.0, 0.5]);
    let et = tensor(&mut h, ScalarType::Int, &[3], &[0.0, 2.0, 1.0]);
    h.call("aten::pow.Tensor_Tensor_out", &[xi, et, outi, outi])
        .unwrap();
    assert_eq!(h.read::<i32>(outi), vec![1, 9, 5]);
}

#[test]
fn bitwise_and_logical() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Int, &[3], &[6.0, 0.0, -1.0]);
    let y = tensor(&mut h, ScalarType::Int, &[3], &[3.0, 5.0, 0.0]);
    let out = h.out(ScalarType::Int, &[3]);
    h.call("aten::bitwise_and.Tensor_out", &[x, y, out, out])
        .unwrap();
    assert_eq!(h.read::<i32>(out), vec![2, 0, 0]);
    h.call("aten::bitwise_or.Tensor_out", &[x, y, out, out])
        .unwrap();
    assert_eq!(h.read::<i32>(out), vec![7, 5, -1]);
    let s = h.int(1);
    h.call("aten::bitwise_xor.Scalar_out", &[x, s, out, out])
        .unwrap();
    assert_eq!(h.read::<i32>(out), vec![7, 1, -2]);
    let b1 = tensor(&mut h, ScalarType::Bool, &[3], &[1.0, 1.0, 0.0]);
    let b2 = tensor(&mut h, ScalarType::Bool, &[3], &[1.0, 0.0, 0.0]);
    let outb = h.out(ScalarType::Bool, &[3]);
    h.call("aten::bitwise_xor.Tensor_out", &[b1, b2, outb, outb])
        .unwrap();
    assert_eq!(read(&mut h, outb), vec![0.0, 1.0, 0.0]);
    // Floats are refused.
    let f = tensor(&mut h, ScalarType::Float, &[3], &[1.0, 2.0, 3.0]);
    let outf = h.out(ScalarType::Float, &[3]);
    assert_refused(&mut h, "aten::bitwise_and.Tensor_out", &[f, f, outf, outf]);
    // Logical ops take any dtypes and write any out dtype.
    h.call("aten::logical_and.out", &[x, f, outb, outb])
        .unwrap();
    assert_eq!(read(&mut h, outb), vec![1.0, 0.0, 1.0]);
    h.call("aten::logical_or.out", &[x, y, outf, outf]).unwrap();
    assert_eq!(h.read::<f32>(outf), vec![1.0, 1.0, 1.0]);
    h.call("aten::logical_xor.out", &[x, y, outb, outb])
        .unwrap();
    assert_eq!(read(&mut h, outb), vec![0.0, 1.0, 1.0]);
}

#[test]
fn where_broadcasts_and_promotes() {
    let mut h = Harness::new();
    let c = tensor(&mut h, ScalarType::Bool, &[2, 1], &[1.0, 0.0]);
    let x = tensor(&mut h, ScalarType::Float, &[3], &[1.0, 2.0, 3.0]);
    let y = tensor(&mut h, ScalarType::Long, &[], &[-1.0]);
    let out = h.out(ScalarType::Float, &[2, 3]);
    h.call("aten::where.self_out", &[c, x, y, out, out])
        .unwrap();
    assert_eq!(h.read::<f32>(out), vec![1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
    let cf = tensor(&mut h, ScalarType::Float, &[2, 1], &[1.0, 0.0]);
    assert_refused(&mut h, "aten::where.self_out", &[cf, x, y, out, out]);
}

#[test]
fn maximum_propagates_nan() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[3], &[f64::NAN, 1.0, 2.0]);
    let y = tensor(&mut h, ScalarType::Float, &[3], &[0.0, f64::NAN, 1.0]);
    let out = h.out(ScalarType::Float, &[3]);
    h.call("aten::maximum.out", &[x, y, out, out]).unwrap();
    let got = h.read::<f32>(out);
    assert!(got[0].is_nan() && got[1].is_nan() && got[2] == 2.0);
    h.call("aten::minimum.out", &[x, y, out, out]).unwrap();
    let got = h.read::<f32>(out);
    assert!(got[0].is_nan() && got[1].is_nan() && got[2] == 1.0);
}

#[test]
fn half_precision_rounds_through_the_common_dtype() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Half, &[2], &[1.0, 2048.0]);
    let y = tensor(&mut h, ScalarType::Half, &[2], &[1.0 / 3.0, 1.0]);
    let out = h.out(ScalarType::Float, &[2]);
    let one = h.int(1);
    h.call("aten::add.out", &[x, y, one, out, out]).unwrap();
    let third = half::f16::from_f64(1.0 / 3.0).to_f32();
    let want0 = half::f16::from_f32(1.0 + third).to_f32();
    // 2048 + 1 rounds to 2048 in f16 even though out is f32.
    assert_eq!(h.read::<f32>(out), vec![want0, 2048.0]);
    let bf = tensor(&mut h, ScalarType::BFloat16, &[2], &[1.0, 2.0]);
    let outb = h.out(ScalarType::BFloat16, &[2]);
    let s = h.double(0.1);
    h.call("aten::mul.Scalar_out", &[bf, s, outb, outb])
        .unwrap();
    assert_eq!(
        h.read::<half::bf16>(outb),
        vec![half::bf16::from_f32(0.1), half::bf16::from_f32(0.2)]
    );
}

#[test]
fn bad_calls_are_errors() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[2, 3], &[0.0; 6]);
    let y = tensor(&mut h, ScalarType::Float, &[3, 2], &[0.0; 6]);
    let one = h.int(1);
    let out = h.out(ScalarType::Float, &[2, 3]);
    // Not broadcastable.
    assert_refused(&mut h, "aten::add.out", &[x, y, one, out, out]);
    // Wrong argument count and kinds.
    assert!(matches!(
        h.call("aten::add.out", &[x, x, out, out]),
        Err(KernelError::OpArgCount { .. })
    ));
    let err = h.call("aten::mul.out", &[x, one, out, out]).unwrap_err();
    assert!(matches!(err.root(), KernelError::ArgType { .. }));
    assert!(
        matches!(err, KernelError::Argument { name: "other", .. }),
        "{err}"
    );
    // Out too small to resize into, or static with the wrong shape.
    let small = h.out(ScalarType::Float, &[2]);
    assert_refused(&mut h, "aten::mul.out", &[x, x, small, small]);
    let fixed = tensor(&mut h, ScalarType::Float, &[3, 2], &[0.0; 6]);
    assert_refused(&mut h, "aten::mul.out", &[x, x, fixed, fixed]);
    // Float result into an int out.
    let outi = h.out(ScalarType::Int, &[2, 3]);
    assert_refused(&mut h, "aten::mul.out", &[x, x, outi, outi]);
    // Bool subtraction; float alpha with ints; bool alpha with floats.
    let b = tensor(&mut h, ScalarType::Bool, &[2], &[1.0, 0.0]);
    let outb = h.out(ScalarType::Bool, &[2]);
    assert_refused(&mut h, "aten::sub.out", &[b, b, one, outb, outb]);
    let i = tensor(&mut h, ScalarType::Int, &[2], &[1.0, 0.0]);
    let fa = h.double(1.5);
    let outi2 = h.out(ScalarType::Int, &[2]);
    assert_refused(&mut h, "aten::add.out", &[i, i, fa, outi2, outi2]);
    let ba = h.bool(true);
    assert_refused(&mut h, "aten::add.out", &[x, x, ba, out, out]);
    // Unsupported dtypes.
    let q = h.tensor_raw(ScalarType::QInt8, &[2], &[0, 0]);
    assert_refused(&mut h, "aten::mul.out", &[q, q, out, out]);
    // A tensor with no data.
    let mut t = h.tensor_meta(x);
    t.set_data(None);
    let nd = h.push(EValue::Tensor(t));
    assert!(matches!(
        h.call("aten::mul.out", &[nd, x, out, out]),
        Err(KernelError::NoData)
    ));
}

#[test]
fn empty_and_zero_dim() {
    let mut h = Harness::new();
    let e = tensor(&mut h, ScalarType::Float, &[0, 3], &[]);
    let y = tensor(&mut h, ScalarType::Float, &[3], &[1.0, 2.0, 3.0]);
    let out = h.out(ScalarType::Float, &[0, 3]);
    h.call("aten::mul.out", &[e, y, out, out]).unwrap();
    assert_eq!(h.tensor_meta(out).sizes(), &[0, 3]);
    let s = tensor(&mut h, ScalarType::Float, &[], &[2.0]);
    let out0 = h.out(ScalarType::Float, &[]);
    h.call("aten::mul.out", &[s, s, out0, out0]).unwrap();
    assert_eq!(h.read::<f32>(out0), vec![4.0]);
}

/// An op's name and its f64 reference.
type Reference = (&'static str, fn(f64, f64) -> f64);

#[test]
fn floor_divide_fmod_remainder() {
    let xs = [-7.5, -7.0, -1.0, 0.0, 3.0, 7.0, 7.5];
    let ys = [2.0, -2.0, 3.0, -3.0, 2.0, -2.0, 4.0];
    for dtype in [ScalarType::Float, ScalarType::Long] {
        let mut h = Harness::new();
        let x: Vec<f64> = xs.iter().map(|&v| round_through(dtype, v)).collect();
        let a = tensor(&mut h, dtype, &[7], &x);
        let y = ys.to_vec();
        let b = tensor(&mut h, dtype, &[7], &y);
        let cases: [Reference; 3] = [
            ("aten::floor_divide.out", |x, y| (x / y).floor()),
            ("aten::fmod.Tensor_out", |x, y| x % y),
            ("aten::remainder.Tensor_out", |x, y| x - y * (x / y).floor()),
        ];
        for (name, f) in cases {
            let out = h.out(dtype, &[7]);
            h.call(name, &[a, b, out, out]).unwrap();
            let want: Vec<f64> = x
                .iter()
                .zip(&y)
                .map(|(&x, &y)| round_through(dtype, f(x, y)))
                .collect();
            assert_close(&read(&mut h, out), &want, 1e-6, 0.0);
        }
        let two = h.int(-2);
        let out = h.out(dtype, &[7]);
        h.call("aten::remainder.Scalar_out", &[a, two, out, out])
            .unwrap();
        let want: Vec<f64> = x.iter().map(|&x| x - -2.0 * (x / -2.0).floor()).collect();
        assert_close(&read(&mut h, out), &want, 1e-6, 0.0);
    }
    // Integer division by zero is an error; a float one follows IEEE.
    let mut h = Harness::new();
    let a = tensor(&mut h, ScalarType::Long, &[2], &[5.0, -5.0]);
    let z = tensor(&mut h, ScalarType::Long, &[2], &[1.0, 0.0]);
    for name in [
        "aten::floor_divide.out",
        "aten::fmod.Tensor_out",
        "aten::remainder.Tensor_out",
    ] {
        let out = h.out(ScalarType::Long, &[2]);
        assert_refused(&mut h, name, &[a, z, out, out]);
    }
    let f = tensor(&mut h, ScalarType::Float, &[1], &[5.0]);
    let zero = h.double(0.0);
    let out = h.out(ScalarType::Float, &[1]);
    h.call("aten::fmod.Scalar_out", &[f, zero, out, out])
        .unwrap();
    assert!(read(&mut h, out)[0].is_nan());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn masked_fill_matches_reference(
        (full, xs, ms) in broadcast_pair(),
        dt in 0usize..DTYPES.len(),
        seed in any::<u64>(),
        threads in 1usize..=2,
    ) {
        let dtype = DTYPES[dt];
        let mut rng = Lcg(seed);
        let nx: usize = xs.iter().product();
        let nm: usize = ms.iter().product();
        let xv = small_ints(&mut rng, dtype, nx);
        let mv: Vec<f64> = small_ints(&mut rng, ScalarType::Bool, nm);
        let mut h = harness(threads);
        let x = tensor(&mut h, dtype, &xs, &xv);
        let m = tensor(&mut h, ScalarType::Bool, &ms, &mv);
        let value = h.int(1);
        let out = h.out(dtype, &full);
        h.call("aten::masked_fill.Scalar_out", &[x, m, value, out, out]).unwrap();
        prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), full.clone());
        let n: usize = full.iter().product();
        let want: Vec<f64> = (0..n)
            .map(|i| {
                if mv[bcast_index(&full, &ms, i)] != 0.0 { 1.0 } else { xv[bcast_index(&full, &xs, i)] }
            })
            .collect();
        prop_assert_eq!(read(&mut h, out), want);
    }
}

#[test]
fn masked_fill_values_and_errors() {
    let mut h = Harness::new();
    let op = "aten::masked_fill.Scalar_out";
    let x = tensor(&mut h, ScalarType::Float, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let m = tensor(&mut h, ScalarType::Bool, &[2], &[1.0, 0.0]);
    let v = h.double(-100.0);
    let out = h.out(ScalarType::Float, &[2, 2]);
    h.call(op, &[x, m, v, out, out]).unwrap();
    assert_eq!(h.read::<f32>(out), vec![-100.0, 2.0, -100.0, 4.0]);
    // A float value into an int tensor truncates; f16 rounds.
    let xi = tensor(&mut h, ScalarType::Int, &[2], &[5.0, 6.0]);
    let v = h.double(2.75);
    let oi = h.out(ScalarType::Int, &[2]);
    h.call(op, &[xi, m, v, oi, oi]).unwrap();
    assert_eq!(h.read::<i32>(oi), vec![2, 6]);
    let xh = tensor(&mut h, ScalarType::Half, &[2], &[5.0, 6.0]);
    let v = h.double(2049.0);
    let oh = h.out(ScalarType::Half, &[2]);
    h.call(op, &[xh, m, v, oh, oh]).unwrap();
    assert_eq!(read(&mut h, oh), vec![2048.0, 6.0]);
    // Errors: a non-bool mask, another out dtype, shapes that do not broadcast.
    let mu = tensor(&mut h, ScalarType::Byte, &[2], &[1.0, 0.0]);
    let v = h.double(0.0);
    assert_refused(&mut h, op, &[x, mu, v, out, out]);
    let od = h.out(ScalarType::Double, &[2, 2]);
    assert_refused(&mut h, op, &[x, m, v, od, od]);
    let m3 = tensor(&mut h, ScalarType::Bool, &[3], &[1.0, 0.0, 1.0]);
    assert_refused(&mut h, op, &[x, m3, v, out, out]);
}

#[test]
fn atan2_broadcasts_and_promotes() {
    let mut h = Harness::new();
    let y = tensor(&mut h, ScalarType::Float, &[2, 1], &[1.0, -2.0]);
    let x = tensor(&mut h, ScalarType::Long, &[3], &[1.0, 0.0, -3.0]);
    let out = h.out(ScalarType::Float, &[2, 3]);
    h.call("aten::atan2.out", &[y, x, out, out]).unwrap();
    let want: Vec<f64> = [1.0f64, -2.0]
        .iter()
        .flat_map(|&yv| [1.0f64, 0.0, -3.0].map(|xv| yv.atan2(xv)))
        .collect();
    assert_close(&read(&mut h, out), &want, 1e-6, 1e-7);
    // Integers alone give a float; an integer out is refused.
    let i = tensor(&mut h, ScalarType::Int, &[2], &[1.0, -1.0]);
    let j = tensor(&mut h, ScalarType::Int, &[2], &[-1.0, 0.0]);
    let of = h.out(ScalarType::Float, &[2]);
    h.call("aten::atan2.out", &[i, j, of, of]).unwrap();
    assert_close(
        &read(&mut h, of),
        &[1.0f64.atan2(-1.0), (-1.0f64).atan2(0.0)],
        1e-6,
        1e-7,
    );
    let oi = h.out(ScalarType::Int, &[2]);
    assert_refused(&mut h, "aten::atan2.out", &[i, j, oi, oi]);
    let bad = tensor(&mut h, ScalarType::Float, &[3], &[0.0; 3]);
    assert_refused(&mut h, "aten::atan2.out", &[i, bad, of, of]);
}

#[test]
fn same_shape_f32_products_split_over_the_pool() {
    // The dense path (`binary/dense_f32.rs`): every element one IEEE operation, on one
    // thread and split over three, for sizes under and over a task's minimum.
    for threads in [1, 3] {
        for n in [1, 37, 20_000, 100_003] {
            let mut h = harness(threads);
            let mut rng = Lcg(n as u64);
            let (u, v) = (rng.vec(n, 2.0), rng.vec(n, 2.0));
            let ua = tensor(&mut h, ScalarType::Float, &[1, n], &u);
            let va = tensor(&mut h, ScalarType::Float, &[1, n], &v);
            for op in [Op::Add, Op::Sub, Op::Mul, Op::Div] {
                let (name, has_alpha) = op_name(op);
                let out = h.out(ScalarType::Float, &[1, n]);
                let al = has_alpha.then(|| h.int(1));
                run(&mut h, name, ua, va, al, out).unwrap();
                let got = read(&mut h, out);
                for i in 0..n {
                    let (x, y) = (u[i] as f32, v[i] as f32);
                    let want = match op {
                        Op::Add => x + y,
                        Op::Sub => x - y,
                        Op::Mul => x * y,
                        _ => x / y,
                    };
                    assert_eq!(got[i], want as f64, "{name}, {n} elements, element {i}");
                }
            }
        }
    }
}
