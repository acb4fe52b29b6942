//! etch's runtime layer: load a `.pte` program's methods and run them.
//!
//! * [`Program`] is what is immutable after load: the validated file and its weights, the
//!   resolved kernel plans ([`MethodPlan`]) and initialised delegates. `Send + Sync`,
//!   shared by every session.
//! * [`Method`] is a session of one method: its values, planned memory (a KV cache lives
//!   there), temp allocator and stats. Several sessions of one program share its weights.
//! * [`Module`] is the convenient API over both: one session per method, loaded lazily,
//!   `forward` / `execute(method, inputs)`.
//! * [`BackendRegistry`] holds the delegate backends `DelegateCall`s resolve against.

// Errors carry their context (method, instruction, operator) by value; they are cold.
#![allow(clippy::result_large_err)]

mod backends;
pub mod bundled;
mod error;
mod host;
pub mod method;
mod module;
pub mod npy;
mod program;

pub use backends::BackendRegistry;
pub use error::RuntimeError;
pub use host::{HostTensor, Value};
pub use method::{
    DelegateNodeProfile, FoldCounts, InstructionProfile, LoadedDelegate, Method, MethodMeta,
    MethodPlan, MethodStats, PlanOptions, TensorInfo, ValueInfo,
};
pub use module::Module;
pub use program::{
    DEFAULT_TEMP_CACHE_BYTES, LoadMode, ModuleBuilder, Program, TempAllocatorFactory,
};

/// Re-exports of the layers below, for users who need them.
pub use etch_format as format;
pub use etch_kernels as kernels;
pub use etch_kernels::{Batch, MAX_BATCH};
pub use etch_memory as memory;
