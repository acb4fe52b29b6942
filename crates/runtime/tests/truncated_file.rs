//! A `.pte` file truncated while a program loaded from it is in use: with `--load read`
//! or `--load huge-pages` the program holds a private copy and runs on unchanged; with
//! `--load mmap` the weights are the file's pages, and touching one past the new end
//! raises SIGBUS, which kills the process (as upstream's mmap loader does). The mmap
//! case runs in a child process (this test binary again), so the signal is observed
//! instead of taking the test run down.

use std::path::{Path, PathBuf};

use etch_runtime::{LoadMode, Program, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn inputs() -> Vec<Value> {
    let dir = fixtures().join("tiny_llama_fp32");
    ["call0.in0.npy", "call0.in1.npy"]
        .iter()
        .map(|n| Value::Tensor(etch_runtime::npy::read_npy_file(&dir.join(n)).expect("npy")))
        .collect()
}

fn expected() -> Vec<f32> {
    let path = fixtures().join("tiny_llama_fp32").join("call0.out0.npy");
    let t = etch_runtime::npy::read_npy_file(&path).expect("npy");
    t.as_slice::<f32>().expect("f32").to_vec()
}

/// Copies the fixture to a fresh file, loads it with `mode`, truncates the file to
/// zero bytes, drops the page cache's copy of it, and runs `forward` once.
fn load_truncate_run(mode: LoadMode, copy: &Path) -> Vec<f32> {
    std::fs::copy(fixtures().join("tiny_llama_fp32.pte"), copy).expect("copy");
    let program = Program::from_path(copy)
        .load_mode(mode)
        .threads(1)
        .build_program()
        .expect("loads");
    let mut method = program.method("forward").expect("session");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(copy)
        .expect("open for truncation");
    file.set_len(0).expect("truncate");
    drop(file);
    method.set_inputs(&inputs()).expect("inputs");
    method.execute().expect("execute");
    let out = method.output_tensor(0).expect("logits");
    out.as_slice::<f32>().expect("f32").to_vec()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn private_copies_survive_the_file_being_truncated() {
    let dir = std::env::temp_dir().join(format!("etch-truncate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let want = expected();
    for (mode, name) in [
        (LoadMode::Read, "read"),
        (LoadMode::HugePages, "huge-pages"),
    ] {
        let got = load_truncate_run(mode, &dir.join(format!("{name}.pte")));
        assert!(max_abs_diff(&got, &want) < 1e-4, "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const CHILD: &str = "ETCH_TRUNCATED_MMAP_CHILD";

#[test]
fn a_truncated_mapping_is_sigbus() {
    if let Some(copy) = std::env::var_os(CHILD) {
        // The child: this is expected to die of SIGBUS in `execute`.
        load_truncate_run(LoadMode::Mmap, Path::new(&copy));
        eprintln!("ran to completion");
        return;
    }
    let copy = std::env::temp_dir().join(format!("etch-truncate-mmap-{}.pte", std::process::id()));
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "a_truncated_mapping_is_sigbus", "--nocapture"])
        .env(CHILD, &copy)
        .status()
        .expect("child runs");
    let _ = std::fs::remove_file(&copy);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::ExitStatusExt;
        const SIGBUS: i32 = 7;
        assert_eq!(
            status.signal(),
            Some(SIGBUS),
            "a mapped program whose file is truncated under it dies of SIGBUS ({status})"
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = status;
}
