//! The int8 kernels against a direct model of the arithmetic, on every instruction set
//! of this CPU.

use proptest::prelude::*;

use super::*;

/// `y = d · Σ_b s Σ (q - zp)(u - o) + bias`, straight from the definition.
#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f32],
    m: usize,
    k: usize,
    codes: &[u8],
    zero: i32,
    group: usize,
    scales: &[f32],
    n: usize,
    bias: &[f32],
) -> Vec<f32> {
    let stride = qd8_row_stride(k);
    let mut q = vec![0i8; m * stride];
    let mut params = vec![0f32; 2 * m];
    quantize_qd8(x, k, &mut q, &mut params).unwrap();
    let groups = k.div_ceil(group);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let (d, zp) = (params[2 * r], params[2 * r + 1] as i32);
        for j in 0..n {
            let mut acc = 0f32;
            for g in 0..groups {
                let mut isum = 0i32;
                for c in g * group..((g + 1) * group).min(k) {
                    isum +=
                        (i32::from(q[r * stride + c]) - zp) * (i32::from(codes[j * k + c]) - zero);
                }
                acc += isum as f32 * scales[j * groups + g];
            }
            y[r * n + j] = acc * d + bias[j];
        }
    }
    y
}

fn check_all_isas(m: usize, n: usize, k: usize, group: usize, bits: WeightBits, seed: u64) {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let x: Vec<f32> = (0..m * k)
        .map(|_| (next() % 2001) as f32 / 500.0 - 1.7)
        .collect();
    let (codes, zero): (Vec<u8>, i32) = match bits {
        WeightBits::Four => ((0..n * k).map(|_| (next() % 16) as u8).collect(), 8),
        WeightBits::Eight => ((0..n * k).map(|_| (next() % 256) as u8).collect(), 128),
    };
    let groups = k.div_ceil(group);
    // Odd seeds: bf16 scales (as block-quantized files have; the kernels then read
    // the bf16 copy), even seeds: arbitrary f32.
    let bf16 = seed % 2 == 1;
    let scales: Vec<f32> = (0..n * groups)
        .map(|_| (next() % 100 + 1) as f32 / 3000.0)
        .map(|s: f32| {
            if bf16 {
                f32::from_bits(s.to_bits() & 0xffff_0000)
            } else {
                s
            }
        })
        .collect();
    let bias: Vec<f32> = (0..n).map(|j| j as f32 / 10.0 - 0.3).collect();
    let w = match bits {
        WeightBits::Four => {
            Qd8Weights::from_int4(n, k, group, &scales, |j, c| codes[j * k + c]).unwrap()
        }
        WeightBits::Eight => {
            let v: Vec<i8> = codes.iter().map(|&c| (i32::from(c) - 128) as i8).collect();
            Qd8Weights::from_int8(n, k, &v, &scales).unwrap()
        }
    };
    let want = reference(&x, m, k, &codes, zero, group, &scales, n, &bias);
    let stride = qd8_row_stride(k);
    let mut q = vec![0i8; m * stride];
    let mut params = vec![0f32; 2 * m];
    quantize_qd8(&x, k, &mut q, &mut params).unwrap();
    let rows = Qd8Rows {
        m,
        q: &q,
        params: &params,
    };
    let largest = want.iter().fold(1f32, |a, v| a.max(v.abs()));
    for threads in [1, 3] {
        let pool = ThreadPool::new(threads).unwrap();
        for &isa in Isa::available() {
            let mut out = vec![f32::NAN; m * n];
            let mut scratch = vec![0f32; gemm_qd8_scratch_len(m, &w)];
            gemm_qd8_with(
                isa,
                &pool,
                &rows,
                &w,
                Some(&bias),
                (f32::NEG_INFINITY, f32::INFINITY),
                &mut out,
                &mut scratch,
            )
            .unwrap();
            for (i, (o, e)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (o - e).abs() <= 2e-5 * largest,
                    "{} m{m} n{n} k{k} g{group} {bits:?}: [{i}] {o} vs {e}",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn decode_and_prefill_shapes() {
    check_all_isas(1, 576, 576, 32, WeightBits::Four, 1);
    // One row (the decode kernel) with f32 scales, per-channel and ragged k.
    check_all_isas(1, 50, 77, 77, WeightBits::Four, 6);
    check_all_isas(1, 33, 96, 32, WeightBits::Four, 8);
    check_all_isas(7, 40, 96, 32, WeightBits::Four, 2);
    check_all_isas(5, 33, 64, 64, WeightBits::Four, 3);
    check_all_isas(3, 20, 300, 300, WeightBits::Four, 4);
    check_all_isas(6, 17, 200, 200, WeightBits::Eight, 5);
    // Enough rows for every thread of 3 to take a run of them (the VNNI row kernel), with
    // a partial last panel; 4-bit with bf16 scales and 8-bit.
    check_all_isas(40, 33, 96, 32, WeightBits::Four, 9);
    check_all_isas(30, 20, 64, 64, WeightBits::Eight, 10);
}

/// Scaling the 16-fold 4-bit sums by `s / 16` gives the bits that shifting them back
/// does, on every instruction set and tile height (1 to 12 rows, bf16 and f32 scales).
#[test]
fn sixteenth_scales_give_the_shifted_bits() {
    for (m, seed) in [(1, 1), (5, 2), (12, 3), (40, 4), (29, 5)] {
        let (n, k) = (35, 96);
        let scales: Vec<f32> = (0..n * k / 32)
            .map(|i| (i % 97 + 1) as f32 / (if seed % 2 == 1 { 512.0 } else { 3001.0 }))
            .collect();
        let w =
            Qd8Weights::from_int4(n, k, 32, &scales, |j, c| ((j * 7 + c * 5) % 16) as u8).unwrap();
        assert!(w.sixteenth_scales_exact());
        let shifted = w.with_shifted_sums();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 + seed) % 201) as f32 / 50.0 - 2.1)
            .collect();
        let mut q = vec![0i8; m * qd8_row_stride(k)];
        let mut params = vec![0f32; 2 * m];
        quantize_qd8(&x, k, &mut q, &mut params).unwrap();
        let rows = Qd8Rows {
            m,
            q: &q,
            params: &params,
        };
        let pool = ThreadPool::new(1).unwrap();
        for &isa in Isa::available() {
            let run = |w: &Qd8Weights| {
                let mut out = vec![0f32; m * n];
                let mut scratch = vec![0f32; gemm_qd8_scratch_len(m, w)];
                let bounds = (f32::NEG_INFINITY, f32::INFINITY);
                gemm_qd8_with(isa, &pool, &rows, w, None, bounds, &mut out, &mut scratch).unwrap();
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(run(&w), run(&shifted), "{} m{m}", isa.name());
        }
    }
    // A scale that would turn subnormal divided by 16 keeps the shift.
    let tiny = [f32::MIN_POSITIVE; 2];
    let w = Qd8Weights::from_int4(1, 64, 32, &tiny, |_, c| (c % 16) as u8).unwrap();
    assert!(!w.sixteenth_scales_exact());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn every_isa_matches_the_definition(
        m in 1usize..10,
        n in 1usize..40,
        groups in 1usize..5,
        group_per8 in 1usize..6,
        per_channel in any::<bool>(),
        k_odd in 1usize..70,
        eight in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let bits = if eight { WeightBits::Eight } else { WeightBits::Four };
        let (k, group) = if per_channel || eight {
            (k_odd, k_odd)
        } else {
            (groups * group_per8 * 8, group_per8 * 8)
        };
        check_all_isas(m, n, k, group, bits, seed);
    }
}

#[test]
fn quantization_follows_xnnpack() {
    assert_eq!(qd8_params(0.0, 255.0), (1.0, -128.0));
    assert_eq!(qd8_params(0.0, 0.0).0, 1.0);
    let mut q = [0i8; 8];
    let mut p = [0f32; 2];
    quantize_qd8(&[0.0, 255.0, 1.0], 3, &mut q, &mut p).unwrap();
    assert_eq!(&q[..4], &[-128, 127, -127, 0]);
    assert_eq!(p, [1.0, -128.0]);
}

#[test]
fn bad_operands_are_errors() {
    let w = Qd8Weights::from_int4(4, 16, 8, &[1.0; 8], |_, _| 3).unwrap();
    let q = [0i8; 16];
    let rows = Qd8Rows {
        m: 2,
        q: &q,
        params: &[1.0, 0.0, 1.0, 0.0],
    };
    let mut out = [0f32; 8];
    let mut scratch = vec![0f32; gemm_qd8_scratch_len(2, &w)];
    let pool = ThreadPool::serial();
    assert!(
        gemm_qd8(
            &pool,
            &rows,
            &w,
            None,
            (f32::MIN, f32::MAX),
            &mut out,
            &mut scratch
        )
        .is_err()
    );
    assert!(Qd8Weights::from_int4(4, 16, 8, &[1.0; 7], |_, _| 3).is_err());
    assert!(Qd8Weights::from_int4(4, 20, 12, &[1.0; 8], |_, _| 3).is_err());
}

#[test]
fn nibble_bytes_pack_as_the_codes_they_hold() {
    for (n, k) in [(3usize, 64usize), (17, 33), (1, 1), (16, 130)] {
        let row_bytes = k.div_ceil(2);
        let bytes: Vec<u8> = (0..n * row_bytes).map(|i| (i * 37 + 11) as u8).collect();
        let code = |j: usize, c: usize| {
            let b = bytes[j * row_bytes + c / 2];
            if c.is_multiple_of(2) { b & 0xf } else { b >> 4 }
        };
        let group = if k.is_multiple_of(32) { 32 } else { k };
        let scales: Vec<f32> = (0..n * k.div_ceil(group))
            .map(|i| 0.01 + i as f32 * 1e-3)
            .collect();
        let want = Qd8Weights::from_int4(n, k, group, &scales, code).unwrap();
        let got = Qd8Weights::from_int4_nibbles(n, k, group, &scales, &bytes).unwrap();
        assert_eq!(got.packed_codes(), want.packed_codes(), "{n} x {k}");
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{n} x {k}");
        assert!(Qd8Weights::from_int4_nibbles(n, k, group, &scales, &bytes[1..]).is_err());
    }
}

/// A row's result does not depend on the rows beside it: `m` rows in one call give the
/// bits each row gives alone, on every instruction set and thread count (what lets
/// several sessions share one pass over the weights, `etch-runtime`'s batched step).
#[test]
fn rows_give_the_bits_they_give_alone() {
    for (m, n, k, group, eight) in [
        (4usize, 576usize, 576usize, 32usize, false),
        (8, 70, 96, 32, false),
        (2, 33, 77, 77, false),
        (40, 33, 96, 32, false),
        (5, 20, 64, 64, true),
    ] {
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 + 11) % 201) as f32 / 50.0 - 2.1)
            .collect();
        let groups = k.div_ceil(group);
        let scales: Vec<f32> = (0..n * groups)
            .map(|i| f32::from_bits(((i % 97 + 1) as f32 / 3001.0).to_bits() & 0xffff_0000))
            .collect();
        let w = if eight {
            let v: Vec<i8> = (0..n * k).map(|i| ((i * 29) % 255) as i8).collect();
            Qd8Weights::from_int8(n, k, &v, &scales).unwrap()
        } else {
            Qd8Weights::from_int4(n, k, group, &scales, |j, c| ((j * 7 + c * 5) % 16) as u8)
                .unwrap()
        };
        let bias: Vec<f32> = (0..n).map(|j| j as f32 / 10.0 - 0.3).collect();
        let stride = qd8_row_stride(k);
        let mut q = vec![0i8; m * stride];
        let mut params = vec![0f32; 2 * m];
        quantize_qd8(&x, k, &mut q, &mut params).unwrap();
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            for &isa in Isa::available() {
                let run = |rows: usize, q: &[i8], params: &[f32]| {
                    let a = Qd8Rows { m: rows, q, params };
                    let mut out = vec![0f32; rows * n];
                    let mut scratch = vec![0f32; gemm_qd8_scratch_len(rows, &w)];
                    let bounds = (f32::NEG_INFINITY, f32::INFINITY);
                    gemm_qd8_with(
                        isa,
                        &pool,
                        &a,
                        &w,
                        Some(&bias),
                        bounds,
                        &mut out,
                        &mut scratch,
                    )
                    .unwrap();
                    out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                let together = run(m, &q, &params);
                for r in 0..m {
                    let alone = run(
                        1,
                        &q[r * stride..(r + 1) * stride],
                        &params[2 * r..2 * r + 2],
                    );
                    assert_eq!(
                        &together[r * n..(r + 1) * n],
                        &alone[..],
                        "{} m{m} n{n} k{k} threads {threads}: row {r}",
                        isa.name()
                    );
                }
            }
        }
    }
}
