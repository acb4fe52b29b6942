use etch_base::ScalarType;
use proptest::prelude::*;

use super::{SMALL_SCALE_THRESHOLD, scale_and_zero_point};
use crate::ops::elementwise::testutil::{Lcg, assert_refused, harness, read, tensor};
use crate::testing::Harness;

fn choose(h: &mut Harness, x: usize, shape: &[usize]) -> (usize, usize) {
    let mut s = shape.to_vec();
    *s.last_mut().unwrap() = 1;
    let dt = h.int(ScalarType::Char as i64);
    let sc = h.out(ScalarType::Double, &s);
    let zp = h.out(ScalarType::Long, &s);
    let list = h.tensor_list(&[sc, zp]);
    h.call(
        "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
        &[x, dt, sc, zp, list],
    )
    .unwrap();
    (sc, zp)
}

#[test]
fn choose_qparams_matches_executorch() {
    let mut h = Harness::new();
    let x = h.tensor(&[2, 3], &[-0.5f32, 0.3, 1.2, 0.1, -0.8, 2.1]);
    let (sc, zp) = choose(&mut h, x, &[2, 3]);
    let scales = h.read::<f64>(sc);
    assert!((scales[0] - 0.00666667).abs() < 1e-7);
    assert!((scales[1] - 0.0113725485).abs() < 1e-9);
    assert_eq!(h.read::<i64>(zp), vec![-53, -58]);
    assert_eq!(h.tensor_meta(sc).sizes(), &[2, 1]);
    let x3 = h.tensor(&[1, 2, 3], &[-0.5f32, 0.3, 1.2, 0.1, -0.8, 2.1]);
    let (_, zp3) = choose(&mut h, x3, &[1, 2, 3]);
    assert_eq!(h.read::<i64>(zp3), vec![-53, -58]);
    // Degenerate ranges: all zeros, and a range below the smallest scale.
    assert_eq!(
        scale_and_zero_point(0.0, 0.0, -128, 127).unwrap(),
        (0.1, 127)
    );
    let (s, z) = scale_and_zero_point(0.0, 1e-6, -128, 127).unwrap();
    assert_eq!((s, z), (SMALL_SCALE_THRESHOLD as f64, -128));
    let (s, z) = scale_and_zero_point(-1e-6, 0.0, -128, 127).unwrap();
    assert_eq!((s, z), (SMALL_SCALE_THRESHOLD as f64, 127));
    assert!(scale_and_zero_point(f32::NAN, 1.0, -128, 127).is_err());
}

