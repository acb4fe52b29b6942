//! The runtime's error type.

use etch_format::{FormatError, ScalarType};
use etch_kernels::{BackendError, KernelError, ShapeError};
use etch_memory::{AccessError, AllocError, PlanError};

/// Why loading or running a method failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("program has no method named {name:?} (methods: {available})")]
    MethodNotFound { name: String, available: String },
    /// The method's execution plan fails validation; the program's other methods may
    /// still load.
    #[error("method {method:?} cannot be loaded: {source}")]
    InvalidMethod {
        method: String,
        #[source]
        source: FormatError,
    },
    #[error("method {method:?} uses operators etch does not implement: {}", missing.join(", "))]
    MissingOperators {
        method: String,
        missing: Vec<String>,
    },
    #[error("method {method:?}: {what} (value {value})")]
    InvalidValue {
        method: String,
        value: usize,
        what: String,
    },
    #[error("method {method:?}: planned memory: {source}")]
    Plan {
        method: String,
        #[source]
        source: PlanError,
    },
    /// A load would exceed the memory budget (`max_memory`, `--max-memory`).
    #[error(transparent)]
    MemoryBudget(#[from] etch_memory::BudgetExceeded),
    #[error("method {method:?}: allocation failed: {source}")]
    Alloc {
        method: String,
        #[source]
        source: AllocError,
    },
    #[error("method {method:?}, instruction {instruction} ({op}): {source}")]
    Kernel {
        method: String,
        instruction: usize,
        op: String,
        #[source]
        source: KernelError,
    },
    #[error(
        "method {method:?}, instruction {instruction}: delegate backend {backend:?} is not available in etch"
    )]
    DelegateUnavailable {
        method: String,
        instruction: usize,
        backend: String,
    },
    #[error("method {method:?}, delegate {delegate} ({backend}): {source}")]
    DelegateInit {
        method: String,
        delegate: usize,
        backend: String,
        #[source]
        source: BackendError,
    },
    #[error("method {method:?}, instruction {instruction} (delegate {backend}): {source}")]
    Delegate {
        method: String,
        instruction: usize,
        backend: String,
        #[source]
        source: KernelError,
    },
    #[error("method {method:?}, instruction {instruction}: {what}")]
    Instruction {
        method: String,
        instruction: usize,
        what: String,
    },
    #[error("method {method:?}: ran more than {limit} instructions (a jump loop?)")]
    TooManyInstructions { method: String, limit: usize },
    #[error("method {method:?} takes {expected} inputs, got {got}")]
    InputCount {
        method: String,
        expected: usize,
        got: usize,
    },
    #[error("method {method:?} input {index}: expected {expected}, got {got}")]
    InputKind {
        method: String,
        index: usize,
        expected: String,
        got: String,
    },
    #[error("method {method:?} input {index}: expected dtype {expected}, got {got}")]
    InputDtype {
        method: String,
        index: usize,
        expected: ScalarType,
        got: ScalarType,
    },
    #[error("method {method:?} input {index}: shape {got:?} does not fit {expected:?}: {source}")]
    InputShape {
        method: String,
        index: usize,
        expected: Vec<usize>,
        got: Vec<usize>,
        #[source]
        source: ShapeError,
    },
    #[error("method {method:?} input {index}: {what}")]
    InputValue {
        method: String,
        index: usize,
        what: String,
    },
    /// Sessions that cannot run as one batched step.
    #[error("batched step of method {method:?}: {what}")]
    Batch { method: String, what: String },
    #[error("method {method:?}: input {index} has not been set")]
    InputNotSet { method: String, index: usize },
    #[error("method {method:?}: output index {index} out of range ({count} outputs)")]
    OutputIndex {
        method: String,
        index: usize,
        count: usize,
    },
    #[error("method {method:?}: output {index}: {source}")]
    OutputAccess {
        method: String,
        index: usize,
        #[source]
        source: AccessError,
    },
    #[error("could not start the thread pool: {0}")]
    ThreadPool(String),
    #[error(transparent)]
    Npy(#[from] crate::npy::NpyError),
}
