//! Test helpers: the delegate payload of `crates/format/tests/data/xnnpack_linear.pte`,
//! its named data, and a harness that runs a delegate handle on tensors.
#![allow(dead_code)]

use etch_format::ProgramFile;
use etch_kernels::backend::{NamedBytes, NamedDataMap};
use etch_kernels::testing::Harness;
use etch_kernels::{Args, BackendInitContext, DelegateHandle, KernelContext, KernelError};
use etch_memory::TempScope;

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