#[test]
fn quantize_rounds_half_to_even_and_clamps() {
    let mut h = Harness::new();
    let x = h.tensor(
        &[2, 4],
        &[2.5f32, 3.5, -2.5, 1000.0, 0.5, 1.5, -0.5, -1000.0],
    );
    let scales = h.tensor(&[2, 1], &[1.0f64, 1.0]);
    let zps = h.tensor(&[2, 1], &[0i64, 10]);
    let (qmin, qmax) = (h.int(-128), h.int(127));
    let dt = h.int(ScalarType::Char as i64);
    let out = h.out(ScalarType::Char, &[2, 4]);
    h.call(
        "quantized_decomposed::quantize_per_token.out",
        &[x, scales, zps, qmin, qmax, dt, out, out],
    )
    .unwrap();
    assert_eq!(h.read::<i8>(out), vec![2, 4, -2, 127, 10, 12, 10, -128]);
    // Dequantize back.
    let fdt = h.int(ScalarType::Float as i64);
    let back = h.out(ScalarType::Float, &[2, 4]);
    h.call(
        "quantized_decomposed::dequantize_per_token.out",
        &[out, scales, zps, qmin, qmax, dt, fdt, back, back],
    )
    .unwrap();
    assert_eq!(
        h.read::<f32>(back),
        vec![2.0, 4.0, -2.0, 127.0, 0.0, 2.0, 0.0, -138.0]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// choose_qparams -> quantize -> dequantize recovers every value within half a
    /// step, and the qparams are in range.
    #[test]
    fn per_token_round_trip(tokens in 1usize..6, len in 1usize..40, scale in prop_oneof![Just(1e-7), Just(1.0), Just(100.0)], offset in -2.0f64..2.0, seed in any::<u64>(), threads in 1usize..=2) {
        let mut rng = Lcg(seed);
        let vals: Vec<f64> = rng.vec(tokens * len, scale).into_iter().map(|v| ((v + offset * scale) as f32) as f64).collect();
        let mut h = harness(threads);
        let x = tensor(&mut h, ScalarType::Float, &[tokens, len], &vals);
        let (sc, zp) = choose(&mut h, x, &[tokens, len]);
        let scales = h.read::<f64>(sc);
        let zps = h.read::<i64>(zp);
        for (&s, &z) in scales.iter().zip(&zps) {
            prop_assert!(s >= SMALL_SCALE_THRESHOLD as f64);
            prop_assert!((-128..=127).contains(&z));
        }
        let (qmin, qmax) = (h.int(-128), h.int(127));
        let dt = h.int(ScalarType::Char as i64);
        let q = h.out(ScalarType::Char, &[tokens, len]);
        h.call("quantized_decomposed::quantize_per_token.out", &[x, sc, zp, qmin, qmax, dt, q, q]).unwrap();
        let qs = h.read::<i8>(q);
        // The reference formula, written out.
        for t in 0..tokens {
            let inv = 1.0f32 / scales[t] as f32;
            for j in 0..len {
                let v = vals[t * len + j] as f32;
                let want = ((zps[t] as i32) as f32 + (v * inv).round_ties_even()) as i64;
                prop_assert_eq!(qs[t * len + j] as i64, want.clamp(-128, 127));
            }
        }
        let fdt = h.int(ScalarType::Float as i64);
        let back = h.out(ScalarType::Float, &[tokens, len]);
        h.call("quantized_decomposed::dequantize_per_token.out", &[q, sc, zp, qmin, qmax, dt, fdt, back, back]).unwrap();
        let got = h.read::<f32>(back);
        for t in 0..tokens {
            for j in 0..len {
                let err = (got[t * len + j] as f64 - vals[t * len + j]).abs();
                prop_assert!(err <= scales[t] * 0.5 + 1e-6 * vals[t * len + j].abs() + 1e-12,
                    "token {} col {}: {} vs {} (scale {})", t, j, got[t * len + j], vals[t * len + j], scales[t]);
            }
        }
    }

    /// Embeddings of every width against a direct unpacking.
    #[test]
    fn embeddings(bits in prop_oneof![Just(8usize), Just(4), Just(2)], vocab in 1usize..6, packed in 1usize..5, grouped in any::<bool>(), with_zp in any::<bool>(), idx_shape in proptest::collection::vec(0usize..4, 1..3), signed in any::<bool>(), seed in any::<u64>(), half_out in any::<bool>()) {
        let per = 8 / bits;
        let dim = packed * per;
        let groups = if grouped && dim % 2 == 0 { 2 } else { 1 };
        let mut rng = Lcg(seed);
        let bytes: Vec<u8> = (0..vocab * packed).map(|_| ((rng.next_f64() + 1.0) * 127.9) as u8).collect();
        let scales: Vec<f32> = (0..vocab * groups).map(|_| rng.next_f64() as f32).collect();
        let zpv: Vec<f32> = (0..vocab * groups).map(|_| (rng.next_f64() * 4.0).round() as f32).collect();
        let n_idx: usize = idx_shape.iter().product();
        let idx: Vec<i64> = (0..n_idx).map(|_| ((rng.next_f64() + 1.0) * 0.5 * vocab as f64) as i64 % vocab as i64).collect();
        let mut h = Harness::new();
        let signed = signed && bits == 8;
        let w = if signed {
            let sb: Vec<i8> = bytes.iter().map(|&b| b as i8).collect();
            h.tensor(&[vocab, packed], &sb)
        } else {
            h.tensor(&[vocab, packed], &bytes)
        };
        let sshape: Vec<usize> = if grouped && groups == 2 { vec![vocab, 2] } else { vec![vocab] };
        let s = h.tensor(&sshape, &scales);
        let z = if with_zp { h.tensor(&sshape, &zpv) } else { h.none() };
        let (qmin, qmax) = (h.int(-128), h.int(127));
        let it = h.tensor(&idx_shape, &idx);
        let mut oshape = idx_shape.clone();
        oshape.push(dim);
        let out_dtype = if half_out { ScalarType::Half } else { ScalarType::Float };
        let out = h.out(out_dtype, &oshape);
        let dt = h.int(out_dtype as i64);
        let name = match bits { 8 => "embedding_byte", 4 => "embedding_4bit", _ => "embedding_2bit" };
        h.call(&format!("quantized_decomposed::{name}.dtype_out"), &[w, s, z, qmin, qmax, it, dt, out, out]).unwrap();
        prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), oshape.clone());
        let got = read(&mut h, out);
        let gs = dim / groups;
        for (i, &v) in idx.iter().enumerate() {
            let v = v as usize;
            for j in 0..dim {
                let b = bytes[v * packed + j / per];
                let q = match bits {
                    8 => if signed { b as i8 as f32 } else { b as f32 },
                    4 => (if j % 2 == 0 { b >> 4 } else { b & 15 }) as f32 - 8.0,
                    _ => ((b >> (2 * (j % 4))) & 3) as f32 - 2.0,
                };
                let g = v * groups + j / gs;
                let zp = if with_zp { zpv[g] } else { 0.0 };
                let want = (q - zp) * scales[g];
                let want = if half_out { half::f16::from_f32(want).to_f32() } else { want };
                prop_assert_eq!(got[i * dim + j], want as f64);
            }
        }
        if bits == 8 {
            let out2 = h.out(ScalarType::Float, &oshape);
            let r = h.call("quantized_decomposed::embedding_byte.out", &[w, s, z, qmin, qmax, it, out2, out2]);
            prop_assert!(r.is_ok());
        }
    }
}

