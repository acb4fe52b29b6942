//! Runs every fixture in `tests/fixtures/manifest.json` through etch and compares the
//! outputs with the official runtime's, recorded by `tools/fixtures/export.py`.
//!
//! Fixtures listed in `tests/conformance/expected_failures.txt` must fail; one that
//! starts passing fails this test, so the list only shrinks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use etch_format::ScalarType;
use etch_runtime::{HostTensor, LoadMode, Module, Value};
use serde::Deserialize;

#[derive(Deserialize)]
struct Manifest {
    fixtures: Vec<Fixture>,
}

#[derive(Deserialize)]
struct Fixture {
    name: String,
    pte: String,
    rtol: f64,
    atol: f64,
    calls: Vec<Call>,
}

#[derive(Deserialize)]
struct Call {
    method: String,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
}

#[derive(Deserialize)]
struct Io {
    npy: Option<String>,
    dtype: Option<String>,
    int: Option<i64>,
    double: Option<f64>,
    bool: Option<bool>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load_io(dir: &Path, io: &Io) -> Result<Value, String> {
    if let Some(npy) = &io.npy {
        let dtype_name = io.dtype.as_deref().unwrap_or("f32");
        let dtype =
            ScalarType::from_name(dtype_name).ok_or(format!("unknown dtype {dtype_name}"))?;
        let path = dir.join(npy);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let t = etch_runtime::npy::read_npy_as(&bytes, npy, dtype).map_err(|e| e.to_string())?;
        return Ok(Value::Tensor(t));
    }
    if let Some(v) = io.int {
        return Ok(Value::Int(v));
    }
    if let Some(v) = io.double {
        return Ok(Value::Double(v));
    }
    if let Some(v) = io.bool {
        return Ok(Value::Bool(v));
    }
    Ok(Value::None)
}

fn as_f64(t: &HostTensor) -> Option<Vec<f64>> {
    use half::{bf16, f16};
    let d = &t.data;
    Some(match t.dtype {
        ScalarType::Float => bytemuck::pod_collect_to_vec::<u8, f32>(d)
            .iter()
            .map(|&x| x as f64)
            .collect(),
        ScalarType::Double => bytemuck::pod_collect_to_vec::<u8, f64>(d),
        ScalarType::Half => bytemuck::pod_collect_to_vec::<u8, f16>(d)
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        ScalarType::BFloat16 => bytemuck::pod_collect_to_vec::<u8, bf16>(d)
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        _ => return None,
    })
}

fn compare(got: &Value, want: &Value, rtol: f64, atol: f64) -> Result<(), String> {
    match (got, want) {
        (Value::Tensor(g), Value::Tensor(w)) => {
            if g.dtype != w.dtype {
                return Err(format!("dtype {} != expected {}", g.dtype, w.dtype));
            }
            if g.sizes != w.sizes {
                return Err(format!("shape {:?} != expected {:?}", g.sizes, w.sizes));
            }
            match (as_f64(g), as_f64(w)) {
                (Some(gv), Some(wv)) => {
                    let mut worst = (0.0f64, 0usize);
                    for (i, (a, b)) in gv.iter().zip(&wv).enumerate() {
                        let ok = (a.is_nan() && b.is_nan())
                            || a == b
                            || (a - b).abs() <= atol + rtol * b.abs();
                        if !ok {
                            let err = (a - b).abs();
                            if err > worst.0 || worst.0.is_nan() {
                                worst = (err, i);
                            }
                            if err.is_nan() {
                                worst = (f64::INFINITY, i);
                            }
                        }
                    }
                    if worst.0 > 0.0 {
                        let i = worst.1;
                        return Err(format!(
                            "element {i}: {} vs expected {} (|diff| {:e}, rtol {rtol:e}, atol {atol:e})",
                            gv[i], wv[i], worst.0
                        ));
                    }
                    Ok(())
                }
                _ if g.data == w.data => Ok(()),
                _ => {
                    let i = g
                        .data
                        .iter()
                        .zip(&w.data)
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    Err(format!("{} data differs from byte {i}", g.dtype))
                }
            }
        }
        (Value::Double(a), Value::Double(b)) if (a - b).abs() <= atol + rtol * b.abs() => Ok(()),
        (a, b) if a == b => Ok(()),
        (a, b) => Err(format!("{a:?} != expected {b:?}")),
    }
}

fn run_fixture(dir: &Path, f: &Fixture, threads: usize, load: LoadMode) -> Result<(), String> {
    let mut module = Module::from_path(dir.join(&f.pte))
        .load_mode(load)
        .threads(threads)
        .build()
        .map_err(|e| format!("load: {e}"))?;
    for (k, call) in f.calls.iter().enumerate() {
        let inputs: Vec<Value> = call
            .inputs
            .iter()
            .map(|io| load_io(dir, io))
            .collect::<Result<_, _>>()?;
        let outputs = module
            .execute(&call.method, &inputs)
            .map_err(|e| format!("call {k} ({}): {e}", call.method))?;
        if outputs.len() != call.outputs.len() {
            return Err(format!(
                "call {k}: {} outputs, expected {}",
                outputs.len(),
                call.outputs.len()
            ));
        }
        for (j, (got, want)) in outputs.iter().zip(&call.outputs).enumerate() {
            let want = load_io(dir, want)?;
            compare(got, &want, f.rtol, f.atol)
                .map_err(|e| format!("call {k} ({}) output {j}: {e}", call.method))?;
        }
    }
    Ok(())
}

#[test]
fn conformance() {
    let dir = root().join("tests/fixtures");
    let manifest_path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path).expect("tests/fixtures/manifest.json");
    let manifest: Manifest = serde_json::from_str(&text).expect("valid manifest");
    let expected_text =
        std::fs::read_to_string(root().join("tests/conformance/expected_failures.txt"))
            .unwrap_or_default();
    let expected: BTreeSet<&str> = expected_text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();

    let mut passed = 0;
    let mut expected_failures = 0;
    let mut problems = Vec::new();
    for f in &manifest.fixtures {
        // Every load mode reaches the same bytes; each is exercised on every fixture.
        let runs = [
            (1, LoadMode::Read),
            (2, LoadMode::HugePages),
            (1, LoadMode::Mmap),
            (2, LoadMode::Auto),
        ];
        let result = runs.iter().try_for_each(|&(threads, load)| {
            run_fixture(&dir, f, threads, load)
                .map_err(|e| format!("[{threads} threads, {load:?}] {e}"))
        });
        match (result, expected.contains(f.name.as_str())) {
            (Ok(()), false) => passed += 1,
            (Ok(()), true) => problems.push(format!(
                "{}: passes now; remove it from tests/conformance/expected_failures.txt",
                f.name
            )),
            (Err(_), true) => expected_failures += 1,
            (Err(e), false) => problems.push(format!("{}: {e}", f.name)),
        }
    }
    for name in &expected {
        if !manifest.fixtures.iter().any(|f| f.name == *name) {
            problems.push(format!(
                "{name}: listed as an expected failure but not in the manifest"
            ));
        }
    }
    println!("conformance: {passed} passed, {expected_failures} expected failures");
    assert!(
        problems.is_empty(),
        "conformance problems:\n{}",
        problems.join("\n")
    );
}
