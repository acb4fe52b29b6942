use etch_base::ScalarType;
use proptest::prelude::*;

use crate::EValue;
use crate::ops::elementwise::testutil::{
    Lcg, assert_close, assert_refused, harness, read, round_through, small_ints, tensor, tol,
};
use crate::testing::Harness;

fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn gelu_tanh(x: f64) -> f64 {
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

type OpFn = fn(f64) -> f64;

const FLOAT_OPS: [(&str, OpFn); 11] = [
    ("aten::sigmoid.out", |x| 1.0 / (1.0 + (-x).exp())),
    ("aten::silu.out", |x| x / (1.0 + (-x).exp())),
    ("aten::tanh.out", f64::tanh),
    ("aten::exp.out", f64::exp),
    ("aten::log.out", f64::ln),
    ("aten::sqrt.out", f64::sqrt),
    ("aten::rsqrt.out", |x| 1.0 / x.sqrt()),
    ("aten::sin.out", f64::sin),
    ("aten::cos.out", f64::cos),
    ("aten::relu.out", |x| x.max(0.0)),
    ("aten::neg.out", |x| -x),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Float ops on every float dtype (and ints promoted to f32), against f64.
    #[test]
    fn float_ops(op in 0usize..11, dt in 0usize..6, shape in proptest::collection::vec(0usize..5, 0..4), seed in any::<u64>(), threads in 1usize..=2) {
        let dtype = [ScalarType::Float, ScalarType::Double, ScalarType::Half, ScalarType::BFloat16, ScalarType::Int, ScalarType::Bool][dt];
        let (name, f) = FLOAT_OPS[op];
        let n: usize = shape.iter().product();
        let mut rng = Lcg(seed);
        let positive = matches!(name, "aten::log.out" | "aten::sqrt.out" | "aten::rsqrt.out");
        let vals: Vec<f64> = if dtype.is_floating_point() {
            rng.vec(n, 4.0).into_iter().map(|v| if positive { v.abs() + 0.01 } else { v }).collect()
        } else {
            small_ints(&mut rng, dtype, n).into_iter().map(|v| if positive { v.abs() + 1.0 } else { v }).collect()
        };
        let mut h = harness(threads);
        let x = tensor(&mut h, dtype, &shape, &vals);
        let keeps_ints = matches!(name, "aten::relu.out" | "aten::neg.out");
        if dtype == ScalarType::Bool && keeps_ints {
            let out = h.out(ScalarType::Float, &shape);
            prop_assert!(h.call(name, &[x, out, out]).is_err());
            return Ok(());
        }
        let result = if keeps_ints || dtype.is_floating_point() { dtype } else { ScalarType::Float };
        let out = h.out(result, &shape);
        h.call(name, &[x, out, out]).unwrap();
        let want: Vec<f64> = vals.iter().map(|&v| round_through(result, f(round_through(dtype, v)))).collect();
        let t = tol(result).max(if result == ScalarType::Float { 4e-6 } else { 0.0 });
        assert_close(&read(&mut h, out), &want, t, t);
    }
}

#[test]
fn gelu_both_approximations() {
    let mut h = Harness::new();
    let mut rng = Lcg(3);
    let vals = rng.vec(1000, 5.0);
    let x = tensor(&mut h, ScalarType::Float, &[10, 100], &vals);
    let out = h.out(ScalarType::Float, &[10, 100]);
    let none = h.push(EValue::String("none".into()));
    let tanh = h.push(EValue::String("tanh".into()));
    h.call("aten::gelu.out", &[x, none, out, out]).unwrap();
    let want: Vec<f64> = vals.iter().map(|&v| gelu_erf(v as f32 as f64)).collect();
    assert_close(&read(&mut h, out), &want, 1e-5, 1e-6);
    h.call("aten::gelu.out", &[x, tanh, out, out]).unwrap();
    let want: Vec<f64> = vals.iter().map(|&v| gelu_tanh(v as f32 as f64)).collect();
    assert_close(&read(&mut h, out), &want, 1e-5, 1e-6);
    let bad = h.push(EValue::String("fast".into()));
    assert_refused(&mut h, "aten::gelu.out", &[x, bad, out, out]);
    let i = tensor(&mut h, ScalarType::Int, &[2], &[1.0, 2.0]);
    let outi = h.out(ScalarType::Float, &[2]);
    assert_refused(&mut h, "aten::gelu.out", &[i, none, outi, outi]);
}

#[test]
fn relu_keeps_nan_and_negative_zero_as_the_portable_kernel_does() {
    let mut h = Harness::new();
    let x = tensor(
        &mut h,
        ScalarType::Float,
        &[4],
        &[-0.0, f64::NAN, -2.0, 3.0],
    );
    let out = h.out(ScalarType::Float, &[4]);
    h.call("aten::relu.out", &[x, out, out]).unwrap();
    let got = h.read::<f32>(out);
    assert_eq!(got[0].to_bits(), (-0.0f32).to_bits());
    assert!(got[1].is_nan());
    assert_eq!(got[2..], [0.0, 3.0]);
}

#[test]
fn integer_ops_keep_their_dtype() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Char, &[4], &[-128.0, -3.0, 0.0, 5.0]);
    let out = h.out(ScalarType::Char, &[4]);
    h.call("aten::neg.out", &[x, out, out]).unwrap();
    assert_eq!(h.read::<i8>(out), vec![-128, 3, 0, -5]);
    h.call("aten::abs.out", &[x, out, out]).unwrap();
    assert_eq!(h.read::<i8>(out), vec![-128, 3, 0, 5]);
    h.call("aten::relu.out", &[x, out, out]).unwrap();
    assert_eq!(h.read::<i8>(out), vec![0, 0, 0, 5]);
    h.call("aten::bitwise_not.out", &[x, out, out]).unwrap();
    assert_eq!(h.read::<i8>(out), vec![127, 2, -1, -6]);
    // exp of ints is f32; an int out is refused.
    assert_refused(&mut h, "aten::exp.out", &[x, out, out]);
    let b = tensor(&mut h, ScalarType::Bool, &[2], &[1.0, 0.0]);
    let outb = h.out(ScalarType::Bool, &[2]);
    h.call("aten::bitwise_not.out", &[b, outb, outb]).unwrap();
    assert_eq!(read(&mut h, outb), vec![0.0, 1.0]);
    let f = tensor(&mut h, ScalarType::Float, &[2], &[1.0, 0.0]);
    let outf = h.out(ScalarType::Float, &[2]);
    assert_refused(&mut h, "aten::bitwise_not.out", &[f, outf, outf]);
}

