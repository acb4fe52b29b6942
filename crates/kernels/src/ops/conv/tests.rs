use etch_base::ScalarType;
use etch_linalg::conv::ConvGeometry;
use etch_linalg::conv_nchw::{conv_transpose2d_nchw_reference, conv2d_nchw_reference};
use proptest::prelude::*;

use crate::Epilogue;
use crate::ops::elementwise::testutil::{Lcg, assert_close, harness, read, tensor};
use crate::testing::Harness;

/// One random convolution call.
#[derive(Debug, Clone)]
struct Case {
    one_d: bool,
    transposed: bool,
    batch: usize,
    g: ConvGeometry,
    out_pad: (usize, usize),
    bias: bool,
}

impl Case {
    /// A plain 2-d convolution (not transposed) of `batch` images.
    fn conv2d(g: ConvGeometry, batch: usize, bias: bool) -> Case {
        Case {
            one_d: false,
            transposed: false,
            batch,
            bias,
            out_pad: (0, 0),
            g,
        }
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        (any::<bool>(), any::<bool>(), 1usize..3, any::<bool>()),
        (1usize..7, 1usize..7, 1usize..4, 1usize..4),
        (1usize..3, 1usize..3, 1usize..3, 1usize..3),
        (0usize..2, 0usize..2, 1usize..4, 1usize..4, 1usize..4),
        (0usize..2, 0usize..2),
    )
        .prop_filter_map(
            "a valid convolution",
            |(
                (one_d, transposed, batch, bias),
                (ih, iw, kh, kw),
                (sh, sw, dh, dw),
                (ph, pw, groups, gi, go),
                (oph, opw),
            )| {
                let (ih, kh, sh, dh, ph, oph) = if one_d {
                    (1, 1, 1, 1, 0, 0)
                } else {
                    (ih, kh, sh, dh, ph, oph)
                };
                let (oh, ow) = if transposed {
                    if oph >= sh.max(dh) || opw >= sw.max(dw) {
                        return None;
                    }
                    let oh = ((ih - 1) * sh + dh * (kh - 1) + oph + 1).checked_sub(2 * ph)?;
                    let ow = ((iw - 1) * sw + dw * (kw - 1) + opw + 1).checked_sub(2 * pw)?;
                    (oh, ow)
                } else {
                    let oh = (ih + 2 * ph).checked_sub(dh * (kh - 1) + 1)? / sh + 1;
                    let ow = (iw + 2 * pw).checked_sub(dw * (kw - 1) + 1)? / sw + 1;
                    (oh, ow)
                };
                if oh == 0 || ow == 0 {
                    return None;
                }
                Some(Case {
                    one_d,
                    transposed,
                    batch,
                    bias,
                    out_pad: (oph, opw),
                    g: ConvGeometry {
                        in_h: ih,
                        in_w: iw,
                        out_h: oh,
                        out_w: ow,
                        kernel_h: kh,
                        kernel_w: kw,
                        stride_h: sh,
                        stride_w: sw,
                        dilation_h: dh,
                        dilation_w: dw,
                        pad_top: ph,
                        pad_left: pw,
                        groups,
                        group_in: gi,
                        group_out: go,
                    },
                })
            },
        )
}

/// Shape of an NCHW (or NCL) tensor of this case.
fn shape(c: &Case, n: usize, ch: usize, h: usize, w: usize) -> Vec<usize> {
    if c.one_d {
        vec![n, ch, w]
    } else {
        vec![n, ch, h, w]
    }
}

