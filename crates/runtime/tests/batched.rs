//! `Method::execute_batch`: sessions of one program run in lockstep get the outputs
//! each gets from `execute` alone, bit for bit; the products with constant weights
//! (`addmm`, `mm`, `bmm` and the delegate's `BatchMatrixMultiply` of one row each) run
//! once for all of them.

use std::path::{Path, PathBuf};

use etch_runtime::{Batch, LoadMode, Method, Program, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// Seeded inputs of `method`'s shapes (f32 tensors).
fn inputs(method: &Method, seed: u64) -> Vec<Value> {
    let mut state = seed * 2654435761 + 1;
    method
        .meta()
        .inputs
        .iter()
        .map(|info| match info {
            etch_runtime::ValueInfo::Tensor(t) => {
                let n: usize = t.sizes.iter().product();
                let data: Vec<f32> = (0..n)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        (state % 2001) as f32 / 1000.0 - 1.0
                    })
                    .collect();
                Value::Tensor(etch_runtime::HostTensor::from_slice(&t.sizes, &data))
            }
            other => panic!("input {other:?} is not a tensor"),
        })
        .collect()
}

fn outputs(method: &mut Method) -> Vec<Vec<u32>> {
    (0..method.meta().outputs.len())
        .map(|i| {
            let out = method.output_tensor(i).expect("output");
            out.as_slice::<f32>()
                .expect("f32 output")
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

fn batched_equals_alone(name: &str, threads: usize, min_shared: u64) {
    let program = Program::from_path(fixtures().join(format!("{name}.pte")))
        .load_mode(LoadMode::Read)
        .threads(threads)
        .build_program()
        .expect("fixture loads");
    let mut alone = program.method("forward").expect("session");
    let want: Vec<_> = (0..3)
        .map(|s| {
            alone.set_inputs(&inputs(&alone, s)).unwrap();
            alone.execute().unwrap();
            outputs(&mut alone)
        })
        .collect();
    let mut sessions: Vec<Method> = (0..3).map(|_| program.method("forward").unwrap()).collect();
    for (s, m) in sessions.iter_mut().enumerate() {
        let values = inputs(m, s as u64);
        m.set_inputs(&values).unwrap();
    }
    let mut batch = Batch::new();
    for m in sessions.iter_mut() {
        assert!(batch.push(m).is_ok());
    }
    Method::execute_batch(&mut batch).expect("batched step");
    for (s, m) in sessions.iter_mut().enumerate() {
        assert_eq!(
            outputs(m),
            want[s],
            "{name}, {threads} threads: session {s}"
        );
    }
    let stats = sessions[0].stats();
    assert_eq!(stats.batched_executions, 1, "{name}");
    assert!(
        stats.shared_instructions >= min_shared,
        "{name}: {} instructions shared",
        stats.shared_instructions
    );
}

#[test]
fn batched_sessions_get_the_bits_they_get_alone() {
    for threads in [1, 2] {
        // The classifier's `addmm` ([1, 1280] x a constant [1280, 1000]).
        batched_equals_alone("vision_mobilenet_v2", threads, 1);
        batched_equals_alone("vision_resnet", threads, 1);
        // `mm` of two inputs: nothing to share, every session on its own.
        batched_equals_alone("matmul", threads, 0);
        // One row per batch against a constant: portable `bmm`, XNNPACK's
        // `BatchMatrixMultiply`.
        batched_equals_alone("bmm_constant", threads, 1);
        batched_equals_alone("xnn_bmm_constant", threads, 1);
    }
}
