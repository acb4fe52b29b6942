//! Kernel errors.

use etch_base::ScalarType;
use etch_memory::{AccessError, AllocError};

/// Why a tensor shape operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("rank {rank} exceeds the limit of {limit} dimensions")]
    RankTooLarge { rank: usize, limit: usize },
    #[error("cannot change rank from {from} to {to}")]
    RankChange { from: usize, to: usize },
    #[error("static tensor of shape {from:?} cannot be resized to {to:?}")]
    StaticResize { from: Vec<usize>, to: Vec<usize> },
    #[error("shape {to:?} has {numel} elements, more than the bound of {bound}")]
    ExceedsBound {
        to: Vec<usize>,
        numel: usize,
        bound: usize,
    },
    #[error("dim_order {0:?} is not a permutation of 0..rank")]
    BadDimOrder(Vec<u8>),
    #[error("dimension {dim} is out of range for rank {rank}")]
    DimOutOfRange { dim: i64, rank: usize },
    #[error("shape {0:?} overflows usize")]
    Overflow(Vec<usize>),
}

/// Why a kernel call failed. The runtime adds the operator name and instruction index.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    #[error("expected {expected} arguments, got {got}")]
    ArgCount { expected: usize, got: usize },
    #[error("argument {index}: expected {expected}, found {found}")]
    ArgType {
        index: usize,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{op}: expected {expected} arguments, got {got}")]
    OpArgCount {
        op: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("{op}: argument `{name}` (slot {index}): {source}")]
    Argument {
        op: &'static str,
        name: &'static str,
        index: usize,
        source: Box<KernelError>,
    },
    #[error("argument {index}: value index {value} is out of range")]
    BadValueIndex { index: usize, value: usize },
    #[error("unsupported dtype {dtype} for {what}")]
    UnsupportedDtype {
        dtype: ScalarType,
        what: &'static str,
    },
    #[error("dtype mismatch: expected {expected}, found {found}")]
    DtypeMismatch {
        expected: ScalarType,
        found: ScalarType,
    },
    #[error("tensor has no data bound (an unset input, or a freed value)")]
    NoData,
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error(transparent)]
    Access(#[from] AccessError),
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Linalg(#[from] etch_linalg::LinalgError),
}

impl KernelError {
    /// The error below any [`KernelError::Argument`] naming (what went wrong with the
    /// value itself).
    pub fn root(&self) -> &KernelError {
        match self {
            KernelError::Argument { source, .. } => source.root(),
            other => other,
        }
    }

    /// Shorthand for [`KernelError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        KernelError::InvalidArgument(msg.into())
    }
}
