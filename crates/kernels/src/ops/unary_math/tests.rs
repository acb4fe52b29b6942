use etch_base::ScalarType;
use proptest::prelude::*;

use crate::KernelError;
use crate::ops::elementwise::testutil::{
    Lcg, assert_close, assert_refused, harness, read, round_through, small_ints, tensor, tol,
};
use crate::testing::Harness;

type OpFn = fn(f64) -> f64;

const FLOAT_OPS: [(&str, OpFn); 15] = [
    ("aten::reciprocal.out", |x| 1.0 / x),
    ("aten::erf.out", libm::erf),
    ("aten::expm1.out", f64::exp_m1),
    ("aten::log10.out", f64::log10),
    ("aten::log1p.out", f64::ln_1p),
    ("aten::log2.out", f64::log2),
    ("aten::tan.out", f64::tan),
    ("aten::sinh.out", f64::sinh),
    ("aten::cosh.out", f64::cosh),
    ("aten::asin.out", f64::asin),
    ("aten::acos.out", f64::acos),
    ("aten::atan.out", f64::atan),
    ("aten::asinh.out", f64::asinh),
    ("aten::acosh.out", f64::acosh),
    ("aten::atanh.out", f64::atanh),
];

fn reference_sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x
    }
}

const KEEP_OPS: [(&str, OpFn); 5] = [
    ("aten::ceil.out", f64::ceil),
    ("aten::floor.out", f64::floor),
    ("aten::round.out", f64::round_ties_even),
    ("aten::trunc.out", f64::trunc),
    ("aten::sign.out", reference_sign),
];

/// Moves `v` inside the domain of `name` (where the function is finite and tame).
fn domain(name: &str, v: f64) -> f64 {
    match name {
        "aten::log10.out" | "aten::log2.out" => v.abs() + 0.01,
        "aten::log1p.out" => v.abs(),
        "aten::asin.out" | "aten::acos.out" | "aten::atanh.out" => v / 4.5,
        "aten::acosh.out" => v.abs() + 1.0,
        "aten::tan.out" => v / 3.5,
        "aten::reciprocal.out" if v.abs() < 0.1 => 0.5,
        _ => v,
    }
}