/// Runs `c` on `threads` threads, checks it against the reference, and returns the
/// outputs.
fn run(c: &Case, seed: u64, threads: usize) -> Vec<f64> {
    let g = &c.g;
    let mut rng = Lcg(seed);
    let (ci, co) = (g.in_channels(), g.out_channels());
    let x: Vec<f64> = rng
        .vec(c.batch * ci * g.in_h * g.in_w, 1.0)
        .into_iter()
        .map(|v| v as f32 as f64)
        .collect();
    let (w_shape, w_len) = if c.transposed {
        (
            shape(c, ci, g.group_out, g.kernel_h, g.kernel_w),
            ci * g.group_out * g.kernel_h * g.kernel_w,
        )
    } else {
        (
            shape(c, co, g.group_in, g.kernel_h, g.kernel_w),
            co * g.patch_len(),
        )
    };
    let w: Vec<f64> = rng
        .vec(w_len, 1.0)
        .into_iter()
        .map(|v| v as f32 as f64)
        .collect();
    let b: Vec<f64> = rng
        .vec(co, 1.0)
        .into_iter()
        .map(|v| v as f32 as f64)
        .collect();
    let mut h = harness(threads);
    let xt = tensor(
        &mut h,
        ScalarType::Float,
        &shape(c, c.batch, ci, g.in_h, g.in_w),
        &x,
    );
    let wt = tensor(&mut h, ScalarType::Float, &w_shape, &w);
    let bt = if c.bias {
        tensor(&mut h, ScalarType::Float, &[co], &b)
    } else {
        h.none()
    };
    let spatial = |hv: usize, wv: usize| {
        if c.one_d {
            vec![wv as i64]
        } else {
            vec![hv as i64, wv as i64]
        }
    };
    let stride = h.int_list(&spatial(g.stride_h, g.stride_w));
    let pad = h.int_list(&spatial(g.pad_top, g.pad_left));
    let dil = h.int_list(&spatial(g.dilation_h, g.dilation_w));
    let tr = h.bool(c.transposed);
    let opad = h.int_list(&spatial(c.out_pad.0, c.out_pad.1));
    let groups = h.int(g.groups as i64);
    let out_shape = shape(c, c.batch, co, g.out_h, g.out_w);
    let out = h.out(ScalarType::Float, &out_shape);
    h.call(
        "aten::convolution.out",
        &[xt, wt, bt, stride, pad, dil, tr, opad, groups, out, out],
    )
    .unwrap();
    assert_eq!(h.tensor_meta(out).sizes(), &out_shape[..]);
    let got = read(&mut h, out);
    // The same call with a clamp folded into it: the plain outputs, clamped, to the bit.
    let epilogue = Epilogue {
        clamp: Some((-0.25, 0.5)),
        ..Epilogue::default()
    };
    let clamped = h.out(ScalarType::Float, &out_shape);
    let args = [
        xt, wt, bt, stride, pad, dil, tr, opad, groups, clamped, clamped,
    ];
    h.call_with_epilogue("aten::convolution.out", &args, epilogue)
        .unwrap();
    let clamped = read(&mut h, clamped);
    for (c, g) in clamped.iter().zip(&got) {
        assert_eq!((*c as f32).to_bits(), epilogue.apply(*g as f32).to_bits());
    }
    let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let wf: Vec<f32> = w.iter().map(|&v| v as f32).collect();
    let bf: Vec<f32> = if c.bias {
        b.iter().map(|&v| v as f32).collect()
    } else {
        vec![0.0; co]
    };
    let (in_img, out_img) = (ci * g.in_h * g.in_w, co * g.out_h * g.out_w);
    let mut want = vec![0f32; c.batch * out_img];
    for n in 0..c.batch {
        let xi = &xf[n * in_img..(n + 1) * in_img];
        let oi = &mut want[n * out_img..(n + 1) * out_img];
        let ok = if c.transposed {
            conv_transpose2d_nchw_reference(g, xi, &wf, &bf, oi)
        } else {
            conv2d_nchw_reference(g, xi, &wf, &bf, oi)
        };
        assert!(ok);
    }
    let want: Vec<f64> = want.into_iter().map(f64::from).collect();
    assert_close(&got, &want, 1e-5, 1e-5);
    got
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn matches_the_direct_reference(c in case(), seed in any::<u64>(), threads in 1usize..=2) {
        run(&c, seed, threads);
    }
}

