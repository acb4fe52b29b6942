//! etch's kernel layer: tensors and values as kernels see them, the operator registry,
//! the CPU kernels (one file per op family under [`ops`]) and the thread pool.
//!
//! A kernel is a plain function ([`KernelFn`]) taking a [`KernelContext`] (tensor
//! bytes, scratch, pool) and the instruction's [`Args`]. Arguments follow ExecuTorch's
//! calling convention: every schema argument in order, then the return value(s). Each
//! op declares its argument schema once (`op_args!`, see [`schema`]) and unpacks the slots
//! into a typed struct.

pub mod backend;
mod batch;
mod context;
mod error;
pub mod ops;
mod registry;
pub mod schema;
mod tensor;
pub mod testing;
mod value;

pub use backend::{Backend, BackendError, BackendInitContext, DelegateHandle, DelegateSummary};
pub use batch::{Batch, BatchKernelFn, Batched, MAX_BATCH, unpaired};
pub use context::{Epilogue, KernelContext, NodeProfiler};
pub use error::{KernelError, ShapeError};
pub use etch_base::{Bool8, Element, MAX_RANK, ScalarType, ShapeDynamism};
pub use etch_linalg::{GRAIN_SIZE, ThreadPool, ThreadPoolError, default_threads};
pub use registry::{KernelFn, Registry};
pub use tensor::{Tensor, normalize_dim};
pub use value::{Args, EValue, IntList, Scalar, TensorList};