#[test]
fn embedding_4bit_packs_the_even_column_high() {
    let mut h = Harness::new();
    // Row 0: bytes 0x9A -> columns 9-8=1, 10-8=2; 0x07 -> -8, -1.
    let w = h.tensor(&[2, 2], &[0x9Au8, 0x07, 0x88, 0xF0]);
    let s = h.tensor(&[2], &[0.5f32, 2.0]);
    let none = h.none();
    let (qmin, qmax) = (h.int(-8), h.int(7));
    let idx = h.tensor(&[3], &[1i64, 0, 1]);
    let out = h.out(ScalarType::Float, &[3, 4]);
    h.call(
        "quantized_decomposed::embedding_4bit.out",
        &[w, s, none, qmin, qmax, idx, out, out],
    )
    .unwrap();
    assert_eq!(
        h.read::<f32>(out),
        vec![
            0.0, 0.0, 14.0, -16.0, 0.5, 1.0, -4.0, -0.5, 0.0, 0.0, 14.0, -16.0
        ]
    );
}

#[test]
fn large_embedding_on_a_pool() {
    let mut h = harness(3);
    let (vocab, dim) = (50, 512);
    let bytes: Vec<u8> = (0..vocab * dim).map(|i| (i * 7 % 251) as u8).collect();
    let w = h.tensor(&[vocab, dim], &bytes);
    let scales: Vec<f32> = (0..vocab * 4).map(|i| 0.01 * (i % 13) as f32).collect();
    let s = h.tensor(&[vocab, 4], &scales);
    let none = h.none();
    let (qmin, qmax) = (h.int(0), h.int(255));
    let idx: Vec<i32> = (0..200).map(|i| (i * 17 % vocab) as i32).collect();
    let it = h.tensor(&[1, 200], &idx);
    let out = h.out(ScalarType::Float, &[1, 200, dim]);
    h.call(
        "quantized_decomposed::embedding_byte.out",
        &[w, s, none, qmin, qmax, it, out, out],
    )
    .unwrap();
    let got = h.read::<f32>(out);
    for (i, &v) in idx.iter().enumerate() {
        let v = v as usize;
        for j in 0..dim {
            assert_eq!(
                got[i * dim + j],
                bytes[v * dim + j] as f32 * scales[v * 4 + j / 128]
            );
        }
    }
}