/// Integer inputs inside the domain of `name`.
fn int_domain(name: &str, v: f64) -> f64 {
    match name {
        "aten::log10.out" | "aten::log1p.out" | "aten::log2.out" | "aten::acosh.out" => {
            v.abs() + 1.0
        }
        "aten::asin.out" | "aten::acos.out" | "aten::atanh.out" => 0.0,
        "aten::reciprocal.out" if v == 0.0 => 1.0,
        "aten::tan.out" => v.clamp(-1.0, 1.0),
        _ => v,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every float op on every float dtype, and integers promoted to f32, against f64.
    #[test]
    fn float_ops(op in 0usize..15, dt in 0usize..6, shape in proptest::collection::vec(0usize..5, 0..4), seed in any::<u64>(), threads in 1usize..=2) {
        let dtype = [ScalarType::Float, ScalarType::Double, ScalarType::Half, ScalarType::BFloat16, ScalarType::Int, ScalarType::Bool][dt];
        let (name, f) = FLOAT_OPS[op];
        let n: usize = shape.iter().product();
        let mut rng = Lcg(seed);
        let vals: Vec<f64> = if dtype.is_floating_point() {
            rng.vec(n, 4.0).into_iter().map(|v| round_through(dtype, domain(name, v))).collect()
        } else {
            small_ints(&mut rng, dtype, n).into_iter().map(|v| round_through(dtype, int_domain(name, v))).collect()
        };
        let mut h = harness(threads);
        let x = tensor(&mut h, dtype, &shape, &vals);
        let result = if dtype.is_floating_point() { dtype } else { ScalarType::Float };
        let out = h.out(result, &shape);
        h.call(name, &[x, out, out]).unwrap();
        let want: Vec<f64> = vals.iter().map(|&v| round_through(result, f(v))).collect();
        let t = tol(result).max(1e-6);
        assert_close(&read(&mut h, out), &want, t, t);
    }

    /// Rounding and sign keep the dtype (integers exactly, halves included).
    #[test]
    fn rounding_keeps_the_dtype(op in 0usize..5, dt in 0usize..6, shape in proptest::collection::vec(0usize..5, 0..4), seed in any::<u64>()) {
        let dtype = [ScalarType::Float, ScalarType::Double, ScalarType::Half, ScalarType::Long, ScalarType::Char, ScalarType::Int][dt];
        let (name, f) = KEEP_OPS[op];
        let n: usize = shape.iter().product();
        let mut rng = Lcg(seed);
        let vals: Vec<f64> = if dtype.is_floating_point() {
            rng.vec(n, 4.0).into_iter().map(|v| (v * 4.0).round() / 4.0).collect()
        } else {
            small_ints(&mut rng, dtype, n)
        };
        let mut h = Harness::new();
        let x = tensor(&mut h, dtype, &shape, &vals);
        let out = h.out(dtype, &shape);
        h.call(name, &[x, out, out]).unwrap();
        let want: Vec<f64> = vals.iter().map(|&v| f(v)).collect();
        assert_close(&read(&mut h, out), &want, 0.0, 0.0);
    }

    /// leaky_relu and elu against their formulas, on f32 and f64.
    #[test]
    fn activations(slope in -1.0f64..1.0, alpha in 0.1f64..2.0, scale in 0.5f64..2.0, input_scale in 0.5f64..2.0, double in any::<bool>(), seed in any::<u64>()) {
        let dtype = if double { ScalarType::Double } else { ScalarType::Float };
        let mut rng = Lcg(seed);
        let vals: Vec<f64> = rng.vec(37, 4.0).into_iter().map(|v| round_through(dtype, v)).collect();
        let mut h = Harness::new();
        let x = tensor(&mut h, dtype, &[37], &vals);
        let s = h.double(slope);
        let out = h.out(dtype, &[37]);
        h.call("aten::leaky_relu.out", &[x, s, out, out]).unwrap();
        let want: Vec<f64> = vals.iter().map(|&v| round_through(dtype, if v > 0.0 { v } else { v * slope })).collect();
        assert_close(&read(&mut h, out), &want, 1e-6, 1e-6);
        let (al, sc, isc) = (h.double(alpha), h.double(scale), h.double(input_scale));
        h.call("aten::elu.out", &[x, al, sc, isc, out, out]).unwrap();
        let want: Vec<f64> = vals.iter().map(|&v| round_through(dtype, if v > 0.0 { v * scale } else { alpha * scale * (v * input_scale).exp_m1() })).collect();
        assert_close(&read(&mut h, out), &want, 1e-6, 1e-6);
    }
}

#[test]
fn integer_and_float_promotion() {
    let mut h = Harness::new();
    // Int in, f32 result, stored into an f64 out.
    let i = h.tensor(&[3], &[1i32, 4, 8]);
    let d = h.out(ScalarType::Double, &[3]);
    h.call("aten::log2.out", &[i, d, d]).unwrap();
    assert_eq!(h.read::<f64>(d), vec![0.0, 2.0, 3.0]);
    // Bool in: true -> 1.0.
    let b = h.tensor_raw(ScalarType::Bool, &[2], &[0, 1]);
    let f = h.out(ScalarType::Float, &[2]);
    h.call("aten::expm1.out", &[b, f, f]).unwrap();
    assert_close(&read(&mut h, f), &[0.0, 1f64.exp_m1()], 1e-6, 0.0);
    // f32 in, f16 out is a narrowing PyTorch allows for a float result.
    let x = h.tensor(&[2], &[0.5f32, -2.0]);
    let half = h.out(ScalarType::Half, &[2]);
    h.call("aten::reciprocal.out", &[x, half, half]).unwrap();
    assert_eq!(read(&mut h, half), vec![2.0, -0.5]);
    // Rounding an i64 keeps values above 2^53 exact; sign of ints is -1/0/1.
    let big = h.tensor(&[3], &[(1i64 << 60) + 1, -7, 0]);
    let lo = h.out(ScalarType::Long, &[3]);
    h.call("aten::floor.out", &[big, lo, lo]).unwrap();
    assert_eq!(h.read::<i64>(lo), vec![(1i64 << 60) + 1, -7, 0]);
    h.call("aten::sign.out", &[big, lo, lo]).unwrap();
    assert_eq!(h.read::<i64>(lo), vec![1, -1, 0]);
    // An integer rounded into a float out.
    let fo = h.out(ScalarType::Float, &[3]);
    let small = h.tensor(&[3], &[3i32, -2, 0]);
    h.call("aten::ceil.out", &[small, fo, fo]).unwrap();
    assert_eq!(h.read::<f32>(fo), vec![3.0, -2.0, 0.0]);
    // NaN and signed zero through sign and round.
    let z = h.tensor(&[3], &[f32::NAN, -0.0, 2.5]);
    let zo = h.out(ScalarType::Float, &[3]);
    h.call("aten::sign.out", &[z, zo, zo]).unwrap();
    let got = h.read::<f32>(zo);
    assert!(got[0].is_nan() && got[1] == 0.0 && got[1].is_sign_negative() && got[2] == 1.0);
    h.call("aten::round.out", &[z, zo, zo]).unwrap();
    assert_eq!(h.read::<f32>(zo)[2], 2.0);
}

#[test]
fn isnan_isinf() {
    let mut h = Harness::new();
    let x = h.tensor(&[4], &[1.0f32, f32::NAN, f32::INFINITY, -f32::INFINITY]);
    let out = h.out(ScalarType::Bool, &[4]);
    h.call("aten::isnan.out", &[x, out, out]).unwrap();
    assert_eq!(h.read_bytes(out), vec![0, 1, 0, 0]);
    h.call("aten::isinf.out", &[x, out, out]).unwrap();
    assert_eq!(h.read_bytes(out), vec![0, 0, 1, 1]);
    let i = h.tensor(&[4], &[1i64, 2, 3, 4]);
    h.call("aten::isnan.out", &[i, out, out]).unwrap();
    assert_eq!(h.read_bytes(out), vec![0; 4]);
}

#[test]
fn bad_arguments_are_typed_errors() {
    let mut h = Harness::new();
    let x = h.tensor(&[4], &[1.0f32, 2.0, 3.0, 4.0]);
    let f = h.out(ScalarType::Float, &[4]);
    // isnan into a float out.
    assert!(matches!(
        h.call("aten::isnan.out", &[x, f, f]),
        Err(KernelError::UnsupportedDtype { .. })
    ));
    // Rounding a bool.
    let b = h.tensor_raw(ScalarType::Bool, &[2], &[0, 1]);
    let bo = h.out(ScalarType::Bool, &[2]);
    assert!(matches!(
        h.call("aten::floor.out", &[b, bo, bo]),
        Err(KernelError::UnsupportedDtype { .. })
    ));
    // leaky_relu and elu of integers.
    let i = h.tensor(&[2], &[1i32, 2]);
    let io = h.out(ScalarType::Int, &[2]);
    let s = h.double(0.1);
    assert!(matches!(
        h.call("aten::leaky_relu.out", &[i, s, io, io]),
        Err(KernelError::UnsupportedDtype { .. })
    ));
    assert_refused(&mut h, "aten::elu.out", &[i, s, s, s, io, io]);
    // A float result cannot be stored into an int out.
    assert_refused(&mut h, "aten::erf.out", &[i, io, io]);
    // Wrong argument count and a wrong argument type name the op and argument.
    assert!(matches!(
        h.call("aten::tan.out", &[x, f]),
        Err(KernelError::OpArgCount { .. })
    ));
    let err = h.call("aten::leaky_relu.out", &[x, x, f, f]).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::Argument {
                name: "negative_slope",
                ..
            }
        ),
        "{err}"
    );
    // An out too small for the input.
    let small = h.out(ScalarType::Float, &[2]);
    assert_refused(&mut h, "aten::atan.out", &[x, small, small]);
}

