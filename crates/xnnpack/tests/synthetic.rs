//! Synthetic XNNGraph payloads (written with a small flatbuffer writer) for the node
//! kinds the fixtures on hand do not contain: convolution with constants in the
//! header's region, depthwise convolution, pooling, broadcasting with dynamic shapes,
//! and the errors that name a node's field. Expected values come from etch-linalg's
//! direct reference kernels.

mod common;

use common::fbs::{self, F, T};
use common::*;
use etch_format::ScalarType;
use etch_kernels::BackendError;
use etch_kernels::testing::Harness;
use etch_linalg::conv::{ConvGeometry, conv2d_nhwc_reference};
use etch_linalg::pool::{PoolGeometry, global_avg_pool_nhwc, max_pool2d_nhwc};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32 * 37 + seed * 11) % 23) as f32 / 11.0 - 1.0)
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

#[allow(clippy::too_many_arguments)]
fn conv_body(pad: u32, k: u32, s: u32, gi: u32, go: u32, groups: u32, ids: [u32; 4]) -> T {
    T::new()
        .f(0, F::U32(pad))
        .f(1, F::U32(pad))
        .f(2, F::U32(pad))
        .f(3, F::U32(pad))
        .f(4, F::U32(k))
        .f(5, F::U32(k))
        .f(6, F::U32(s))
        .f(7, F::U32(s))
        .f(8, F::U32(1))
        .f(9, F::U32(1))
        .f(10, F::U32(gi))
        .f(11, F::U32(go))
        .f(12, F::U32(groups))
        .f(15, F::U32(ids[0]))
        .f(16, F::U32(ids[1]))
        .f(17, F::U32(ids[2]))
        .f(18, F::U32(ids[3]))
}

fn conv_payload(filter_id: u32) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let filter = data(4 * 3 * 3 * 3, 1);
    let bias = data(4, 2);
    let mut constants = bytes(&filter);
    let foff = 0u64;
    let boff = constants.len() as u64;
    constants.extend(bytes(&bias));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[1, 5, 5, 3], Some((0, 1)), 0),
            fbs::value(1, &[4, 3, 3, 3], None, 1),
            fbs::value(2, &[4], None, 2),
            fbs::value(3, &[1, 3, 3, 4], Some((1, 2)), 0),
        ],
        vec![fbs::node(
            7,
            conv_body(1, 3, 2, 3, 4, 1, [0, filter_id, 2, 3]),
            Some((0.0, 6.0)),
        )],
        2,
        vec![fbs::constant_at(foff, 432), fbs::constant_at(boff, 16)],
    );
    (fbs::payload(&fbs::finish(&g), &constants), filter, bias)
}

#[test]
fn conv2d_with_header_constants_matches_the_reference() {
    let (payload, filter, bias) = conv_payload(1);
    let handle = init_standalone(&payload);
    assert_eq!(handle.summary().nodes, vec![("Conv2d".to_string(), 1)]);
    let x = data(75, 3);
    let mut h = Harness::new();
    let xi = h.tensor(&[1, 5, 5, 3], &x);
    let yi = h.out(ScalarType::Float, &[1, 3, 3, 4]);
    run(&mut h, handle.as_ref(), &[xi, yi]).unwrap();
    let g = ConvGeometry::same_on_both_axes((5, 5), (3, 3), (2, 1), (1, 3, 4));
    let mut want = vec![0f32; 36];
    assert!(conv2d_nhwc_reference(
        &g, &x, &filter, &bias, 0.0, 6.0, &mut want
    ));
    let got: Vec<f32> = h.read(yi);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-5, "{got:?} vs {want:?}");
    }
}

