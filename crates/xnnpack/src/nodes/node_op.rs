//! The one interface of a planned node, whatever its kind.

use etch_kernels::KernelError;

use crate::dims::Dims;
use crate::nodes::call::{Inputs, NodeCall};
use crate::nodes::shapes::ShapeResult;

/// What every planned node does: name its operands, infer its output's dims for a call,
/// say how much scratch it needs, and run.
pub trait NodeOp {
    /// The values the node reads (constants included; packed weights are not values).
    fn inputs(&self) -> Inputs;

    /// The value the node writes.
    fn output(&self) -> usize;

    /// Sets the output's dims in `shapes` from the inputs' dims there.
    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult;

    /// Runs the node on one call's operands.
    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError>;

    /// GEMM scratch (f32 elements) the node needs at `shapes` on `threads` threads.
    fn gemm_scratch_len(&self, _shapes: &[Dims], _threads: usize) -> usize {
        0
    }

    /// im2col scratch (f32 elements) the node needs per thread, for any shapes.
    fn im2col_len_per_thread(&self) -> usize {
        0
    }
}
