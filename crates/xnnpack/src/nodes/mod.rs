//! The node kinds of the delegate, one file per kind or family (as XNNPACK's
//! `src/subgraph/*.c` and ExecuTorch's `define<Name>Node`): each file reads its node's
//! fields from the flatbuffer (`read`), checks its datatypes, plans it (`plan`: value
//! indices, packed weights, derived int8 parameters) into a type that implements
//! [`NodeOp`] (shape inference and execution, fp32 and int8 variants together).
//!
//! [`Node`] is the one enum the stages dispatch on; shared helpers live beside the kinds
//! (`call`: what a node gets when it runs; `shapes`: shape inference helpers; `strided`:
//! block copies).

pub mod batch_matrix_multiply;
pub mod binary;
pub mod binary_int8;
pub mod broadcast;
pub mod call;
pub mod concatenate;
pub mod conv_filter;
pub mod convert;
pub mod convolution;
pub mod datatypes;
pub mod deconvolution;
pub mod depthwise_convolution;
pub mod fully_connected;
pub mod global_average_pooling;
pub mod node_op;
pub mod pad;
pub mod pooling;
pub mod quantized;
pub mod reshape;
pub mod resize;
pub mod shapes;
pub mod slice;
pub mod softmax;
pub mod strided;
pub mod transpose;
pub mod unary;
pub mod window;

use etch_kernels::{BackendError, KernelError};

use crate::dims::Dims;
use crate::graph::NodeDef;
use crate::node_reader::NodeReader;
use crate::plan_builder::Builder;
use crate::schema::NodeKind;
use call::{Inputs, NodeCall};
pub use node_op::NodeOp;
use shapes::ShapeResult;

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
    /// The elementwise nodes of one input.
    Unary(unary::Unary),
    /// The elementwise nodes of two broadcast inputs.
    Binary(binary::Binary),
    /// `Convert`.
    Convert(convert::Convert),
    /// `FullyConnected`.
    FullyConnected(fully_connected::FullyConnected),
    /// `BatchMatrixMultiply`.
    BatchMatrixMultiply(batch_matrix_multiply::BatchMatrixMultiply),
    /// `Conv2d`.
    Convolution(convolution::Convolution),
    /// `DepthwiseConv2d`.
    DepthwiseConvolution(depthwise_convolution::DepthwiseConvolution),
    /// `ConvTranspose2d`.
    Deconvolution(deconvolution::Deconvolution),
    /// `AvgPooling2d`, `MaxPooling2d`.
    Pooling(pooling::Pooling),
    /// `GlobalAvgPooling2d`.
    GlobalAveragePooling(global_average_pooling::GlobalAveragePooling),
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

    fn im2col_len_per_thread(&self) -> usize {
        self.op().im2col_len_per_thread()
    }
}

/// Reads the fields of node `r` into `node` (operands, flags, parameters), each checked.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    use NodeKind::*;
    match r.kind {
        Abs | Ceiling | Clamp | Cos | ELU | Exp | Floor | Gelu | Hardswish | LeakyReLU | Log
        | Negate | ReciprocalSquareRoot | Sigmoid | Sin | Square | SquareRoot | Tanh => {
            unary::read(r, node)
        }
        Add | Subtract | Multiply | Div | Minimum | Maximum | PReLU => binary::read(r, node),
        Convert => convert::read(r, node),
        FullyConnected => fully_connected::read(r, node),
        BatchMatrixMultiply => batch_matrix_multiply::read(r, node),
        Conv2d | DepthwiseConv2d | ConvTranspose2d => conv_filter::read(r, node),
        AvgPooling2d | MaxPooling2d => pooling::read(r, node),
        GlobalAvgPooling2d => global_average_pooling::read(r, node),
        Copy | StaticReshape => reshape::read(r, node),
        StaticTranspose => transpose::read(r, node),
        StaticSlice => slice::read(r, node),
        StaticConstantPad => pad::read(r, node),
        Concatenate2 | Concatenate3 | Concatenate4 | Concatenate5 => concatenate::read(r, node),
        Softmax => softmax::read(r, node),
        StaticResizeBilinear2D => resize::read(r, node),
        ArgMaxPooling2d | ScaledDotProductAttention => Err(BackendError::Unsupported(format!(
            "XNNPACK node {} (xnodes[{}])",
            r.kind.name(),
            r.i
        ))),
    }
}

/// Plans node `i`: its operands resolved, its weights packed, its parameters derived.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Node, BackendError> {
    use NodeKind::*;
    Ok(match node.kind {
        Abs | Ceiling | Clamp | Cos | ELU | Exp | Floor | Gelu | Hardswish | LeakyReLU | Log
        | Negate | ReciprocalSquareRoot | Sigmoid | Sin | Square | SquareRoot | Tanh => {
            Node::Unary(unary::plan(b, i, node)?)
        }
        Add | Subtract | Multiply | Div | Minimum | Maximum | PReLU => {
            Node::Binary(binary::plan(b, i, node)?)
        }
        Convert => Node::Convert(convert::plan(b, i, node)?),
        FullyConnected => Node::FullyConnected(fully_connected::plan(b, i, node)?),
        BatchMatrixMultiply => Node::BatchMatrixMultiply(batch_matrix_multiply::plan(b, node)),
        Conv2d => Node::Convolution(convolution::plan(b, i, node)?),
        DepthwiseConv2d => Node::DepthwiseConvolution(depthwise_convolution::plan(b, i, node)?),
        ConvTranspose2d => Node::Deconvolution(deconvolution::plan(b, i, node)?),
        AvgPooling2d | MaxPooling2d => Node::Pooling(pooling::plan(b, i, node)?),
        GlobalAvgPooling2d => Node::GlobalAveragePooling(global_average_pooling::plan(b, i, node)?),
        Copy | StaticReshape => Node::Reshape(reshape::plan(b, i, node)?),
        StaticTranspose => Node::Transpose(transpose::plan(b, i, node)?),
        StaticSlice => Node::Slice(slice::plan(b, i, node)?),
        StaticConstantPad => Node::Pad(pad::plan(b, i, node)?),
        Concatenate2 | Concatenate3 | Concatenate4 | Concatenate5 => {
            Node::Concatenate(concatenate::plan(b, i, node)?)
        }
        Softmax => Node::Softmax(softmax::plan(b, node)),
        StaticResizeBilinear2D => Node::ResizeBilinear(resize::plan(b, i, node)?),
        ArgMaxPooling2d | ScaledDotProductAttention => {
            return Err(BackendError::Unsupported(format!(
                "XNNPACK node {}",
                node.kind.name()
            )));
        }
    })
}
