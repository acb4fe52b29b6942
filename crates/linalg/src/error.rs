//! Errors of the numeric kernels: a view, buffer or shape that does not fit.

/// Why a numeric kernel refused its operands. Kernels check every length and view
/// before touching memory, so a bad caller gets one of these, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinalgError {
    /// Operand shapes that cannot be multiplied or combined.
    #[error("{0}")]
    Shape(String),
    /// A strided view reaching past the end of its data.
    #[error("{what}: a {rows}x{cols} view does not fit its {len} elements")]
    ViewOutOfBounds {
        what: &'static str,
        rows: usize,
        cols: usize,
        len: usize,
    },
    /// An output buffer shorter than the result.
    #[error("{what}: needs {need} elements, has {len}")]
    OutputTooSmall {
        what: &'static str,
        need: usize,
        len: usize,
    },
    /// A scratch buffer shorter than the kernel's stated need.
    #[error("{what} scratch too small: needs {need} elements, has {len}")]
    ScratchTooSmall {
        what: &'static str,
        need: usize,
        len: usize,
    },
    /// Memory for packed weights could not be had.
    #[error("packing weights: {0}")]
    Alloc(#[from] etch_memory::AllocError),
    /// A combination of operand types the kernel does not implement.
    #[error("unsupported operands: {0}")]
    Unsupported(&'static str),
}