#[test]
fn depthwise_with_multiplier_and_large_planes() {
    // Depthwise (group_in 1) with a depth multiplier of 2, big enough to go parallel.
    let c = Case::conv2d(
        ConvGeometry {
            in_h: 40,
            in_w: 37,
            out_h: 20,
            out_w: 19,
            kernel_h: 3,
            kernel_w: 3,
            stride_h: 2,
            stride_w: 2,
            dilation_h: 1,
            dilation_w: 1,
            pad_top: 1,
            pad_left: 1,
            groups: 8,
            group_in: 1,
            group_out: 2,
        },
        1,
        true,
    );
    run(&c, 7, 2);
    // A big pointwise and a big strided 3x3 convolution.
    let pw = Case {
        g: ConvGeometry {
            kernel_h: 1,
            kernel_w: 1,
            stride_h: 1,
            stride_w: 1,
            pad_top: 0,
            pad_left: 0,
            out_h: 40,
            out_w: 37,
            groups: 1,
            group_in: 16,
            group_out: 24,
            ..c.g
        },
        ..c.clone()
    };
    run(&pw, 8, 2);
    let full = Case {
        g: ConvGeometry {
            groups: 1,
            group_in: 8,
            group_out: 12,
            ..c.g
        },
        ..c.clone()
    };
    run(&full, 9, 2);
}

#[test]
fn depthwise_in_row_bands_matches_one_thread_to_the_bit() {
    // Planes large enough that 2 and 3 threads split their rows into bands: 3x3 stride 1
    // and 2 (the square-filter kernel), a 5x5 dilated filter (the others), a depth
    // multiplier and a batch of two.
    let base = ConvGeometry::same_on_both_axes((64, 64), (3, 3), (1, 1), (5, 1, 1));
    let strided = ConvGeometry::same_on_both_axes((130, 128), (3, 3), (2, 1), (5, 1, 1));
    let dilated = ConvGeometry {
        kernel_h: 5,
        kernel_w: 5,
        dilation_h: 2,
        dilation_w: 2,
        pad_top: 3,
        pad_left: 4,
        out_h: 62,
        out_w: 64,
        group_out: 2,
        ..base
    };
    for (i, g) in [base, strided, dilated].into_iter().enumerate() {
        let c = Case::conv2d(g, 2, true);
        let one = run(&c, i as u64, 1);
        for threads in [2, 3] {
            let banded = run(&c, i as u64, threads);
            let same = banded
                .iter()
                .zip(&one)
                .all(|(a, b)| (*a as f32).to_bits() == (*b as f32).to_bits());
            assert!(same, "geometry {i} on {threads} threads");
        }
    }
}

#[test]
fn convolutions_split_over_depth_match_the_reference() {
    // Convolutions with at least twice as many products per output as output channels,
    // over planes too small to split by pixels: on several threads each task sums its own
    // range of input channels and taps (`splits_depth`). Projecting 1x1 ones (two groups,
    // 14x14 and 7x7 planes) and 3x3 ones (stride 1 and 2), a batch of two, with and
    // without a bias.
    for (i, (size, (kernel, stride, pad), groups, gi, go, bias)) in [
        (14, (1, 1, 0), 1, 96, 24, true),
        (7, (1, 1, 0), 2, 40, 8, false),
        (14, (1, 1, 0), 1, 384, 64, true),
        (14, (3, 1, 1), 1, 32, 32, true),
        (15, (3, 2, 1), 1, 16, 24, false),
    ]
    .into_iter()
    .enumerate()
    {
        let g = ConvGeometry::same_on_both_axes(
            (size, size),
            (kernel, kernel),
            (stride, pad),
            (groups, gi, go),
        );
        let c = Case::conv2d(g, 2, bias);
        for threads in [1, 2, 3] {
            run(&c, i as u64, threads);
        }
    }
}