#[test]
fn a_bad_filter_id_names_node_and_field() {
    let (payload, _, _) = conv_payload(77);
    let err = init_standalone_error(&payload);
    match err {
        BackendError::InvalidPayload { field, .. } => {
            assert_eq!(field, "xnodes[0].Conv2d.filter_id")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn depthwise_then_pooling() {
    // x [1,6,6,2] -> depthwise 3x3 (multiplier 2, pad 1) -> [1,6,6,4] -> max pool 2x2/2
    // -> [1,3,3,4] -> global average (keep dims) -> [1,1,1,4].
    let filter = data(3 * 3 * 4, 5);
    let bias = data(4, 6);
    let mut constants = bytes(&filter);
    constants.extend(bytes(&bias));
    let pool = T::new()
        .f(4, F::U32(2))
        .f(5, F::U32(2))
        .f(6, F::U32(2))
        .f(7, F::U32(2))
        .f(8, F::U32(1))
        .f(9, F::U32(1))
        .f(10, F::U32(3))
        .f(11, F::U32(4))
        .f(12, F::U32(0x40));
    let gap = T::new().f(0, F::U32(4)).f(1, F::U32(5)).f(2, F::U32(0x40));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[1, 6, 6, 2], Some((0, 1)), 0),
            fbs::value(1, &[1, 3, 3, 4], None, 1),
            fbs::value(2, &[4], None, 2),
            fbs::value(3, &[1, 6, 6, 4], None, 0),
            fbs::value(4, &[1, 3, 3, 4], None, 0),
            fbs::value(5, &[1, 1, 1, 4], Some((1, 2)), 0),
        ],
        vec![
            fbs::node(13, conv_body(1, 3, 1, 1, 2, 2, [0, 1, 2, 3]), None),
            fbs::node(14, pool, None),
            fbs::node(19, gap, None),
        ],
        2,
        vec![fbs::constant_at(0, 144), fbs::constant_at(144, 16)],
    );
    let payload = fbs::payload(&fbs::finish(&g), &constants);
    let handle = init_standalone(&payload);
    let x = data(72, 7);
    let mut h = Harness::new();
    let xi = h.tensor(&[1, 6, 6, 2], &x);
    let yi = h.out(ScalarType::Float, &[1, 1, 1, 4]);
    run(&mut h, handle.as_ref(), &[xi, yi]).unwrap();
    // Reference: the depthwise filter as OHWI [4, 3, 3, 1], grouped convolution.
    let mut ohwi = vec![0f32; 36];
    for t in 0..9 {
        for k in 0..4 {
            ohwi[k * 9 + t] = filter[t * 4 + k];
        }
    }
    let cg = ConvGeometry::same_on_both_axes((6, 6), (3, 3), (1, 1), (2, 1, 2));
    let mut c = vec![0f32; 144];
    assert!(conv2d_nhwc_reference(
        &cg,
        &x,
        &ohwi,
        &bias,
        f32::NEG_INFINITY,
        f32::INFINITY,
        &mut c
    ));
    let pg = PoolGeometry {
        in_h: 6,
        in_w: 6,
        channels: 4,
        out_h: 3,
        out_w: 3,
        kernel_h: 2,
        kernel_w: 2,
        stride_h: 2,
        stride_w: 2,
        dilation_h: 1,
        dilation_w: 1,
        pad_top: 0,
        pad_left: 0,
    };
    let mut p = vec![0f32; 36];
    assert!(max_pool2d_nhwc(
        &pg,
        &c,
        f32::NEG_INFINITY,
        f32::INFINITY,
        &mut p
    ));
    let mut want = vec![0f32; 4];
    assert!(global_avg_pool_nhwc(
        9,
        4,
        &p,
        f32::NEG_INFINITY,
        f32::INFINITY,
        &mut want
    ));
    let got: Vec<f32> = h.read(yi);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-5, "{got:?} vs {want:?}");
    }
}

