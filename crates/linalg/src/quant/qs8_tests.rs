//! The qs8 kernels against a direct model of XNNPACK's arithmetic, on every
//! instruction set of this CPU.

use proptest::prelude::*;

use super::qs8::*;
use crate::Isa;
use crate::conv::ConvGeometry;

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// `requantize(bias + Σ (a - zp_in) w)` straight from the definition.
#[allow(clippy::too_many_arguments)]
fn reference(
    m: usize,
    n: usize,
    k: usize,
    a: &[i8],
    zp_in: i32,
    w: &[i8],
    bias: &[i32],
    rq: &Qs8Requant,
) -> Vec<i8> {
    let mut y = vec![0i8; m * n];
    for r in 0..m {
        for c in 0..n {
            let mut acc = bias[c];
            for i in 0..k {
                acc += (i32::from(a[r * k + i]) - zp_in) * i32::from(w[c * k + i]);
            }
            y[r * n + c] = requantize(acc, rq.scales[c], rq.zero_point, rq.min, rq.max);
        }
    }
    y
}

fn check_gemm(m: usize, n: usize, k: usize, zp_in: i32, seed: u64) {
    let mut next = rng(seed);
    let a: Vec<i8> = (0..m * k).map(|_| next() as i8).collect();
    let w: Vec<i8> = (0..n * k).map(|_| (next() % 255) as i8).collect();
    let bias: Vec<i32> = (0..n).map(|_| (next() % 20001) as i32 - 10000).collect();
    let rq = Qs8Requant {
        scales: (0..n)
            .map(|_| 1e-4 + (next() % 1000) as f32 * 3e-6)
            .collect(),
        zero_point: (next() % 41) as i32 - 20,
        min: -100,
        max: 120,
    };
    let want = reference(m, n, k, &a, zp_in, &w, &bias, &rq);
    let packed = Qs8Weights::new(n, k, &w, Some(&bias), zp_in).unwrap();
    let rows = Qs8Rows {
        m,
        stride: k,
        data: &a,
    };
    for &isa in Isa::available() {
        let mut got = vec![0i8; m * n];
        gemm_qs8_with(isa, &rows, &packed, &rq, &mut got, n).unwrap();
        assert_eq!(got, want, "{isa:?} m {m} n {n} k {k}");
    }
}

#[test]
fn requantize_rounds_half_to_even_and_clamps() {
    assert_eq!(requantize(5, 0.5, 0, -128, 127), 2);
    assert_eq!(requantize(7, 0.5, 0, -128, 127), 4);
    assert_eq!(requantize(-5, 0.5, 3, -128, 127), 1);
    assert_eq!(requantize(1000, 1.0, 10, -128, 127), 127);
    assert_eq!(requantize(-1000, 1.0, 10, -20, 127), -20);
    assert_eq!(quantize_bound(0.0, 0.1, -5), -5);
    assert_eq!(quantize_bound(f32::INFINITY, 0.1, -5), 127);
    assert_eq!(quantize_bound(f32::NEG_INFINITY, 0.1, -5), -128);
    let mut q = [0i8; 3];
    quantize_qs8(&[0.25, -1e9, 0.35], 10.0, 1, &mut q);
    // 2.5 rounds to even (2); 0.35 · 10 is 3.5 in f32 (rounds to 4).
    assert_eq!(q, [3, -128, 5]);
}

#[test]
fn gemm_matches_the_reference_on_edge_shapes() {
    for (m, n, k) in [
        (1, 1, 1),
        (9, 17, 3),
        (8, 16, 64),
        (13, 33, 27),
        (3, 5, 147),
    ] {
        check_gemm(m, n, k, -7, (m * 131 + n * 7 + k) as u64);
    }
}

#[test]
fn depthwise_matches_a_direct_loop() {
    let g = ConvGeometry::same_on_both_axes((5, 6), (3, 3), (2, 1), (4, 1, 2));
    let mut next = rng(5);
    let x: Vec<i8> = (0..5 * 6 * 4).map(|_| next() as i8).collect();
    let w: Vec<i8> = (0..9 * 8).map(|_| next() as i8).collect();
    let bias: Vec<i32> = (0..8).map(|c| c * 100 - 300).collect();
    let rq = Qs8Requant {
        scales: vec![0.003; 8],
        zero_point: 2,
        min: -128,
        max: 127,
    };
    let zp = -3;
    let mut got = vec![0i8; 3 * 3 * 8];
    assert!(depthwise_conv2d_qs8(
        &g,
        &x,
        zp,
        &w,
        &bias,
        &rq,
        0..3,
        &mut got
    ));
    // The same convolution as im2col with zero-point padding and a GEMM per channel.
    for oy in 0..3 {
        for ox in 0..3 {
            for c in 0..8usize {
                let mut acc = bias[c];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let (iy, ix) = ((oy * 2 + ky) as isize - 1, (ox * 2 + kx) as isize - 1);
                        let v = if iy < 0 || ix < 0 || iy >= 5 || ix >= 6 {
                            zp
                        } else {
                            i32::from(x[((iy * 6 + ix) * 4) as usize + c / 2])
                        };
                        acc += (v - zp) * i32::from(w[(ky * 3 + kx) * 8 + c]);
                    }
                }
                let want = requantize(acc, 0.003, 2, -128, 127);
                assert_eq!(got[(oy * 3 + ox) * 8 + c], want);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn gemm_kernels_agree(m in 1usize..20, n in 1usize..40, k in 1usize..80, zp in -128i32..128, seed in any::<u64>()) {
        check_gemm(m, n, k, zp, seed);
    }
}