#[test]
fn per_tensor_variants() {
    let mut h = Harness::new();
    let x = h.tensor(&[4], &[-1.0f32, 0.0, 0.26, 10.0]);
    let scale = h.double(0.1);
    let zp = h.int(3);
    let (qmin, qmax) = (h.int(0), h.int(255));
    let dt = h.int(ScalarType::Byte as i64);
    let q = h.out(ScalarType::Byte, &[4]);
    h.call(
        "quantized_decomposed::quantize_per_tensor.out",
        &[x, scale, zp, qmin, qmax, dt, q, q],
    )
    .unwrap();
    let inv = 1.0f32 / 0.1f32;
    let want: Vec<u8> = [-1.0f32, 0.0, 0.26, 10.0]
        .iter()
        .map(|&v| ((3.0 + (v * inv).round_ties_even()) as i64).clamp(0, 255) as u8)
        .collect();
    assert_eq!(h.read::<u8>(q), want);
    let none = h.none();
    let back = h.out(ScalarType::Float, &[4]);
    h.call(
        "quantized_decomposed::dequantize_per_tensor.out",
        &[q, scale, zp, qmin, qmax, dt, none, back, back],
    )
    .unwrap();
    let wantf: Vec<f32> = want
        .iter()
        .map(|&v| (v as i64 - 3) as f32 * 0.1f32)
        .collect();
    assert_eq!(h.read::<f32>(back), wantf);
    let st = h.tensor(&[1], &[0.1f64]);
    let zt = h.tensor(&[1], &[3i64]);
    let q2 = h.out(ScalarType::Byte, &[4]);
    h.call(
        "quantized_decomposed::quantize_per_tensor.tensor_out",
        &[x, st, zt, qmin, qmax, dt, q2, q2],
    )
    .unwrap();
    assert_eq!(h.read::<u8>(q2), want);
    let fdt = h.int(ScalarType::Float as i64);
    h.call(
        "quantized_decomposed::dequantize_per_tensor.tensor_out",
        &[q2, st, zt, qmin, qmax, dt, fdt, back, back],
    )
    .unwrap();
    assert_eq!(h.read::<f32>(back), wantf);
}