#[test]
fn broadcast_add_follows_dynamic_rows() {
    // y [n, 4] = x [n, 4] + c [4], n up to 3; a transpose [0, 1] -> [1, 0] and back.
    let c = [1.0f32, 2.0, 3.0, 4.0];
    let add = T::new().f(0, F::U32(0)).f(1, F::U32(1)).f(2, F::U32(2));
    let t1 = T::new()
        .f(0, F::U32(2))
        .f(1, F::VecU32(vec![1, 0]))
        .f(2, F::U32(2))
        .f(3, F::U32(3));
    let t2 = T::new()
        .f(0, F::U32(2))
        .f(1, F::VecU32(vec![1, 0]))
        .f(2, F::U32(3))
        .f(3, F::U32(4));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[3, 4], Some((0, 1)), 0),
            fbs::value(1, &[4], None, 1),
            fbs::value(2, &[3, 4], None, 0),
            fbs::value(3, &[4, 3], None, 0),
            fbs::value(4, &[3, 4], Some((1, 2)), 0),
        ],
        vec![
            fbs::node(1, add, None),
            fbs::node(5, t1, None),
            fbs::node(5, t2, None),
        ],
        2,
        vec![fbs::constant_at(0, 16)],
    );
    let payload = fbs::payload(&fbs::finish(&g), &bytes(&c));
    let handle = init_standalone(&payload);
    let mut h = Harness::new();
    for n in [3usize, 1, 2] {
        let x = data(n * 4, n as u32);
        let xi = h.tensor(&[n, 4], &x);
        let yi = h.out(ScalarType::Float, &[3, 4]);
        run(&mut h, handle.as_ref(), &[xi, yi]).unwrap();
        assert_eq!(h.tensor_meta(yi).sizes(), &[n, 4]);
        let got: Vec<f32> = h.read(yi);
        let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v + c[i % 4]).collect();
        assert_eq!(got, want);
    }
}

#[test]
fn large_elementwise_nodes_split_over_threads_give_the_serial_bits() {
    // v2 = clamp(x + c, -0.5, 0.75), v3 = v2 * x, y = clamp(v3, -0.2, 0.3): 140000
    // elements, enough chunks of GRAIN_SIZE for the pool to split every node.
    let c = [0.25f32];
    let n = 2 * 70_000usize;
    let add = T::new().f(0, F::U32(0)).f(1, F::U32(1)).f(2, F::U32(2));
    let mul = T::new().f(0, F::U32(2)).f(1, F::U32(0)).f(2, F::U32(3));
    let clamp = T::new().f(0, F::U32(3)).f(1, F::U32(4));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[2, 70_000], Some((0, 1)), 0),
            fbs::value(1, &[1], None, 1),
            fbs::value(2, &[2, 70_000], None, 0),
            fbs::value(3, &[2, 70_000], None, 0),
            fbs::value(4, &[2, 70_000], Some((1, 2)), 0),
        ],
        vec![
            fbs::node(1, add, Some((-0.5, 0.75))),
            fbs::node(15, mul, None),
            fbs::node(6, clamp, Some((-0.2, 0.3))),
        ],
        2,
        vec![fbs::constant_at(0, 4)],
    );
    let payload = fbs::payload(&fbs::finish(&g), &bytes(&c));
    let handle = init_standalone(&payload);
    let x = data(n, 5);
    let want: Vec<f32> = x
        .iter()
        .map(|&v| ((v + c[0]).clamp(-0.5, 0.75) * v).clamp(-0.2, 0.3))
        .collect();
    for threads in [1, 2] {
        let mut h = Harness::with_pool(etch_kernels::ThreadPool::new(threads).unwrap());
        let xi = h.tensor(&[2, 70_000], &x);
        let yi = h.out(ScalarType::Float, &[2, 70_000]);
        run(&mut h, handle.as_ref(), &[xi, yi]).unwrap();
        let got: Vec<f32> = h.read(yi);
        assert_eq!(got, want, "{threads} threads");
    }
}

#[test]
fn unsupported_kinds_and_quantized_values_are_named() {
    let body = T::new().f(6, F::U32(0)).f(7, F::U32(1)).f(8, F::U32(2));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[1, 4, 4, 1], Some((0, 1)), 0),
            fbs::value(1, &[1, 2, 2, 1], Some((1, 2)), 0),
            fbs::value(2, &[1, 2, 2, 1], Some((2, 2)), 0),
        ],
        vec![fbs::node(21, body, None)],
        3,
        vec![],
    );
    let payload = fbs::payload(&fbs::finish(&g), &[]);
    let err = init_standalone_error(&payload);
    assert!(
        matches!(err, BackendError::Unsupported(ref m) if m.contains("ArgMaxPooling2d")),
        "{err}"
    );
}

