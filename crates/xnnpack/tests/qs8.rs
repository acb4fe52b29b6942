//! Static int8 (PT2E) graphs: a synthetic Convert -> Conv2d -> Add -> Convert payload
//! against a direct model of XNNPACK's integer arithmetic, and malformed quantization
//! parameters, each refused at init with the value and field named.

mod common;

use common::fbs::{self, F, T};
use common::*;
use etch_format::ScalarType;
use etch_kernels::BackendError;
use etch_kernels::testing::Harness;
use etch_linalg::quant::qs8::{quantize_bound, requantize};

const S_IN: f32 = 0.02;
const ZP_IN: i32 = -3;
const S_CONV: f32 = 0.05;
const ZP_CONV: i32 = 4;
const S_ADD: f32 = 0.08;
const ZP_ADD: i32 = -2;

fn per_tensor(scale: f32, zp: i32) -> T {
    T::new().f(0, F::F32(scale)).f(1, F::I32(zp))
}

fn per_channel(scales: &[f32], channel_dim: i32) -> T {
    let bits: Vec<u32> = scales.iter().map(|s| s.to_bits()).collect();
    T::new().f(0, F::VecU32(bits)).f(1, F::I32(channel_dim))
}

fn filter() -> Vec<i8> {
    (0..4 * 3 * 3 * 3)
        .map(|i| ((i * 37 + 11) % 255) as i8)
        .collect()
}

const BIAS: [i32; 4] = [120, -340, 0, 5000];
const W_SCALES: [f32; 4] = [0.01, 0.02, 0.015, 0.005];

struct Params {
    s_in: f32,
    zp_in: i32,
    w_scales: Vec<f32>,
    channel_dim: i32,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            s_in: S_IN,
            zp_in: ZP_IN,
            w_scales: W_SCALES.to_vec(),
            channel_dim: 0,
        }
    }
}

fn conv_body(ids: [u32; 4]) -> T {
    let mut t = T::new();
    for (f, v) in [
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 3),
        (5, 3),
        (6, 2),
        (7, 2),
        (8, 1),
        (9, 1),
    ] {
        t = t.f(f, F::U32(v));
    }
    t.f(10, F::U32(3))
        .f(11, F::U32(4))
        .f(12, F::U32(1))
        .f(15, F::U32(ids[0]))
        .f(16, F::U32(ids[1]))
        .f(17, F::U32(ids[2]))
        .f(18, F::U32(ids[3]))
}

fn io(input: u32, output: u32) -> T {
    T::new().f(0, F::U32(input)).f(1, F::U32(output))
}

/// x [1,5,5,3] -> Convert -> Conv2d 3x3 stride 2 pad 1 (ReLU6) -> (Convert: out 1),
/// Add(conv, conv) -> Convert (out 2).
fn payload(p: &Params) -> Vec<u8> {
    let mut constants: Vec<u8> = bytemuck::cast_slice::<i8, u8>(&filter()).to_vec();
    let boff = constants.len() as u64;
    constants.extend_from_slice(bytemuck::cast_slice(&BIAS));
    let bias_scales: Vec<f32> = W_SCALES.iter().map(|w| w * S_IN).collect();
    let g = fbs::graph(
        vec![
            fbs::value(0, &[1, 5, 5, 3], Some((0, 1)), 0),
            fbs::qvalue(1, 3, &[1, 5, 5, 3], 0, 2, per_tensor(p.s_in, p.zp_in)),
            fbs::qvalue(
                2,
                6,
                &[4, 3, 3, 3],
                1,
                1,
                per_channel(&p.w_scales, p.channel_dim),
            ),
            fbs::qvalue(3, 7, &[4], 2, 1, per_channel(&bias_scales, 0)),
            fbs::qvalue(4, 3, &[1, 3, 3, 4], 0, 2, per_tensor(S_CONV, ZP_CONV)),
            fbs::value(5, &[1, 3, 3, 4], Some((1, 2)), 0),
            fbs::qvalue(6, 3, &[1, 3, 3, 4], 0, 2, per_tensor(S_ADD, ZP_ADD)),
            fbs::value(7, &[1, 3, 3, 4], Some((2, 2)), 0),
        ],
        vec![
            fbs::node(18, io(0, 1), None),
            fbs::node(7, conv_body([1, 2, 3, 4]), Some((0.0, 6.0))),
            fbs::node(18, io(4, 5), None),
            fbs::node(
                1,
                T::new().f(0, F::U32(4)).f(1, F::U32(4)).f(2, F::U32(6)),
                None,
            ),
            fbs::node(18, io(6, 7), None),
        ],
        3,
        vec![fbs::constant_at(0, boff), fbs::constant_at(boff, 16)],
    );
    fbs::payload(&fbs::finish(&g), &constants)
}

fn input() -> Vec<f32> {
    (0..75)
        .map(|i| ((i * 29 + 7) % 41) as f32 / 10.0 - 2.0)
        .collect()
}

