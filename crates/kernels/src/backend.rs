//! The delegate (backend) interface, with upstream's shape
//! (`runtime/backend/interface.h` in pytorch/executorch): a [`Backend`] is asked whether it
//! [`is_available`](Backend::is_available), turns a delegate's processed payload into a
//! [`DelegateHandle`] once at load ([`init`](Backend::init)), and the handle runs each
//! `DelegateCall` ([`DelegateHandle::execute`]). Dropping the handle is upstream's
//! `destroy`.
//!
//! A handle holds only what is immutable after init (a parsed graph, packed weights), so
//! one handle serves every session of a loaded program: it is `Send + Sync`, and per-call
//! working memory comes from the [`KernelContext`]'s temp allocator, as for kernels.

use etch_memory::SharedBytes;

use crate::{Args, Batch, Batched, KernelContext, KernelError};

/// A compile option handed to a backend at init (`CompileSpec` upstream).
#[derive(Debug, Clone, Copy)]
pub struct CompileSpecRef<'a> {
    /// Option name.
    pub key: &'a str,
    /// Option value (opaque bytes).
    pub value: &'a [u8],
}

/// Bytes found by key in the program's named data (its own segments, or a `.ptd` file).
///
/// The bytes stay valid while `source` is alive: a backend that wants to use them in
/// place keeps a clone of `source` (cheap) and the offset, instead of copying.
#[derive(Debug, Clone)]
pub struct NamedBytes<'a> {
    /// The buffer the bytes live in (the program file or the data file).
    pub source: &'a SharedBytes,
    /// Byte offset of the data inside `source`.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl<'a> NamedBytes<'a> {
    /// The bytes themselves. The range was checked when the file was loaded; an
    /// inconsistent one reads as empty rather than panicking.
    pub fn as_slice(&self) -> &'a [u8] {
        let end = self.offset.saturating_add(self.len);
        self.source.as_slice().get(self.offset..end).unwrap_or(&[])
    }
}

/// Lookup of named data by key (`NamedDataMap` upstream).
pub trait NamedDataMap: Sync {
    /// The bytes stored under `key`, or `None` when no loaded file has that key.
    fn get(&self, key: &str) -> Option<NamedBytes<'_>>;
}

/// A named-data map with no entries.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoNamedData;

impl NamedDataMap for NoNamedData {
    fn get(&self, _key: &str) -> Option<NamedBytes<'_>> {
        None
    }
}

/// What a backend receives at init besides the payload (`BackendInitContext` upstream).
pub struct BackendInitContext<'a> {
    /// The method the delegate belongs to.
    pub method: &'a str,
    /// Index of the delegate in the method's delegate table.
    pub delegate_index: usize,
    /// Compile options recorded by the exporter.
    pub compile_specs: &'a [CompileSpecRef<'a>],
    /// Named data of the program and of any `.ptd` files loaded with it.
    pub named_data: &'a dyn NamedDataMap,
    /// The program's memory budget. The runtime holds each delegate's reported
    /// `packed_bytes` against it after init; a backend may check a large allocation
    /// against it before making one (reserve, then drop the reservation).
    pub memory_budget: &'a etch_memory::MemoryBudget,
}

/// Why a backend could not initialise a delegate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The payload is malformed: `field` names where (e.g. `xnodes[3].input_id`).
    #[error("invalid payload at {field}: {reason}")]
    InvalidPayload {
        /// Path of the bad field inside the payload.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The payload is well formed but uses something this backend does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A named-data key the payload refers to is in no loaded file.
    #[error("named data {key:?} is not in the program or its data files")]
    MissingNamedData {
        /// The key looked up.
        key: String,
    },
    /// Memory for packed weights could not be had.
    #[error("cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// Bytes requested.
        bytes: usize,
        /// What they were for.
        what: &'static str,
    },
}

/// What `etch inspect` and stats show about one initialised delegate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelegateSummary {
    /// Nodes of the delegate's graph counted by kind, e.g. `("FullyConnected", 15)`,
    /// in a stable order.
    pub nodes: Vec<(String, usize)>,
    /// Bytes of weights the handle holds in its own (packed) layouts.
    pub packed_bytes: usize,
}

/// An initialised delegate: runs one `DelegateCall`.
pub trait DelegateHandle: Send + Sync {
    /// Runs the delegate on the call's arguments: its inputs then its outputs, in the
    /// order of the `DelegateCall` instruction. Outputs are resized to the shapes the
    /// delegate computes.
    fn execute(&self, ctx: &KernelContext<'_>, args: &mut Args<'_>) -> Result<(), KernelError>;

    /// Runs the delegate for several sessions of one method at once (session `i` with
    /// `ctxs[i]` and `args[i]`), each getting the outputs it gets alone. The default runs
    /// them one after another; a backend overrides it to share a pass over its weights.
    /// Returns [`Batched::Done`] when some of the work ran once for all sessions.
    fn execute_batch(
        &self,
        ctxs: &Batch<KernelContext<'_>>,
        args: &mut Batch<Args<'_>>,
    ) -> Result<Batched, KernelError> {
        for (i, a) in args.iter_mut().enumerate() {
            let ctx = ctxs.get(i).ok_or_else(crate::batch::unpaired)?;
            self.execute(ctx, a)?;
        }
        Ok(Batched::PerSession)
    }

    /// Node counts and packed bytes.
    fn summary(&self) -> DelegateSummary;
}

/// A delegate backend (`BackendInterface` upstream), registered under its id.
pub trait Backend: Send + Sync {
    /// The id programs name it by, e.g. `XnnpackBackend`.
    fn id(&self) -> &'static str;

    /// Whether the backend can run on this machine.
    fn is_available(&self) -> bool {
        true
    }

    /// Parses and validates `processed` (the delegate's payload) and prepares it to run:
    /// every check happens here, so that `execute` meets only validated data.
    fn init(
        &self,
        processed: &[u8],
        ctx: &BackendInitContext<'_>,
    ) -> Result<Box<dyn DelegateHandle>, BackendError>;
}