#[test]
fn logit_values_eps_and_dtypes() {
    let mut h = Harness::new();
    let vals = [0.25, 0.5, 0.9, 0.0, 1.0, -0.5, 1.5];
    let x = tensor(&mut h, ScalarType::Float, &[7], &vals);
    let none = h.none();
    let out = h.out(ScalarType::Float, &[7]);
    h.call("aten::logit.out", &[x, none, out, out]).unwrap();
    let got = read(&mut h, out);
    let logit = |v: f64| (v / (1.0 - v)).ln();
    assert_close(&got[..3], &[logit(0.25), 0.0, logit(0.9)], 1e-6, 1e-7);
    assert_eq!(got[3], f64::NEG_INFINITY);
    assert_eq!(got[4], f64::INFINITY);
    assert!(got[5].is_nan() && got[6].is_nan());
    // eps clamps into [eps, 1 - eps]; a negative eps does not clamp.
    let eps = h.double(0.2);
    h.call("aten::logit.out", &[x, eps, out, out]).unwrap();
    let got = read(&mut h, out);
    let lo = logit(0.2);
    let want = [logit(0.25), 0.0, -lo, lo, -lo, lo, -lo];
    assert_close(&got, &want, 1e-6, 1e-6);
    let neg = h.double(-1.0);
    h.call("aten::logit.out", &[x, neg, out, out]).unwrap();
    assert!(read(&mut h, out)[5].is_nan());
    // Integers give floats; bool and an integer out are refused.
    let i = tensor(&mut h, ScalarType::Int, &[2], &[0.0, 1.0]);
    let of = h.out(ScalarType::Float, &[2]);
    h.call("aten::logit.out", &[i, none, of, of]).unwrap();
    assert_eq!(read(&mut h, of), vec![f64::NEG_INFINITY, f64::INFINITY]);
    let oi = h.out(ScalarType::Int, &[2]);
    assert_refused(&mut h, "aten::logit.out", &[i, none, oi, oi]);
    let b = tensor(&mut h, ScalarType::Bool, &[2], &[0.0, 1.0]);
    assert_refused(&mut h, "aten::logit.out", &[b, none, of, of]);
}