/// The convolution's int8 output, from the definition.
fn reference_conv(x: &[f32]) -> Vec<i8> {
    let inv = 1.0 / S_IN;
    let q: Vec<i32> = x
        .iter()
        .map(|&v| ((v * inv).round_ties_even() as i32 + ZP_IN).clamp(-128, 127))
        .collect();
    let w = filter();
    let (lo, hi) = (
        quantize_bound(0.0, S_CONV, ZP_CONV),
        quantize_bound(6.0, S_CONV, ZP_CONV),
    );
    let mut out = vec![0i8; 36];
    for oy in 0..3 {
        for ox in 0..3 {
            for c in 0..4 {
                let mut acc = BIAS[c];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let (iy, ix) = ((oy * 2 + ky) as isize - 1, (ox * 2 + kx) as isize - 1);
                        if iy < 0 || ix < 0 || iy >= 5 || ix >= 5 {
                            continue;
                        }
                        for ci in 0..3 {
                            let xv = q[((iy * 5 + ix) * 3) as usize + ci] - ZP_IN;
                            acc += xv * i32::from(w[((c * 3 + ky) * 3 + kx) * 3 + ci]);
                        }
                    }
                }
                let scale = S_IN * W_SCALES[c] / S_CONV;
                out[(oy * 3 + ox) * 4 + c] = requantize(acc, scale, ZP_CONV, lo, hi);
            }
        }
    }
    out
}

#[test]
fn convert_conv_add_match_the_integer_model() {
    let handle = init_standalone(&payload(&Params::default()));
    let x = input();
    let mut h = Harness::new();
    let xi = h.tensor(&[1, 5, 5, 3], &x);
    let ci = h.out(ScalarType::Float, &[1, 3, 3, 4]);
    let ai = h.out(ScalarType::Float, &[1, 3, 3, 4]);
    run(&mut h, handle.as_ref(), &[xi, ci, ai]).unwrap();
    let conv: Vec<f32> = h.read(ci);
    let add: Vec<f32> = h.read(ai);
    let q = reference_conv(&x);
    let want: Vec<f32> = q
        .iter()
        .map(|&v| (i32::from(v) - ZP_CONV) as f32 * S_CONV)
        .collect();
    assert_eq!(conv, want);
    assert!(
        q.iter().any(|&v| i32::from(v) > ZP_CONV + 10),
        "the test should exercise the range"
    );
    // Add: XNNPACK's fixed-point sum is within one output step of the exact one.
    for (i, (&got, &c)) in add.iter().zip(&conv).enumerate() {
        let exact = (2.0 * c / S_ADD)
            .round()
            .clamp(-128.0 - ZP_ADD as f32, 127.0 - ZP_ADD as f32)
            * S_ADD;
        assert!(
            (got - exact).abs() <= S_ADD * 1.001,
            "element {i}: {got} vs {exact}"
        );
    }
}

fn init_error(p: &Params) -> BackendError {
    init_standalone_error(&payload(p))
}

fn assert_field(err: BackendError, want: &str) {
    match err {
        BackendError::InvalidPayload { field, reason } => {
            assert_eq!(field, want, "{reason}")
        }
        other => panic!("expected an invalid-payload error on {want}, got {other}"),
    }
}

#[test]
fn bad_quantization_parameters_are_named() {
    for s in [0.0, -0.5, f32::NAN, f32::INFINITY, 1e-40] {
        let p = Params {
            s_in: s,
            ..Params::default()
        };
        assert_field(init_error(&p), "xvalues[1].quant_params.scale");
    }
    let p = Params {
        zp_in: 200,
        ..Params::default()
    };
    assert_field(init_error(&p), "xvalues[1].quant_params.zero_point");
    let mut w = W_SCALES.to_vec();
    w[2] = f32::NAN;
    let p = Params {
        w_scales: w,
        ..Params::default()
    };
    assert_field(init_error(&p), "xvalues[2].quant_params.scale[2]");
    let p = Params {
        w_scales: W_SCALES[..3].to_vec(),
        ..Params::default()
    };
    assert_field(init_error(&p), "xvalues[2].quant_params.scale");
    let p = Params {
        channel_dim: 7,
        ..Params::default()
    };
    assert_field(init_error(&p), "xvalues[2].quant_params.channel_dim");
    // A valid channel axis that is not the output channels': refused, node named.
    let p = Params {
        w_scales: vec![0.01; 3],
        channel_dim: 1,
        ..Params::default()
    };
    let err = init_error(&p);
    assert!(
        matches!(err, BackendError::Unsupported(ref m) if m.contains("Conv2d") && m.contains("xnodes[1]")),
        "{err}"
    );
}

#[test]
fn mutated_int8_graphs_never_panic() {
    let good = payload(&Params::default());
    for_each_valid_mutation(&good, 0x51f1_5eed, 600, |handle| {
        let mut h = Harness::new();
        let xi = h.tensor(&[1, 5, 5, 3], &input());
        let ci = h.out(ScalarType::Float, &[1, 3, 3, 4]);
        let ai = h.out(ScalarType::Float, &[1, 3, 3, 4]);
        let _ = run(&mut h, handle, &[xi, ci, ai]);
    });
}