#[test]
fn bad_calls_are_errors() {
    let mut h = Harness::new();
    let w = h.tensor(&[2, 2], &[0u8; 4]);
    let s = h.tensor(&[3], &[1.0f32; 3]);
    let none = h.none();
    let (qmin, qmax) = (h.int(-128), h.int(127));
    let idx = h.tensor(&[1], &[0i64]);
    let out = h.out(ScalarType::Float, &[1, 2]);
    // Scales for the wrong vocabulary.
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_byte.out",
        &[w, s, none, qmin, qmax, idx, out, out],
    );
    let s = h.tensor(&[2], &[1.0f32; 2]);
    // Index out of range, negative index, float indices.
    let bad = h.tensor(&[1], &[2i64]);
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_byte.out",
        &[w, s, none, qmin, qmax, bad, out, out],
    );
    let neg = h.tensor(&[1], &[-1i64]);
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_byte.out",
        &[w, s, none, qmin, qmax, neg, out, out],
    );
    let fidx = h.tensor(&[1], &[0.0f32]);
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_byte.out",
        &[w, s, none, qmin, qmax, fidx, out, out],
    );
    // quant_min > quant_max; int out; dtype mismatch; 1-D weight.
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_byte.out",
        &[w, s, none, qmax, qmin, idx, out, out],
    );
    let outi = h.out(ScalarType::Int, &[1, 2]);
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_byte.out",
        &[w, s, none, qmin, qmax, idx, outi, outi],
    );
    let half = h.int(ScalarType::Half as i64);
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_byte.dtype_out",
        &[w, s, none, qmin, qmax, idx, half, out, out],
    );
    let w1 = h.tensor(&[4], &[0u8; 4]);
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_byte.out",
        &[w1, s, none, qmin, qmax, idx, out, out],
    );
    // Groups that do not divide the dim (3 groups for 4 columns of 4-bit).
    let s3 = h.tensor(&[2, 3], &[1.0f32; 6]);
    let out4 = h.out(ScalarType::Float, &[1, 4]);
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_4bit.out",
        &[w, s3, none, qmin, qmax, idx, out4, out4],
    );
    // Signed weights are refused for 4-bit.
    let ws = h.tensor(&[2, 2], &[0i8; 4]);
    assert_refused(
        &mut h,
        "quantized_decomposed::embedding_4bit.out",
        &[ws, s, none, qmin, qmax, idx, out4, out4],
    );
    h.call(
        "quantized_decomposed::embedding_byte.out",
        &[w, s, none, qmin, qmax, idx, out, out],
    )
    .unwrap();

    // Quantize: wrong out dtype, range too wide, wrong scale count, int input.
    let x = h.tensor(&[2, 2], &[0.0f32; 4]);
    let sc = h.tensor(&[2, 1], &[1.0f64; 2]);
    let zp = h.tensor(&[2, 1], &[0i64; 2]);
    let dt = h.int(ScalarType::Char as i64);
    let q = h.out(ScalarType::Byte, &[2, 2]);
    assert_refused(
        &mut h,
        "quantized_decomposed::quantize_per_token.out",
        &[x, sc, zp, qmin, qmax, dt, q, q],
    );
    let q = h.out(ScalarType::Char, &[2, 2]);
    let wide = h.int(300);
    assert_refused(
        &mut h,
        "quantized_decomposed::quantize_per_token.out",
        &[x, sc, zp, qmin, wide, dt, q, q],
    );
    let sc3 = h.tensor(&[3], &[1.0f64; 3]);
    assert_refused(
        &mut h,
        "quantized_decomposed::quantize_per_token.out",
        &[x, sc3, zp, qmin, qmax, dt, q, q],
    );
    let xi = h.tensor(&[2, 2], &[0i32; 4]);
    assert_refused(
        &mut h,
        "quantized_decomposed::quantize_per_token.out",
        &[xi, sc, zp, qmin, qmax, dt, q, q],
    );
    h.call(
        "quantized_decomposed::quantize_per_token.out",
        &[x, sc, zp, qmin, qmax, dt, q, q],
    )
    .unwrap();
    // Dequantize: input dtype must match dtype, out must be float.
    let udt = h.int(ScalarType::Byte as i64);
    let fdt = h.int(ScalarType::Float as i64);
    let back = h.out(ScalarType::Float, &[2, 2]);
    assert_refused(
        &mut h,
        "quantized_decomposed::dequantize_per_token.out",
        &[q, sc, zp, qmin, qmax, udt, fdt, back, back],
    );
    let idt = h.int(ScalarType::Int as i64);
    assert_refused(
        &mut h,
        "quantized_decomposed::dequantize_per_token.out",
        &[q, sc, zp, qmin, qmax, dt, idt, back, back],
    );
    // choose_qparams: wrong out dtypes, rank 0, non-float input.
    let sc_f = h.out(ScalarType::Float, &[2, 1]);
    let zp_l = h.out(ScalarType::Long, &[2, 1]);
    let list = h.tensor_list(&[sc_f, zp_l]);
    assert_refused(
        &mut h,
        "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
        &[x, dt, sc_f, zp_l, list],
    );
    let x0 = h.tensor(&[], &[1.0f32]);
    let sc_d = h.out(ScalarType::Double, &[2, 1]);
    let list = h.tensor_list(&[sc_d, zp_l]);
    assert_refused(
        &mut h,
        "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
        &[x0, dt, sc_d, zp_l, list],
    );
    assert_refused(
        &mut h,
        "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
        &[xi, dt, sc_d, zp_l, list],
    );
    h.call(
        "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
        &[x, dt, sc_d, zp_l, list],
    )
    .unwrap();
    assert_eq!(h.read::<f64>(sc_d), vec![0.1, 0.1]);
}