#[test]
fn a_value_read_before_it_is_written_is_refused() {
    let add = T::new().f(0, F::U32(2)).f(1, F::U32(0)).f(2, F::U32(1));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[4], Some((0, 1)), 0),
            fbs::value(1, &[4], Some((1, 2)), 0),
            fbs::value(2, &[4], None, 0),
        ],
        vec![fbs::node(1, add, None)],
        2,
        vec![],
    );
    let payload = fbs::payload(&fbs::finish(&g), &[]);
    let err = init_standalone_error(&payload);
    match err {
        BackendError::InvalidPayload { field, .. } => assert_eq!(field, "xnodes[0].Add.inputs[0]"),
        other => panic!("{other}"),
    }
}

#[test]
fn data_movement_softmax_and_matrix_products() {
    // x [2,3] -> cat(x, x, axis 1) [2,6] -> slice offsets [0,1] sizes [2,4] -> pad
    // pre [1,0] post [0,1] with -1 [3,5] -> softmax -> s [3,5];
    // bmm(s, w [5,2]) -> out0; fully connected(s, w as [ic, oc] with the transpose
    // flag, bias) -> out1.
    let w = data(10, 9);
    let bias = [0.5f32, -0.25];
    let mut constants = bytes(&w);
    constants.extend(bytes(&bias));
    let cat = T::new()
        .f(0, F::U32(1))
        .f(1, F::U32(0))
        .f(2, F::U32(0))
        .f(5, F::U32(1));
    let slice = T::new()
        .f(0, F::U32(2))
        .f(1, F::VecU32(vec![0, 1]))
        .f(2, F::VecU32(vec![2, 4]))
        .f(3, F::U32(1))
        .f(4, F::U32(2));
    let pad = T::new()
        .f(0, F::VecU32(vec![1, 0]))
        .f(1, F::VecU32(vec![0, 1]))
        .f(2, F::F32(-1.0))
        .f(3, F::U32(2))
        .f(4, F::U32(3));
    let softmax = T::new().f(0, F::U32(3)).f(1, F::U32(4));
    let bmm = T::new().f(0, F::U32(4)).f(1, F::U32(5)).f(2, F::U32(6));
    let fc = T::new()
        .f(0, F::U32(4))
        .f(1, F::U32(5))
        .f(2, F::U32(7))
        .f(3, F::U32(8))
        .f(4, F::U32(1));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[2, 3], Some((0, 1)), 0),
            fbs::value(1, &[2, 6], None, 0),
            fbs::value(2, &[2, 4], None, 0),
            fbs::value(3, &[3, 5], None, 0),
            fbs::value(4, &[3, 5], None, 0),
            fbs::value(5, &[5, 2], None, 1),
            fbs::value(6, &[3, 2], Some((1, 2)), 0),
            fbs::value(7, &[2], None, 2),
            fbs::value(8, &[3, 2], Some((2, 2)), 0),
        ],
        vec![
            fbs::node(32, cat, None),
            fbs::node(35, slice, None),
            fbs::node(10, pad, None),
            fbs::node(3, softmax, None),
            fbs::node(37, bmm, None),
            fbs::node(2, fc, None),
        ],
        3,
        vec![fbs::constant_at(0, 40), fbs::constant_at(40, 8)],
    );
    let payload = fbs::payload(&fbs::finish(&g), &constants);
    let handle = init_standalone(&payload);
    let x = data(6, 4);
    let mut h = Harness::new();
    let xi = h.tensor(&[2, 3], &x);
    let y0 = h.out(ScalarType::Float, &[3, 2]);
    let y1 = h.out(ScalarType::Float, &[3, 2]);
    run(&mut h, handle.as_ref(), &[xi, y0, y1]).unwrap();
    // The same steps by hand.
    let cat: Vec<f32> = (0..2)
        .flat_map(|r| [&x[r * 3..r * 3 + 3], &x[r * 3..r * 3 + 3]].concat())
        .collect();
    let sl: Vec<f32> = (0..2)
        .flat_map(|r| cat[r * 6 + 1..r * 6 + 5].to_vec())
        .collect();
    let mut padded = vec![-1f32; 15];
    for r in 0..2 {
        padded[(r + 1) * 5..(r + 1) * 5 + 4].copy_from_slice(&sl[r * 4..r * 4 + 4]);
    }
    let mut s = padded.clone();
    for row in s.chunks_mut(5) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|v| (v - m).exp()).sum();
        row.iter_mut().for_each(|v| *v = (*v - m).exp() / sum);
    }
    let got0: Vec<f32> = h.read(y0);
    let got1: Vec<f32> = h.read(y1);
    for r in 0..3 {
        for j in 0..2 {
            let want: f32 = (0..5).map(|k| s[r * 5 + k] * w[k * 2 + j]).sum();
            assert!((got0[r * 2 + j] - want).abs() < 1e-5, "{got0:?}");
            assert!((got1[r * 2 + j] - want - bias[j]).abs() < 1e-5, "{got1:?}");
        }
    }
}