#[test]
fn depthwise_bands_on_more_threads_than_blocks() {
    // 100 threads would make 100 bands of a 400x400 plane, more than one output can be
    // split into (`ColumnBlocks::MAX_BLOCKS`): the bands are capped, not refused.
    let g = ConvGeometry::same_on_both_axes((400, 400), (3, 3), (1, 1), (2, 1, 1));
    let c = Case::conv2d(g, 1, false);
    run(&c, 3, 100);
}

#[test]
fn bad_calls_are_errors() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[1, 2, 4, 4], &[0.0; 32]);
    let w = tensor(&mut h, ScalarType::Float, &[3, 2, 3, 3], &[0.0; 54]);
    let w_bad = tensor(&mut h, ScalarType::Float, &[3, 3, 3, 3], &[0.0; 81]);
    let w_big = tensor(&mut h, ScalarType::Float, &[3, 2, 5, 5], &[0.0; 150]);
    let b_bad = tensor(&mut h, ScalarType::Float, &[2], &[0.0; 2]);
    let xi = tensor(&mut h, ScalarType::Int, &[1, 2, 4, 4], &[0.0; 32]);
    let none = h.none();
    let one = h.int_list(&[1]);
    let zero = h.int_list(&[0]);
    let zero_stride = h.int_list(&[0]);
    let empty = h.int_list(&[]);
    let three = h.int_list(&[1, 1, 1]);
    let f = h.bool(false);
    let g1 = h.int(1);
    let g0 = h.int(0);
    let g4 = h.int(4);
    let out = h.out(ScalarType::Float, &[1, 3, 4, 4]);
    let conv = |h: &mut Harness, args: [usize; 10]| {
        let mut all = args.to_vec();
        all.push(args[9]);
        h.call("aten::convolution.out", &all)
    };
    assert!(conv(&mut h, [x, w, none, one, one, one, f, zero, g1, out]).is_ok());
    assert!(conv(&mut h, [x, w_bad, none, one, one, one, f, zero, g1, out]).is_err());
    assert!(conv(&mut h, [x, w_big, none, one, zero, one, f, zero, g1, out]).is_err());
    assert!(conv(&mut h, [x, w, b_bad, one, one, one, f, zero, g1, out]).is_err());
    assert!(conv(&mut h, [xi, w, none, one, one, one, f, zero, g1, out]).is_err());
    assert!(
        conv(
            &mut h,
            [x, w, none, zero_stride, one, one, f, zero, g1, out]
        )
        .is_err()
    );
    assert!(conv(&mut h, [x, w, none, empty, one, one, f, zero, g1, out]).is_err());
    assert!(conv(&mut h, [x, w, none, three, one, one, f, zero, g1, out]).is_err());
    assert!(conv(&mut h, [x, w, none, one, one, one, f, zero, g0, out]).is_err());
    assert!(conv(&mut h, [x, w, none, one, one, one, f, zero, g4, out]).is_err());
    assert!(
        h.call(
            "aten::convolution.out",
            &[x, w, none, one, one, one, f, zero, g1, out]
        )
        .is_err()
    );
}

