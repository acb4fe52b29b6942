//! A method etch cannot read does not stop the others: the program loads, every other
//! method runs as before, and the broken one fails with an error that names it.

use std::path::{Path, PathBuf};

use etch_format::ProgramFile;
use etch_format::flatbuf::{Buffer, FieldPath};
use etch_memory::SharedBytes;
use etch_runtime::{LoadMode, Module, Program, RuntimeError, Value};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn npy(path: &Path) -> Value {
    Value::Tensor(etch_runtime::npy::read_npy_file(path).expect("fixture npy"))
}

/// `bytes` with the dtype of the first tensor value of method `method` set to
/// `scalar_type`, found by walking the FlatBuffers tables (field ids of
/// schema/program.fbs: Program.execution_plan 1; ExecutionPlan.name 0, .values 2;
/// EValue.val_type 0; Tensor.scalar_type 0).
fn with_dtype(mut bytes: Vec<u8>, method: &str, scalar_type: i8) -> Vec<u8> {
    let file = ProgramFile::from_bytes(SharedBytes::from_vec_aligned(bytes.clone()).unwrap())
        .expect("the fixture loads");
    let position = {
        let buf = Buffer::new(&bytes[..file.program_size()]);
        let path = FieldPath::Root;
        let plans = buf
            .root(&path)
            .unwrap()
            .tables(1, usize::MAX, &path)
            .unwrap();
        let plan = (0..plans.len())
            .map(|i| plans.get(i, &path).unwrap())
            .find(|p| p.required_string(0, &path).unwrap() == method)
            .expect("the method");
        let values = plan.tables(2, usize::MAX, &path).unwrap();
        (0..values.len())
            .find_map(
                |i| match values.get(i, &path).unwrap().union(0, &path).unwrap() {
                    (5, Some(tensor)) => tensor.field(0, 1, &path).unwrap(),
                    _ => None,
                },
            )
            .expect("a tensor with a stored dtype")
    };
    bytes[position] = scalar_type as u8;
    bytes
}

/// ScalarType 9 (ComplexFloat): defined by PyTorch, unknown to etch.
const UNKNOWN_DTYPE: i8 = 9;

fn program(bytes: Vec<u8>) -> Program {
    Program::from_bytes(SharedBytes::from_vec_aligned(bytes).unwrap())
        .threads(1)
        .build_program()
        .expect("the program loads")
}

/// The `forward` calls of the two_methods fixture: inputs and expected outputs.
fn forward_calls() -> Vec<(Vec<Value>, Vec<Value>)> {
    let dir = fixture("two_methods");
    [0, 2]
        .into_iter()
        .map(|k| {
            (
                vec![npy(&dir.join(format!("call{k}.in0.npy")))],
                vec![npy(&dir.join(format!("call{k}.out0.npy")))],
            )
        })
        .collect()
}

fn close(a: &Value, b: &Value) -> bool {
    let (Value::Tensor(a), Value::Tensor(b)) = (a, b) else {
        return false;
    };
    let (a, b) = (a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 + 1e-4 * y.abs())
}

#[test]
fn a_broken_method_leaves_the_others_usable() {
    let original = std::fs::read(fixture("two_methods.pte")).unwrap();
    let broken = program(with_dtype(original.clone(), "other", UNKNOWN_DTYPE));
    assert_eq!(broken.method_names(), ["forward", "other"]);
    assert!(broken.has_method("other"));

    // `forward` runs, with the outputs of the intact program.
    let intact = program(original);
    let mut good = broken.method("forward").expect("forward loads");
    let mut reference = intact.method("forward").unwrap();
    for (inputs, expected) in forward_calls() {
        good.set_inputs(&inputs).unwrap();
        good.execute().unwrap();
        reference.set_inputs(&inputs).unwrap();
        reference.execute().unwrap();
        let out = good.outputs().unwrap();
        assert_eq!(out, reference.outputs().unwrap());
        assert!(close(&out[0], &expected[0]), "{out:?} vs {expected:?}");
    }
    assert!(broken.method_meta("forward").is_ok());

    // `other` fails, naming itself and the field.
    let checks: [(&str, RuntimeError); 3] = [
        ("method", broken.method("other").unwrap_err()),
        ("plan", broken.plan("other").unwrap_err()),
        ("method_meta", broken.method_meta("other").unwrap_err()),
    ];
    for (call, e) in checks {
        let RuntimeError::InvalidMethod { method, source } = &e else {
            panic!("{call}: {e:?}");
        };
        assert_eq!(method, "other");
        assert_eq!(
            source.path(),
            Some("execution_plan[1].values[0].tensor.scalar_type"),
            "{call}: {e}"
        );
        let message = e.to_string();
        assert!(
            message.starts_with("method \"other\"") && message.contains("unknown ScalarType 9"),
            "{call}: {message}"
        );
    }
    // A method that does not exist is still a different error.
    assert!(matches!(
        broken.method("nope").unwrap_err(),
        RuntimeError::MethodNotFound { .. }
    ));

    // The same through a Module.
    let mut module = Module::from_program(broken);
    let (inputs, expected) = forward_calls().remove(0);
    let out = module.execute("forward", &inputs).expect("forward runs");
    assert!(close(&out[0], &expected[0]));
    let e = module.execute("other", &[]).unwrap_err();
    assert!(matches!(e, RuntimeError::InvalidMethod { .. }), "{e}");
}

#[test]
fn metadata_methods_work_when_forward_is_broken() {
    let path = fixture("tiny_llama_fp32.pte");
    let broken = with_dtype(std::fs::read(&path).unwrap(), "forward", UNKNOWN_DTYPE);
    let broken_path =
        std::env::temp_dir().join(format!("etch-broken-forward-{}.pte", std::process::id()));
    std::fs::write(&broken_path, broken).unwrap();
    for mode in [LoadMode::Mmap, LoadMode::Read, LoadMode::Auto] {
        let mut module = Program::from_path(&broken_path)
            .load_mode(mode)
            .threads(1)
            .build()
            .expect("the program loads");
        let out = module.execute("get_max_seq_len", &[]).expect("metadata");
        assert!(matches!(out[..], [Value::Int(n)] if n > 0), "{out:?}");
        let e = module.execute("forward", &[]).unwrap_err();
        assert!(e.to_string().starts_with("method \"forward\""), "{e}");
    }
    std::fs::remove_file(&broken_path).unwrap();
}
