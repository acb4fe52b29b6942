//! Test helpers: the delegate payload of `crates/format/tests/data/xnnpack_linear.pte`,
//! its named data, and a harness that runs a delegate handle on tensors.
#![allow(dead_code)]

use etch_format::ProgramFile;
use etch_kernels::backend::{NamedBytes, NamedDataMap, NoNamedData};
use etch_kernels::testing::Harness;
use etch_kernels::{
    Args, Backend, BackendError, BackendInitContext, DelegateHandle, KernelContext, KernelError,
};
use etch_memory::TempScope;
use etch_xnnpack::XnnpackBackend;

pub mod fbs;

pub fn linear_program() -> ProgramFile {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../format/tests/data/xnnpack_linear.pte");
    ProgramFile::read(&path).unwrap()
}

/// The processed bytes of delegate 0 of `forward`.
pub fn payload(file: &ProgramFile) -> Vec<u8> {
    let plan = file.plan("forward").unwrap();
    let range = file.delegate_data(&plan.delegates[0].processed).unwrap();
    file.slice(range).unwrap().to_vec()
}

/// The delegate of `file` (`xnnpack_linear.pte`) initialised on the file's named data.
pub fn init_linear(file: &ProgramFile) -> Box<dyn DelegateHandle> {
    let named = FileNamedData(file);
    XnnpackBackend
        .init(&payload(file), &init_ctx(&named))
        .unwrap()
}

/// `payload` initialised without named data (its constants are in its own header).
pub fn init_standalone(payload: &[u8]) -> Box<dyn DelegateHandle> {
    XnnpackBackend
        .init(payload, &init_ctx(&NoNamedData))
        .unwrap()
}

/// The error that initialising `payload` without named data must give.
pub fn init_standalone_error(payload: &[u8]) -> BackendError {
    XnnpackBackend
        .init(payload, &init_ctx(&NoNamedData))
        .err()
        .expect("a malformed payload must be refused")
}

/// A xorshift64 generator started at `seed` (not zero): the bytes of the mutation tests.
pub fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// Mutates `rounds` copies of the synthetic graph `good` (one to four bytes past its
/// first 30 each: all ones, a flipped bit, or a random byte) and calls `run` on the
/// handle of every copy that still initialises without named data.
pub fn for_each_valid_mutation(
    good: &[u8],
    seed: u64,
    rounds: usize,
    mut run: impl FnMut(&dyn DelegateHandle),
) {
    let mut next = xorshift(seed);
    for _ in 0..rounds {
        let mut m = good.to_vec();
        for _ in 0..1 + next() % 4 {
            let at = 30 + (next() as usize) % (m.len() - 30);
            m[at] = match next() % 3 {
                0 => 0xff,
                1 => m[at] ^ (1 << (next() % 8)),
                _ => next() as u8,
            };
        }
        if let Ok(handle) = XnnpackBackend.init(&m, &init_ctx(&NoNamedData)) {
            run(handle.as_ref());
        }
    }
}

/// Named data of a loaded program.
pub struct FileNamedData<'a>(pub &'a ProgramFile);

impl NamedDataMap for FileNamedData<'_> {
    fn get(&self, key: &str) -> Option<NamedBytes<'_>> {
        let r = self.0.named_data(key)?;
        Some(NamedBytes {
            source: self.0.bytes(),
            offset: r.offset,
            len: r.len,
        })
    }
}

pub fn init_ctx<'a>(named: &'a dyn NamedDataMap) -> BackendInitContext<'a> {
    BackendInitContext {
        method: "forward",
        delegate_index: 0,
        compile_specs: &[],
        named_data: named,
        memory_budget: &UNLIMITED,
    }
}

static UNLIMITED: std::sync::LazyLock<etch_memory::MemoryBudget> =
    std::sync::LazyLock::new(etch_memory::MemoryBudget::unlimited);

/// Runs `handle` on the harness values `args`.
pub fn run(
    h: &mut Harness,
    handle: &dyn DelegateHandle,
    args: &[usize],
) -> Result<(), KernelError> {
    let temp = TempScope::new(h.temp.as_deref());
    let ctx = KernelContext::new(h.storage.access(), temp, &h.pool);
    let mut a = Args::new(&mut h.values, args);
    let r = handle.execute(&ctx, &mut a);
    drop(ctx);
    if let Some(t) = h.temp.as_mut() {
        t.reset();
    }
    r
}