/// A 1x1 convolution of `c_in` to `c_out` channels over `size` planes, its filter
/// stored contiguous and input-channel major (dim order `(1, 0, ..)`, as load-time
/// folding stores small-plane pointwise filters): both give the same outputs, with and
/// without a clamp, one image or several, on `threads` threads.
fn input_major_case(
    (c_in, c_out, one_d): (usize, usize, bool),
    (k, general): (usize, bool),
    (h, w, stride, pad): (usize, usize, usize, usize),
    (batch, bias, threads): (usize, bool, usize),
    seed: u64,
) {
    let mut rng = Lcg(seed);
    let h = if one_d { 1 } else { h };
    let shape = |n: usize, c: usize, hh: usize, ww: usize| -> Vec<usize> {
        if one_d {
            vec![n, c, ww]
        } else {
            vec![n, c, hh, ww]
        }
    };
    let spatial = |v: i64| if one_d { vec![v] } else { vec![v, v] };
    let out_len = |i: usize| (i + 2 * pad - k) / stride + 1;
    let (oh, ow) = if one_d {
        (1, out_len(w))
    } else {
        (out_len(h), out_len(w))
    };
    let x: Vec<f32> = rng
        .vec(batch * c_in * h * w, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let wv: Vec<f32> = rng
        .vec(c_out * c_in * k * if one_d { 1 } else { k }, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let b: Vec<f32> = rng.vec(c_out, 1.0).iter().map(|&v| v as f32).collect();
    let mut hs = harness(threads);
    let xt = hs.tensor(&shape(batch, c_in, h, w), &x);
    let w_shape = shape(c_out, c_in, k, k);
    let contiguous = hs.tensor(&w_shape, &wv);
    let order: &[u8] = match (one_d, general || k > 1) {
        (true, false) => &[1, 0, 2],
        (true, true) => &[1, 2, 0],
        (false, false) => &[1, 0, 2, 3],
        (false, true) => &[1, 2, 3, 0],
    };
    let input_major = hs.tensor_with_order(&w_shape, order, &wv);
    let bt = if bias {
        hs.tensor(&[c_out], &b)
    } else {
        hs.none()
    };
    let (st, pd, dl) = (
        hs.int_list(&spatial(stride as i64)),
        hs.int_list(&spatial(pad as i64)),
        hs.int_list(&spatial(1)),
    );
    let (tr, opad, groups) = (hs.bool(false), hs.int_list(&spatial(0)), hs.int(1));
    let out_shape = shape(batch, c_out, oh, ow);
    for clamp in [None, Some((-0.25f32, 0.5f32))] {
        let epilogue = Epilogue {
            clamp,
            ..Epilogue::default()
        };
        let mut outs = Vec::new();
        for wt in [contiguous, input_major] {
            let out = hs.out(ScalarType::Float, &out_shape);
            let args = [xt, wt, bt, st, pd, dl, tr, opad, groups, out, out];
            hs.call_with_epilogue("aten::convolution.out", &args, epilogue)
                .unwrap();
            outs.push(read(&mut hs, out));
        }
        assert_close(&outs[1], &outs[0], 1e-5, 1e-5);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Input-channel-major filters, 1x1 (either dim order) and 3x3: the
    /// channels-in-lanes kernel where the CPU has it (on the input planes for a 1x1
    /// stride-1 unpadded filter, on im2col rows otherwise), else the GEMM with the
    /// filter read as a transposed view.
    #[test]
    fn input_major_filters_match_contiguous_ones(
        (c_in, c_out, one_d) in (1usize..24, 1usize..52, any::<bool>()),
        (k, general) in (prop_oneof![Just(1usize), Just(3)], any::<bool>()),
        (h, w, stride, pad) in (3usize..10, 3usize..10, 1usize..3, 0usize..2),
        (batch, bias, threads) in (1usize..3, any::<bool>(), 1usize..4),
        seed in any::<u64>(),
    ) {
        let kernel = (k, general);
        input_major_case((c_in, c_out, one_d), kernel, (h, w, stride, pad), (batch, bias, threads), seed);
    }
}

#[test]
fn input_major_filters_of_larger_kernels_are_refused() {
    let mut h = Harness::new();
    let x = h.tensor(&[1, 2, 4, 4], &[0f32; 32]);
    let w = h.tensor_with_order(&[3, 2, 3, 3], &[1, 0, 2, 3], &[0f32; 54]);
    let none = h.none();
    let one = h.int_list(&[1, 1]);
    let zero = h.int_list(&[0, 0]);
    let f = h.bool(false);
    let g1 = h.int(1);
    let out = h.out(ScalarType::Float, &[1, 3, 2, 2]);
    let args = [x, w, none, one, zero, one, f, zero, g1, out, out];
    let err = h.call("aten::convolution.out", &args).unwrap_err();
    assert!(err.to_string().contains("dim order"), "{err}");
}
