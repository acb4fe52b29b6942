//! A validated XNNGraph as data: its values (datatype, dims, binding, constant bytes,
//! quantization) and its nodes (kind, value indices, flags, output range, parameters).
//! `parse` builds it from the flatbuffer; the node kinds of `nodes` read it to plan.

use etch_kernels::BackendError;

use crate::dims::Dims;
use crate::schema::{Datatype, NodeKind};

/// Quantization parameters of an `XNNQuantizedTensorValue` (kept for the quantized
/// nodes; fp32 execution rejects quantized values at init).
#[derive(Debug, Clone, PartialEq)]
#[allow(dead_code, clippy::enum_variant_names)]
pub enum Quantization {
    /// `PerTensorQuant`.
    PerTensor { scale: f32, zero_point: i32 },
    /// `PerChannelQuant`: one fp32 scale per channel along `channel_dim`.
    PerChannel {
        channel_dim: usize,
        scales: Vec<f32>,
    },
    /// `PerChannelGroupQuant`: bf16 scales per (channel, group of `group_size`).
    PerChannelGroup {
        channel_dim: usize,
        group_size: usize,
        scales_bf16: Vec<u16>,
    },
    /// `PerTokenDynamicQuant`.
    PerTokenDynamic { num_nonbatch_dims: usize },
}

/// How a value is bound to the delegate call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct External {
    /// Argument index (`external_id`).
    pub arg: usize,
    /// `XNN_VALUE_FLAG_EXTERNAL_INPUT`.
    pub input: bool,
    /// `XNN_VALUE_FLAG_EXTERNAL_OUTPUT`.
    pub output: bool,
}

/// One validated value.
#[derive(Debug, Clone)]
pub struct ValueDef {
    /// Serialized id (`id_out`).
    pub id: u32,
    /// Element type.
    pub datatype: Datatype,
    /// Serialized dims (upper bounds for dynamic shapes).
    pub dims: Dims,
    /// Binding to the call's arguments.
    pub external: Option<External>,
    /// Constant bytes (checked against dims and datatype).
    pub constant: Option<Vec<u8>>,
    /// Quantization parameters.
    pub quant: Option<Quantization>,
    /// A qdint8 value that only convolutions read (the dynamically quantized
    /// convolutions of PT2E dynamic exports), rewritten at parse as fp32 values rounded
    /// through int8 per row of its trailing `n` dims: what the convolutions' integer
    /// arithmetic sees, computed in fp32 (see [`crate::parse`]).
    pub qd8_round_trip: Option<usize>,
    /// Serialized as fp16: held as fp32 (its constant widened at parse, `datatype`
    /// Fp32), every value a node writes rounded to half precision, converted at the
    /// call's boundary. XNNPACK's f16 operators likewise compute in f32 on x86 and store
    /// halves.
    pub half: bool,
}

/// Convolution and pooling geometry (`_XNNNodeConv`, `_XNNPooling2D`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    pub pad_top: usize,
    pub pad_right: usize,
    pub pad_bottom: usize,
    pub pad_left: usize,
    pub kernel_h: usize,
    pub kernel_w: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub dilation_h: usize,
    pub dilation_w: usize,
    /// Convolution only.
    pub groups: usize,
    pub group_in: usize,
    pub group_out: usize,
    pub adjust_h: usize,
    pub adjust_w: usize,
}

/// Node parameters beyond inputs and outputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Params {
    None,
    /// ELU alpha, LeakyReLU negative slope.
    Scalar(f32),
    Window(Window),
    Transpose(Dims),
    Reshape(Dims),
    Slice {
        offsets: Dims,
        sizes: Dims,
    },
    Pad {
        pre: Dims,
        post: Dims,
        value: f32,
    },
    Resize {
        height: usize,
        width: usize,
    },
    Concat {
        axis: usize,
    },
}

/// One validated node: value indices (into [`GraphDef::values`]) of its inputs (a
/// missing bias is `None`) and outputs.
#[derive(Debug, Clone)]
pub struct NodeDef {
    pub kind: NodeKind,
    pub inputs: Vec<Option<usize>>,
    pub outputs: Vec<usize>,
    pub flags: u32,
    pub output_min: f32,
    pub output_max: f32,
    pub params: Params,
}

/// A validated XNNGraph.
#[derive(Debug, Clone)]
pub struct GraphDef {
    pub values: Vec<ValueDef>,
    pub nodes: Vec<NodeDef>,
    /// One more than the highest external id (arguments the call must have).
    pub num_args: usize,
}

/// An [`BackendError::InvalidPayload`] naming `field` (e.g. `xnodes[3].Conv2d.filter_id`).
pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> BackendError {
    BackendError::InvalidPayload {
        field: field.into(),
        reason: reason.into(),
    }
}
