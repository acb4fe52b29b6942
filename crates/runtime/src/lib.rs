//! etch's runtime layer: load a `.pte` program's methods and run them.
//!
//! * [`Module`] is the user-facing API: one builder for every source, methods loaded
//!   lazily and cached, `forward` / `execute`.
//! * [`Method`] is one loaded method: its values, planned memory and resolved kernels.

// Errors carry their context (method, instruction, operator) by value; they are cold.
#![allow(clippy::result_large_err)]

mod error;
mod host;
pub mod method;
mod module;
pub mod npy;

pub use error::RuntimeError;
pub use host::{HostTensor, Value};
pub use method::{InstructionProfile, Method, MethodMeta, MethodStats, TensorInfo, ValueInfo};
pub use module::{LoadMode, Module, ModuleBuilder};

/// Re-exports of the layers below, for users who need them.
pub use etch_format as format;
pub use etch_kernels as kernels;
pub use etch_memory as memory;