#[test]
fn logical_not_any_dtype() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[3], &[0.0, 2.0, f64::NAN]);
    let outb = h.out(ScalarType::Bool, &[3]);
    h.call("aten::logical_not.out", &[x, outb, outb]).unwrap();
    assert_eq!(read(&mut h, outb), vec![1.0, 0.0, 0.0]);
    let outf = h.out(ScalarType::Float, &[3]);
    h.call("aten::logical_not.out", &[x, outf, outf]).unwrap();
    assert_eq!(h.read::<f32>(outf), vec![1.0, 0.0, 0.0]);
}

#[test]
fn clamp_variants() {
    let mut h = Harness::new();
    let x = tensor(
        &mut h,
        ScalarType::Float,
        &[5],
        &[-2.0, -0.5, 0.5, 2.0, f64::NAN],
    );
    let lo = h.double(-1.0);
    let hi = h.int(1);
    let none = h.none();
    let out = h.out(ScalarType::Float, &[5]);
    h.call("aten::clamp.out", &[x, lo, hi, out, out]).unwrap();
    let got = h.read::<f32>(out);
    assert_eq!(&got[..4], &[-1.0, -0.5, 0.5, 1.0]);
    assert!(got[4].is_nan());
    h.call("aten::clamp.out", &[x, none, hi, out, out]).unwrap();
    assert_eq!(&h.read::<f32>(out)[..4], &[-2.0, -0.5, 0.5, 1.0]);
    assert_refused(&mut h, "aten::clamp.out", &[x, none, none, out, out]);
    // min > max gives max everywhere.
    let lo2 = h.int(3);
    h.call("aten::clamp.out", &[x, lo2, hi, out, out]).unwrap();
    assert_eq!(&h.read::<f32>(out)[..4], &[1.0, 1.0, 1.0, 1.0]);
    // Int tensor with a float bound promotes to f32.
    let xi = tensor(&mut h, ScalarType::Int, &[3], &[-5.0, 0.0, 5.0]);
    let outi = h.out(ScalarType::Int, &[3]);
    let half = h.double(0.5);
    assert_refused(&mut h, "aten::clamp.out", &[xi, half, none, outi, outi]);
    let two = h.int(2);
    h.call("aten::clamp.out", &[xi, none, two, outi, outi])
        .unwrap();
    assert_eq!(h.read::<i32>(outi), vec![-5, 0, 2]);
    h.call("aten::hardtanh.out", &[xi, lo, hi, outi, outi])
        .unwrap();
    assert_eq!(h.read::<i32>(outi), vec![-1, 0, 1]);
    // Tensor bounds broadcast.
    let tlo = tensor(&mut h, ScalarType::Float, &[2, 1], &[0.0, -10.0]);
    let out2 = h.out(ScalarType::Float, &[2, 5]);
    h.call("aten::clamp.Tensor_out", &[x, tlo, none, out2, out2])
        .unwrap();
    let got = h.read::<f32>(out2);
    assert_eq!(&got[..4], &[0.0, 0.0, 0.5, 2.0]);
    assert_eq!(&got[5..9], &[-2.0, -0.5, 0.5, 2.0]);
}

#[test]
fn bad_calls_are_errors() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[2], &[1.0, 2.0]);
    let out = h.out(ScalarType::Float, &[1]);
    assert_refused(&mut h, "aten::sigmoid.out", &[x, out, out]);
    let out = h.out(ScalarType::Float, &[2]);
    assert_refused(&mut h, "aten::sigmoid.out", &[x, out]);
    let i = h.int(1);
    assert_refused(&mut h, "aten::sigmoid.out", &[i, out, out]);
    let q = h.tensor_raw(ScalarType::QUInt8, &[2], &[0, 0]);
    assert_refused(&mut h, "aten::exp.out", &[q, out, out]);
    let b = tensor(&mut h, ScalarType::Bool, &[2], &[1.0, 0.0]);
    assert_refused(&mut h, "aten::neg.out", &[b, out, out]);
}