#[test]
fn resize_and_transposed_convolution_shapes() {
    // x [1,2,2,1] -> bilinear 4x4 (half-pixel) -> deconvolution 2x2 stride 2 (filter of
    // ones, no bias) -> [1,8,8,1]: each output pixel copies one resized pixel.
    let filter = [1.0f32; 4];
    let resize = T::new()
        .f(0, F::U32(4))
        .f(1, F::U32(4))
        .f(2, F::U32(0))
        .f(3, F::U32(1));
    let mut deconv = conv_body(0, 2, 2, 1, 1, 1, [1, 2, u32::MAX, 3]);
    deconv.0.retain(|(id, _)| *id != 17);
    let deconv = deconv.f(17, F::U32(u32::MAX));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[1, 2, 2, 1], Some((0, 1)), 0),
            fbs::value(1, &[1, 4, 4, 1], None, 0),
            fbs::value(2, &[1, 2, 2, 1], None, 1),
            fbs::value(3, &[1, 8, 8, 1], Some((1, 2)), 0),
        ],
        vec![fbs::node(9, resize, None), fbs::node(39, deconv, None)],
        2,
        vec![fbs::constant_at(0, 16)],
    );
    let payload = fbs::payload(&fbs::finish(&g), &bytes(&filter));
    let handle = init_standalone(&payload);
    let mut h = Harness::new();
    let xi = h.tensor(&[1, 2, 2, 1], &[0.0f32, 4.0, 8.0, 12.0]);
    let yi = h.out(ScalarType::Float, &[1, 8, 8, 1]);
    run(&mut h, handle.as_ref(), &[xi, yi]).unwrap();
    let got: Vec<f32> = h.read(yi);
    // Resized row 0: [0, 1, 3, 4]; rows blend by 0, 0.25, 0.75, 1 towards [8, 9, 11, 12].
    let row = [0.0f32, 1.0, 3.0, 4.0];
    let blend = [0.0f32, 0.25, 0.75, 1.0];
    for oy in 0..8 {
        for ox in 0..8 {
            let want = row[ox / 2] + 8.0 * blend[oy / 2];
            assert!((got[oy * 8 + ox] - want).abs() < 1e-5, "{oy},{ox}: {got:?}");
        }
    }
}

