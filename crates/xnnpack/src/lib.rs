//! etch's XNNPACK delegate, in pure Rust: [`XnnpackBackend`] reads the payload an
//! ExecuTorch XNNPACK partition leaves in a `.pte` (the `XH00` header, then the
//! `XNNGraph` flatbuffer of `backends/xnnpack/serialization/runtime_schema.fbs`, then
//! constant data) and runs the graph on etch's own kernels. No C XNNPACK, no FFI.
//!
//! At init ([`Backend::init`]) everything is validated (every value id, node input and
//! output, dim, flag, datatype, constant index, named key, offset and length: a bad one is
//! a [`BackendError::InvalidPayload`] naming node and field, e.g.
//! `xnodes[12].Conv2d.filter_id`), constants are fetched from the program's named data or
//! the payload, weights are packed into the layouts etch's kernels read (the unpacked copy
//! is dropped), and a memory plan places every intermediate value in one arena.
//!
//! Each call binds the external values to the `DelegateCall` arguments (`args[external_id]`:
//! inputs first, then outputs), sets the real input dims (serialized dims are upper bounds),
//! propagates shapes through every node, runs the nodes in order with scratch from the
//! kernel context's temp allocator, and resizes the outputs.
//!
//! Node kinds: every fp32 node of the schema except `ArgMaxPooling2d` and
//! `ScaledDotProductAttention` (never emitted); the dynamically quantized linear
//! pattern of 8da4w / 8da8w exports (`Convert` fp32 -> qdint8 per token, then
//! `FullyConnected` qdint8 x qbint4 / qcint4 / qcint8); and the static int8 nodes of
//! PT2E-quantized CNNs (XNNPACKQuantizer: qint8 activations per tensor, qcint8 weights,
//! qcint32 biases): `Convert` to and from qint8, `Conv2d`, `DepthwiseConv2d`,
//! `FullyConnected`, `Add`, `Multiply`, `Clamp`, `MaxPooling2d`, `GlobalAvgPooling2d`
//! and the data-movement nodes (`StaticTranspose`, `StaticReshape`, `Copy`,
//! `StaticSlice`, `Concatenate*`), with XNNPACK's integer arithmetic so outputs match
//! the official runtime's; qint8 values may cross the call's boundary as int8 tensors
//! (one delegate handing the next an activation, quantized constants passed in). A
//! `Conv2d` of a dynamically quantized image (qdint8 per image x qcint8) runs as the
//! fp32 convolution of the image rounded through int8 and the dequantized filter. fp16
//! values (models converted to half before lowering, `dtype_override=fp16` LLMs) are
//! held as fp32, rounded to half at every node's output and converted at the boundary.
//! Other datatypes and quantizations are reported as [`BackendError::Unsupported`]
//! naming the node.
//!
//! Layout: the stages (`parse`: flatbuffer to validated graph; `plan`: nodes planned,
//! weights packed, memory planned; `exec`: the interpreter) dispatch on one enum,
//! `nodes::Node`; each node kind lives in its own file under `nodes/` with its field
//! reading, planning, shape inference and execution, fp32 and int8 forms together.

mod batch;
mod call_cache;
mod dims;
mod exec;
mod fuse;
mod graph;
pub mod header;
mod node_reader;
mod nodes;
mod parse;
mod plan;
mod plan_builder;
mod qd8_slot;
pub mod schema;

use std::collections::BTreeMap;

use etch_kernels::{
    Args, Backend, BackendError, BackendInitContext, DelegateHandle, DelegateSummary,
    KernelContext, KernelError,
};

pub use dims::{Dims, MAX_DIMS};

/// The id programs name this backend by.
pub const BACKEND_ID: &str = "XnnpackBackend";

/// The XNNPACK delegate backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct XnnpackBackend;

impl XnnpackBackend {
    /// The backend.
    pub fn new() -> Self {
        Self
    }
}

impl Backend for XnnpackBackend {
    fn id(&self) -> &'static str {
        BACKEND_ID
    }

    fn init(
        &self,
        processed: &[u8],
        ctx: &BackendInitContext<'_>,
    ) -> Result<Box<dyn DelegateHandle>, BackendError> {
        let handle = XnnpackDelegate::new(processed, ctx)?;
        Ok(Box::new(handle))
    }
}

/// An initialised XNNPACK delegate: the validated, packed, planned graph.
#[derive(Debug)]
pub struct XnnpackDelegate {
    plan: plan::Plan,
    summary: DelegateSummary,
}

impl XnnpackDelegate {
    /// Parses, validates, packs and plans `processed`.
    pub fn new(processed: &[u8], ctx: &BackendInitContext<'_>) -> Result<Self, BackendError> {
        let layout = header::parse_header(processed)?;
        let graph = parse::parse_graph(processed, &layout, ctx)?;
        let plan = plan::build(&graph)?;
        let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        for kind in &plan.kinds {
            *counts.entry(kind.name()).or_default() += 1;
        }
        let constant_bytes: usize = plan.constants.iter().flatten().map(|c| c.len() * 4).sum();
        let summary = DelegateSummary {
            nodes: counts
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            packed_bytes: plan.packed_bytes + constant_bytes,
        };
        Ok(Self { plan, summary })
    }

    /// Elements of the per-call arena (f32).
    pub fn arena_len(&self) -> usize {
        self.plan.arena_len
    }

    /// Arguments the delegate call takes: its external inputs, then its outputs.
    pub fn num_args(&self) -> usize {
        self.plan.num_args
    }

    /// `(argument index, serialized dims)` of each external input (f32 tensors; the
    /// dims are upper bounds).
    pub fn inputs(&self) -> impl Iterator<Item = (usize, &[usize])> {
        self.external(&self.plan.inputs)
    }

    /// `(argument index, serialized dims)` of each output (f32 tensors).
    pub fn outputs(&self) -> impl Iterator<Item = (usize, &[usize])> {
        self.external(&self.plan.outputs)
    }

    fn external<'a>(
        &'a self,
        ids: &'a [(usize, usize)],
    ) -> impl Iterator<Item = (usize, &'a [usize])> {
        ids.iter()
            .map(|&(value, arg)| (arg, self.plan.values[value].dims.as_slice()))
    }
}

impl DelegateHandle for XnnpackDelegate {
    fn execute(&self, ctx: &KernelContext<'_>, args: &mut Args<'_>) -> Result<(), KernelError> {
        exec::execute(&self.plan, ctx, args)
    }

    fn execute_batch(
        &self,
        ctxs: &etch_kernels::Batch<KernelContext<'_>>,
        args: &mut etch_kernels::Batch<Args<'_>>,
    ) -> Result<etch_kernels::Batched, KernelError> {
        batch::execute_batch(&self.plan, ctxs, args)
    }

    fn summary(&self) -> DelegateSummary {
        self.summary.clone()
    }
}
