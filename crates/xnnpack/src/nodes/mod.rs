//! The node kinds of the delegate, one file per kind or family (as XNNPACK's
//! `src/subgraph/*.c` and ExecuTorch's `define<Name>Node`): each file reads its node's
//! fields from the flatbuffer (`read`), checks its datatypes, plans it (`plan`: value
//! indices, packed weights, derived int8 parameters) into a type that implements
//! [`NodeOp`] (shape inference and execution, fp32 and int8 variants together).
//!
//! [`Node`] is the one enum the stages dispatch on; shared helpers live beside the kinds
//! (`call`: what a node gets when it runs; `shapes`: shape inference helpers; `strided`:
//! block copies).

pub mod call;
pub mod concatenate;
pub mod pad;
pub mod reshape;
pub mod resize;
pub mod shapes;
pub mod slice;
pub mod softmax;
pub mod strided;
pub mod transpose;

use etch_kernels::{BackendError, KernelError};

use crate::dims::Dims;
use crate::graph::NodeDef;
use crate::node_reader::NodeReader;
use crate::plan_builder::Builder;
use crate::schema::NodeKind;
use call::{Inputs, NodeCall};
use shapes::ShapeResult;

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
}

macro_rules! nodes {
    ($($(#[$doc:meta])* $variant:ident($ty:ty),)*) => {
        /// One planned node, of any kind.
        #[derive(Debug, Clone)]
        pub enum Node {
            $($(#[$doc])* $variant($ty),)*
        }

        impl Node {
            fn op(&self) -> &dyn NodeOp {
                match self {
                    $(Node::$variant(n) => n,)*
                }
            }
        }
    };
}

nodes! {
    /// `StaticReshape`, `Copy`, fp32 -> fp32 `Convert`.
    Reshape(reshape::Reshape),
    /// `StaticTranspose`.
    Transpose(transpose::Transpose),
    /// `StaticSlice`.
    Slice(slice::Slice),
    /// `StaticConstantPad`.
    Pad(pad::Pad),
    /// `Concatenate2` .. `Concatenate5`.
    Concatenate(concatenate::Concatenate),
    /// `Softmax`.
    Softmax(softmax::Softmax),
    /// `StaticResizeBilinear2D`.
    ResizeBilinear(resize::ResizeBilinear),
}

impl NodeOp for Node {
    fn inputs(&self) -> Inputs {
        self.op().inputs()
    }

    fn output(&self) -> usize {
        self.op().output()
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        self.op().infer_shape(shapes)
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        self.op().run(call)
    }

    fn gemm_scratch_len(&self, shapes: &[Dims], threads: usize) -> usize {
        self.op().gemm_scratch_len(shapes, threads)
    }
}

/// Reads the fields of node `r` into `node` (operands, flags, parameters); `Ok(false)`
/// for a kind not read here yet.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<bool, BackendError> {
    use NodeKind::*;
    match r.kind {
        Copy | StaticReshape => reshape::read(r, node)?,
        StaticTranspose => transpose::read(r, node)?,
        StaticSlice => slice::read(r, node)?,
        StaticConstantPad => pad::read(r, node)?,
        Concatenate2 | Concatenate3 | Concatenate4 | Concatenate5 => concatenate::read(r, node)?,
        Softmax => softmax::read(r, node)?,
        StaticResizeBilinear2D => resize::read(r, node)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Plans node `i`; `None` for a kind not planned here yet.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Option<Node>, BackendError> {
    use NodeKind::*;
    Ok(Some(match node.kind {
        Copy | StaticReshape => Node::Reshape(reshape::plan(b, i, node)?),
        StaticTranspose => Node::Transpose(transpose::plan(b, i, node)?),
        StaticSlice => Node::Slice(slice::plan(b, i, node)?),
        StaticConstantPad => Node::Pad(pad::plan(b, i, node)?),
        Concatenate2 | Concatenate3 | Concatenate4 | Concatenate5 => {
            Node::Concatenate(concatenate::plan(b, i, node)?)
        }
        Softmax => Node::Softmax(softmax::plan(b, node)),
        StaticResizeBilinear2D => Node::ResizeBilinear(resize::plan(b, i, node)?),
        _ => return Ok(None),
    }))
}