#[test]
fn dynamically_quantized_linear_with_4_bit_blocks() {
    // x [2,64] -> Convert to qdint8 (per token) -> FullyConnected with qbint4 weights
    // [3,64] in blocks of 32 (bf16 scales) and an fp32 bias -> [2,3]. Compared with the
    // float product of the dequantized weights: the only difference is the activation
    // quantization (at most half a step per element).
    let (n, k) = (3usize, 64usize);
    let q: Vec<i8> = (0..n * k).map(|i| ((i * 7 + 3) % 16) as i8 - 8).collect();
    let mut packed = vec![0u8; n * k / 2];
    for r in 0..n {
        for c in (0..k).step_by(2) {
            let lo = (q[r * k + c] + 8) as u8;
            let hi = (q[r * k + c + 1] + 8) as u8;
            packed[r * k / 2 + c / 2] = (hi << 4) | lo;
        }
    }
    let scales_f: Vec<f32> = (0..n * 2).map(|i| 0.015625 * (i + 1) as f32).collect(); // exact in bf16
    let scales: Vec<u16> = scales_f
        .iter()
        .map(|s| (s.to_bits() >> 16) as u16)
        .collect();
    let bias = [0.25f32, -0.5, 1.0];
    let mut constants = packed.clone();
    let s_off = constants.len();
    constants.extend(bytemuck::cast_slice::<u16, u8>(&scales));
    let b_off = constants.len();
    constants.extend(bytes(&bias));
    let dyn_q = T::new().f(0, F::I32(1));
    let group = T::new()
        .f(1, F::I32(0))
        .f(2, F::I32(32))
        .f(4, F::U32(2))
        .f(5, F::U32((n * 2) as u32));
    let convert = T::new().f(0, F::U32(0)).f(1, F::U32(1));
    let fc = T::new()
        .f(0, F::U32(1))
        .f(1, F::U32(2))
        .f(2, F::U32(3))
        .f(3, F::U32(4));
    let g = fbs::graph(
        vec![
            fbs::value(0, &[2, 64], Some((0, 1)), 0),
            fbs::qvalue(1, 9, &[2, 64], 0, 3, dyn_q),
            fbs::qvalue(2, 10, &[3, 64], 1, 4, group),
            fbs::value(3, &[3], None, 3),
            fbs::value(4, &[2, 3], Some((1, 2)), 0),
        ],
        vec![fbs::node(18, convert, None), fbs::node(2, fc, None)],
        2,
        vec![
            fbs::constant_at(0, s_off as u64),
            fbs::constant_at(s_off as u64, (b_off - s_off) as u64),
            fbs::constant_at(b_off as u64, 12),
        ],
    );
    let payload = fbs::payload(&fbs::finish(&g), &constants);
    let handle = init_standalone(&payload);
    assert_eq!(
        handle.summary().nodes,
        vec![
            ("Convert".to_string(), 1),
            ("FullyConnected".to_string(), 1)
        ]
    );
    let x = data(2 * k, 8);
    let mut h = Harness::new();
    let xi = h.tensor(&[2, 64], &x);
    let yi = h.out(ScalarType::Float, &[2, 3]);
    run(&mut h, handle.as_ref(), &[xi, yi]).unwrap();
    let got: Vec<f32> = h.read(yi);
    for r in 0..2 {
        for j in 0..n {
            let want: f32 = (0..k)
                .map(|c| x[r * k + c] * q[j * k + c] as f32 * scales_f[j * 2 + c / 32])
                .sum::<f32>()
                + bias[j];
            assert!(
                (got[r * n + j] - want).abs() < 0.05,
                "{got:?} vs {want} at {r},{j}"
            );
        }
    }
}

#[test]
fn mutated_synthetic_graphs_never_panic() {
    // The conv graph and the quantized-linear graph exercise the window, filter and
    // quantization parsers; mutate their flatbuffers byte by byte.
    let (conv, _, _) = conv_payload(1);
    for_each_valid_mutation(&conv, 0x2545f4914f6cdd1d, 600, |handle| {
        // A graph that still validates must run (or fail with an error) on inputs of
        // its declared shape.
        let mut h = Harness::new();
        let xi = h.tensor(&[1, 5, 5, 3], &data(75, 1));
        let yi = h.out(ScalarType::Float, &[1, 3, 3, 4]);
        let _ = run(&mut h, handle, &[xi, yi]);
    });
}
