//! The real XNNPACK payload of `xnnpack_linear.pte` (ExecuTorch 1.5.1:
//! `relu(linear(x)) + 1.0`, weights as named data): parse, summarise, run, and compare
//! with the same arithmetic done here on the file's own weights.

mod common;

use common::*;
use etch_format::ScalarType;
use etch_kernels::testing::Harness;

#[test]
fn parses_and_summarises() {
    let file = linear_program();
    let handle = init_linear(&file);
    let s = handle.summary();
    let kinds: Vec<&str> = s.nodes.iter().map(|(k, _)| k.as_str()).collect();
    assert!(kinds.contains(&"FullyConnected"), "{s:?}");
    // 4 x 8 weights and 4 biases packed.
    assert!(s.packed_bytes >= (32 + 4) * 4, "{s:?}");
}

#[test]
fn runs_like_the_formula_on_the_files_weights() {
    let file = linear_program();
    let handle = init_linear(&file);
    let mut weight = Vec::new();
    let mut bias = Vec::new();
    for nd in &file.program().named_data {
        let r = file.named_data(&nd.key).unwrap();
        let v: Vec<f32> = bytemuck::pod_collect_to_vec(file.slice(r).unwrap());
        if v.len() == 32 { weight = v } else { bias = v }
    }
    let x: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) / 4.0).collect();
    let mut h = Harness::new();
    let xi = h.tensor(&[2, 8], &x);
    // The `+ 1.0` constant arrives as a rank-0 delegate input (serialized dims [1]).
    let one = h.tensor::<f32>(&[], &[1.0]);
    let yi = h.out(ScalarType::Float, &[2, 4]);
    run(&mut h, handle.as_ref(), &[xi, one, yi]).unwrap();
    let got: Vec<f32> = h.read(yi);
    for r in 0..2 {
        for o in 0..4 {
            let s: f32 = (0..8)
                .map(|k| x[r * 8 + k] * weight[o * 8 + k])
                .sum::<f32>()
                + bias[o];
            let want = s.max(0.0) + 1.0;
            assert!((got[r * 4 + o] - want).abs() < 1e-5, "{got:?}");
        }
    }
    // Dynamic rows: one row only, the output is resized.
    let x1 = h.tensor(&[1, 8], &x[..8]);
    let y1 = h.out(ScalarType::Float, &[2, 4]);
    run(&mut h, handle.as_ref(), &[x1, one, y1]).unwrap();
    assert_eq!(h.tensor_meta(y1).sizes(), &[1, 4]);
    assert_eq!(h.read::<f32>(y1)[..], got[..4]);
}
