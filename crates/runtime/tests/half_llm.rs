//! The tiny Llama's checkpoint exported in half precision through XNNPACK
//! (`tiny_llama_f16_xnnpack`, fp16 values in every delegate): the official runtime
//! 1.5.1 cannot run it (a segmentation fault on its first call), so its logits are
//! compared with the official fp32 program's (`tiny_llama_fp32`, same checkpoint, same
//! calls) within what half precision allows, and its greedy tokens must be the same.

use std::path::{Path, PathBuf};

use etch_runtime::npy::read_npy_file;
use etch_runtime::{LoadMode, Module, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 { (i, x) } else { best }
        })
        .0
}

#[test]
fn half_precision_logits_follow_the_fp32_program() {
    let mut module = Module::from_path(fixtures().join("tiny_llama_f16_xnnpack.pte"))
        .load_mode(LoadMode::Read)
        .threads(1)
        .build()
        .expect("fixture loads");
    let reference = fixtures().join("tiny_llama_fp32");
    // Calls 0-4 of the fp32 fixture: a 7-token prefill, then 4 greedy decode steps.
    for call in 0..5 {
        let input = |k: usize| {
            Value::Tensor(
                read_npy_file(&reference.join(format!("call{call}.in{k}.npy"))).expect("npy"),
            )
        };
        let outs = module
            .execute("forward", &[input(0), input(1)])
            .expect("forward");
        let Some(Value::Tensor(logits)) = outs.first() else {
            panic!("call {call}: no logits");
        };
        let got: Vec<f32> = logits
            .as_slice::<half::f16>()
            .expect("f16 logits")
            .iter()
            .map(|x| x.to_f32())
            .collect();
        let want = read_npy_file(&reference.join(format!("call{call}.out0.npy")))
            .expect("npy")
            .as_slice::<f32>()
            .expect("f32 logits");
        let last = &want[want.len() - got.len().min(want.len())..];
        let scale = last.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(last)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        eprintln!("call {call}: max |f16 - f32| {worst:.4} of max |logit| {scale:.3}");
        assert!(
            worst <= 0.005 * scale,
            "call {call}: |f16 - f32| {worst} of {scale}"
        );
        assert_eq!(argmax(&got), argmax(last), "call {call}: greedy token");
    }
}
