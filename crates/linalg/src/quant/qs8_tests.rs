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

#[test]
fn the_magic_bias_rounds_as_round_ties_even() {
    // Every quarter from -2^12 to 2^12 (the ties included), then random values below 2^22.
    for i in -(1 << 14)..=(1 << 14) {
        let v = i as f32 * 0.25;
        assert_eq!(round_small(v), v.round_ties_even() as i32, "{v}");
    }
    let mut next = rng(7);
    for _ in 0..100_000 {
        let v = (next() % (1 << 44)) as f32 / 4194304.0 - 2097152.0;
        assert_eq!(round_small(v), v.round_ties_even() as i32, "{v}");
    }
}

/// The depthwise kernel without a multiplier, on every ISA: channel blocks of 64 and 16
/// and a scalar tail (83 channels), a strided padded 3x3 window and a 5x5 one.
#[test]
fn depthwise_without_multiplier_matches_a_direct_loop_on_every_isa() {
    for (kernel, stride, pad) in [(3, 2, 1), (5, 1, 2)] {
        let c = 83;
        let g = ConvGeometry::same_on_both_axes((7, 9), (kernel, kernel), (stride, pad), (c, 1, 1));
        let mut next = rng(11 + kernel as u64);
        let x: Vec<i8> = (0..7 * 9 * c).map(|_| next() as i8).collect();
        let w: Vec<i8> = (0..kernel * kernel * c).map(|_| next() as i8).collect();
        let bias: Vec<i32> = (0..c as i32).map(|ch| ch * 37 - 1500).collect();
        let rq = Qs8Requant {
            scales: (0..c).map(|ch| 0.0005 + ch as f32 * 1e-5).collect(),
            zero_point: -5,
            min: -100,
            max: 120,
        };
        let zp = 9;
        let pixels = g.out_h * g.out_w;
        let mut want = vec![0i8; pixels * c];
        for oy in 0..g.out_h {
            for ox in 0..g.out_w {
                for ch in 0..c {
                    let mut acc = bias[ch];
                    for ky in 0..kernel {
                        for kx in 0..kernel {
                            let iy = (oy * stride + ky) as isize - pad as isize;
                            let ix = (ox * stride + kx) as isize - pad as isize;
                            if iy < 0 || ix < 0 || iy >= 7 || ix >= 9 {
                                continue;
                            }
                            let v = i32::from(x[(iy as usize * 9 + ix as usize) * c + ch]);
                            acc += (v - zp) * i32::from(w[(ky * kernel + kx) * c + ch]);
                        }
                    }
                    want[(oy * g.out_w + ox) * c + ch] =
                        requantize(acc, rq.scales[ch], rq.zero_point, rq.min, rq.max);
                }
            }
        }
        for &isa in Isa::available() {
            let mut got = vec![0i8; pixels * c];
            depthwise_unit_with(isa, &g, &x, zp, &w, &bias, &rq, 0..g.out_h, &mut got);
            assert_eq!(got, want, "{} kernel {kernel}", isa.name());
            // Rows from the middle land at the start of `out`.
            let mut part = vec![0i8; 2 * g.out_w * c];
            depthwise_unit_with(isa, &g, &x, zp, &w, &bias, &rq, 1..3, &mut part);
            assert_eq!(
                part[..],
                want[g.out_w * c..3 * g.out_w * c],
                "{}",
                isa.name()
            );
        }
    }
}

/// im2col rows against a per-tap gather, on geometries where whole kernel rows are one
/// run of the input (copied at once) and where they are not (padding, dilation, groups).
#[test]
fn im2col_rows_match_a_per_tap_gather() {
    let geometries = [
        ConvGeometry::same_on_both_axes((6, 7), (3, 3), (1, 1), (1, 8, 5)),
        ConvGeometry::same_on_both_axes((9, 5), (3, 3), (2, 0), (1, 4, 3)),
        ConvGeometry::same_on_both_axes((6, 6), (3, 3), (1, 1), (2, 3, 2)),
        ConvGeometry {
            dilation_w: 2,
            ..ConvGeometry::same_on_both_axes((8, 9), (3, 3), (1, 0), (1, 4, 2))
        },
    ];
    for g in geometries {
        let g = ConvGeometry {
            out_w: if g.dilation_w == 2 { 5 } else { g.out_w },
            ..g
        };
        let mut next = rng(3 + g.in_w as u64);
        let c = g.in_channels();
        let x: Vec<i8> = (0..g.in_h * g.in_w * c).map(|_| next() as i8).collect();
        let patch = g.patch_len();
        let stride = patch.div_ceil(4) * 4;
        let pixels = g.out_h * g.out_w;
        for group in 0..g.groups {
            let mut col = vec![99i8; pixels * stride];
            assert!(im2col_qs8(&g, &x, -7, group, 0..pixels, &mut col, stride));
            for p in 0..pixels {
                let (oy, ox) = (p / g.out_w, p % g.out_w);
                let mut want = Vec::new();
                for ky in 0..g.kernel_h {
                    for kx in 0..g.kernel_w {
                        let iy =
                            (oy * g.stride_h + ky * g.dilation_h) as isize - g.pad_top as isize;
                        let ix =
                            (ox * g.stride_w + kx * g.dilation_w) as isize - g.pad_left as isize;
                        for ch in 0..g.group_in {
                            want.push(
                                if iy < 0
                                    || ix < 0
                                    || iy >= g.in_h as isize
                                    || ix >= g.in_w as isize
                                {
                                    -7
                                } else {
                                    x[(iy as usize * g.in_w + ix as usize) * c
                                        + group * g.group_in
                                        + ch]
                                },
                            );
                        }
                    }
                }
                want.resize(stride, 0);
                assert_eq!(
                    col[p * stride..(p + 1) * stride],
                    want[..],
                    "{g:?} pixel {p}"
                );
            }
        }
    }
}
