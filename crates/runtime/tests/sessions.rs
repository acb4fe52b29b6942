//! Program and session: one loaded program, several sessions with their own state;
//! delegates resolved against the backend registry at load.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use etch_kernels::backend::BackendInitContext;
use etch_kernels::{
    Args, Backend, BackendError, DelegateHandle, DelegateSummary, KernelContext, KernelError,
};
use etch_runtime::{LoadMode, Method, Program, RuntimeError, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn xnnpack_linear() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../format/tests/data/xnnpack_linear.pte")
}

fn npy(name: &str) -> Value {
    let path = fixtures().join("tiny_llama_fp32").join(name);
    Value::Tensor(etch_runtime::npy::read_npy_file(&path).expect("fixture npy"))
}

fn call_inputs(k: usize) -> Vec<Value> {
    vec![
        npy(&format!("call{k}.in0.npy")),
        npy(&format!("call{k}.in1.npy")),
    ]
}

fn run(method: &mut Method, k: usize) -> Vec<f32> {
    method.set_inputs(&call_inputs(k)).expect("inputs");
    method.execute().expect("execute");
    let out = method.output_tensor(0).expect("logits");
    out.as_slice::<f32>().expect("f32 logits").to_vec()
}

#[test]
fn program_is_shareable_and_sessions_are_sendable() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Program>();
    send::<Method>();
}

#[test]
fn interleaved_sessions_give_the_tokens_each_gives_alone() {
    let program = Program::from_path(fixtures().join("tiny_llama_fp32.pte"))
        .load_mode(LoadMode::Read)
        .threads(1)
        .build_program()
        .expect("fixture loads");
    let mut alone = program.method("forward").expect("session");
    let reference: Vec<Vec<f32>> = (0..5).map(|k| run(&mut alone, k)).collect();

    let mut a = program.method("forward").expect("session a");
    let mut b = program.method("forward").expect("session b");
    for (k, want) in reference.iter().enumerate() {
        // b runs a step behind a: each session's KV cache must hold its own history.
        assert_eq!(&run(&mut a, k), want, "session a, call {k}");
        if k > 0 {
            assert_eq!(
                run(&mut b, k - 1),
                reference[k - 1],
                "session b, call {}",
                k - 1
            );
        }
    }
    assert_eq!(run(&mut b, 4), reference[4], "session b, call 4");
}

#[test]
fn sessions_on_threads_share_the_weights() {
    let program = Program::from_path(fixtures().join("tiny_llama_fp32.pte"))
        .load_mode(LoadMode::Read)
        .threads(1)
        .build_program()
        .expect("fixture loads");
    let mut first = program.method("forward").expect("session");
    let reference: Vec<Vec<f32>> = (0..5).map(|k| run(&mut first, k)).collect();
    let sessions: Vec<Method> = (0..3).map(|_| program.method("forward").unwrap()).collect();
    let planned = sessions[0].planned_bytes();
    // A new session costs its planned memory only, from its own allocator: the
    // weights stay in the program.
    assert_eq!(program.memory_allocator_stats(), None);
    for session in &sessions {
        let live = session.planned_allocator_stats().bytes_live;
        assert!(
            live >= planned && live < planned + 4096,
            "a session holds {live} planned bytes, it plans {planned}"
        );
    }
    std::thread::scope(|s| {
        for (i, mut session) in sessions.into_iter().enumerate() {
            let reference = &reference;
            s.spawn(move || {
                for (k, want) in reference.iter().enumerate() {
                    assert_eq!(&run(&mut session, k), want, "thread {i}, call {k}");
                }
            });
        }
    });
}

#[test]
fn a_missing_backend_fails_at_load_with_its_name() {
    let program = Program::from_path(xnnpack_linear())
        .backends(etch_runtime::BackendRegistry::empty())
        .build_program()
        .expect("the file is valid");
    let err = program.method("forward").expect_err("no backend");
    assert!(
        matches!(err, RuntimeError::DelegateUnavailable { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("delegate backend \"XnnpackBackend\" is not available"),
        "{err}"
    );
}

/// A stand-in backend: checks what init receives, and fills outputs with a constant.
struct FakeXnnpack {
    executions: Arc<AtomicUsize>,
}

struct FakeHandle {
    named_bytes: usize,
    executions: Arc<AtomicUsize>,
}

impl Backend for FakeXnnpack {
    fn id(&self) -> &'static str {
        "XnnpackBackend"
    }

    fn init(
        &self,
        processed: &[u8],
        ctx: &BackendInitContext<'_>,
    ) -> Result<Box<dyn DelegateHandle>, BackendError> {
        if processed.get(4..8) != Some(b"XH00".as_slice()) {
            return Err(BackendError::InvalidPayload {
                field: "header".into(),
                reason: "no XH00 magic".into(),
            });
        }
        assert_eq!(ctx.method, "forward");
        assert_eq!(ctx.delegate_index, 0);
        assert!(ctx.named_data.get("not a key").is_none());
        let file = etch_format::ProgramFile::read(xnnpack_linear()).expect("file");
        let named_bytes = file
            .program()
            .named_data
            .iter()
            .map(|n| ctx.named_data.get(&n.key).map_or(0, |b| b.as_slice().len()))
            .sum();
        Ok(Box::new(FakeHandle {
            named_bytes,
            executions: Arc::clone(&self.executions),
        }))
    }
}

impl DelegateHandle for FakeHandle {
    fn execute(&self, ctx: &KernelContext<'_>, args: &mut Args<'_>) -> Result<(), KernelError> {
        self.executions.fetch_add(1, Ordering::Relaxed);
        let last = args.len() - 1;
        let out = args.tensor(last)?;
        ctx.write::<f32>(&out)?.fill(7.0);
        Ok(())
    }

    fn summary(&self) -> DelegateSummary {
        DelegateSummary {
            nodes: vec![("FullyConnected".into(), 1)],
            packed_bytes: self.named_bytes,
        }
    }
}

#[test]
fn a_registered_backend_is_initialised_once_and_runs_each_call() {
    let executions = Arc::new(AtomicUsize::new(0));
    let program = Program::from_path(xnnpack_linear())
        .backend(Arc::new(FakeXnnpack {
            executions: Arc::clone(&executions),
        }))
        .build_program()
        .expect("loads");
    let plan = program.plan("forward").expect("plan");
    assert_eq!(plan.delegates().len(), 1);
    let summary = plan.delegates()[0].summary();
    // The weight (4 x 8 f32) and bias (4 f32) were found by key.
    assert_eq!(summary.packed_bytes, 128 + 16);
    let mut a = program.method("forward").expect("session");
    let mut b = program.method("forward").expect("session");
    assert!(Arc::ptr_eq(a.plan(), b.plan()));
    let x = Value::Tensor(etch_runtime::HostTensor::from_slice(&[2, 8], &[1.0f32; 16]));
    for m in [&mut a, &mut b] {
        m.set_inputs(std::slice::from_ref(&x)).expect("input");
        m.execute().expect("runs");
        let out = m.output_tensor(0).expect("output");
        assert_eq!(out.as_slice::<f32>().expect("f32"), [7.0f32; 8]);
    }
    assert_eq!(executions.load(Ordering::Relaxed), 2);
}
