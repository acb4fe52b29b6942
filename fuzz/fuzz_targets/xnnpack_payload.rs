//! Fuzzes the XNNPACK delegate: arbitrary bytes as a delegate's processed payload
//! (the `XH00` header, the XNNGraph flatbuffer, the constant data) go through the
//! backend's init (parse, validate, pack, plan), with the named data of the XNNPACK
//! fixtures at hand so payloads that refer to their weights get past the lookup.
//! Whatever initialises is executed once on inputs at its serialized dims. Every
//! input must end in a `BackendError` or `KernelError`, never a panic.

#![no_main]

use std::sync::LazyLock;

use etch_format::ProgramFile;
use etch_kernels::backend::{NamedBytes, NamedDataMap};
use etch_kernels::testing::Harness;
use etch_kernels::{Args, BackendInitContext, DelegateHandle, KernelContext};
use etch_memory::{MemoryBudget, TempScope};
use etch_base::ScalarType;
use etch_xnnpack::XnnpackDelegate;
use libfuzzer_sys::fuzz_target;

/// The XNNPACK fixtures, whose named data (weights by content key) fuzzed payloads
/// may refer to; read once from `tests/fixtures` at start-up.
static NAMED: LazyLock<Vec<ProgramFile>> = LazyLock::new(|| {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/fixtures is readable").flatten() {
        let path = entry.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.ends_with(".pte") && name.contains("xnn") {
            if let Ok(file) = ProgramFile::read(&path) {
                files.push(file);
            }
        }
    }
    files
});

static BUDGET: LazyLock<MemoryBudget> = LazyLock::new(|| MemoryBudget::new(512 << 20));

struct FixturesNamedData(&'static [ProgramFile]);

impl NamedDataMap for FixturesNamedData {
    fn get(&self, key: &str) -> Option<NamedBytes<'_>> {
        self.0.iter().find_map(|file| {
            let r = file.named_data(key)?;
            Some(NamedBytes {
                source: file.bytes(),
                offset: r.offset,
                len: r.len,
            })
        })
    }
}

/// Largest tensor (elements) and arena a fuzzed graph is executed with.
const MAX_ELEMENTS: usize = 1 << 16;
const MAX_ARENA: usize = 1 << 22;

fn execute(delegate: &XnnpackDelegate) {
    if delegate.arena_len() > MAX_ARENA || delegate.num_args() > 64 {
        return;
    }
    let small = |dims: &[usize]| {
        dims.iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .is_some_and(|n| n <= MAX_ELEMENTS)
    };
    if !delegate.inputs().chain(delegate.outputs()).all(|(_, d)| small(d)) {
        return;
    }
    let mut h = Harness::new();
    let mut slots = vec![usize::MAX; delegate.num_args()];
    for (arg, dims) in delegate.inputs() {
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
        if let Some(s) = slots.get_mut(arg) {
            *s = h.tensor(dims, &data);
        }
    }
    for (arg, dims) in delegate.outputs() {
        if let Some(s) = slots.get_mut(arg) {
            *s = h.out(ScalarType::Float, dims);
        }
    }
    if slots.contains(&usize::MAX) {
        return;
    }
    let temp = TempScope::new(h.temp.as_deref());
    let ctx = KernelContext::new(h.storage.access(), temp, &h.pool);
    let mut args = Args::new(&mut h.values, &slots);
    let _ = delegate.execute(&ctx, &mut args);
}

fuzz_target!(|data: &[u8]| {
    let named = FixturesNamedData(&NAMED);
    let ctx = BackendInitContext {
        method: "forward",
        delegate_index: 0,
        compile_specs: &[],
        named_data: &named,
        memory_budget: &BUDGET,
    };
    if let Ok(delegate) = XnnpackDelegate::new(data, &ctx) {
        let _ = delegate.summary();
        execute(&delegate);
    }
});
