//! The static int8 values of PT2E-quantized CNNs (XNNPACKQuantizer: `qint8` activations
//! per tensor, `qcint8` weights per output channel, `qcint32` biases) as the node kinds
//! see them when they plan: per-tensor parameters, output bounds, and the per-channel
//! requantization and int32 bias that convolutions and fully connected nodes share
//! (google/XNNPACK `src/subgraph/convolution-2d.c`, `fully-connected.c`).
//!
//! A qint8 value occupies its arena slot as int8 bytes packed four to an f32 word. The
//! nodes reproduce XNNPACK's integer arithmetic and its one f32 rounding step
//! (`etch_linalg::quant::qs8`), so outputs match the official runtime's exactly.

use etch_kernels::BackendError;
use etch_linalg::quant::qs8::{Qs8Requant, quantize_bound};

use crate::graph::{NodeDef, Quantization, ValueDef, invalid};
use crate::plan_builder::Builder;
use crate::schema::Datatype;

/// A per-tensor quantization (`PerTensorQuant`): `x = (q - zero_point) · scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorQuant {
    pub scale: f32,
    pub zero_point: i32,
}

/// The quantization of a qint8 value, `None` for any other value.
pub fn per_tensor(v: &ValueDef) -> Option<TensorQuant> {
    match (v.datatype, &v.quant) {
        (Datatype::QInt8, Some(Quantization::PerTensor { scale, zero_point })) => {
            Some(TensorQuant {
                scale: *scale,
                zero_point: *zero_point,
            })
        }
        _ => None,
    }
}

/// Whether `v` is a qint8 value with per-tensor quantization.
pub fn is_qint8(v: &ValueDef) -> bool {
    per_tensor(v).is_some()
}

/// Whether `v` is a plain fp32 value.
pub fn is_fp32(v: &ValueDef) -> bool {
    v.datatype == Datatype::Fp32 && v.quant.is_none()
}

/// Whether a node touches a qint8 value (and so belongs to the static int8 path).
pub fn touches_qint8(values: &[ValueDef], node: &NodeDef) -> bool {
    node.inputs
        .iter()
        .flatten()
        .chain(&node.outputs)
        .any(|&v| values[v].datatype == Datatype::QInt8)
}

/// The per-tensor quantization of value `v` of node `i` (operand `what`).
pub fn tensor_quant(
    b: &Builder<'_>,
    i: usize,
    node: &NodeDef,
    v: usize,
    what: &str,
) -> Result<TensorQuant, BackendError> {
    per_tensor(&b.graph.values[v])
        .ok_or_else(|| invalid(b.field(i, node, what), "not a per-tensor qint8 value"))
}

/// The node's output range `[output_min, output_max]` quantized for an output of `q`.
pub fn output_bounds(node: &NodeDef, q: TensorQuant) -> (i8, i8) {
    (
        quantize_bound(node.output_min, q.scale, q.zero_point),
        quantize_bound(node.output_max, q.scale, q.zero_point),
    )
}

/// Per-channel requantization scales `(s_in · s_w[c]) / s_out` and the output bounds
/// (`init_requantization_scale_qx8_qc8w`, google/XNNPACK
/// `src/operators/convolution-nhwc.c`; the same formula in `fully-connected-nc.c`).
pub fn requant(
    b: &Builder<'_>,
    i: usize,
    node: &NodeDef,
    qx: TensorQuant,
    qy: TensorQuant,
    n: usize,
) -> Result<Qs8Requant, BackendError> {
    let fv = node.inputs.get(1).copied().flatten().unwrap_or(0);
    let kernel_scales: Vec<f32> = match &b.graph.values[fv].quant {
        Some(Quantization::PerChannel { scales, .. }) => scales.clone(),
        Some(Quantization::PerTensor { scale, .. }) => vec![*scale; n],
        _ => Vec::new(),
    };
    if kernel_scales.len() != n {
        return Err(invalid(
            b.field(i, node, "filter_id"),
            format!(
                "{} weight scales for {n} output channels",
                kernel_scales.len()
            ),
        ));
    }
    let mut scales = Vec::with_capacity(n);
    for (c, &ks) in kernel_scales.iter().enumerate() {
        let s = qx.scale * ks / qy.scale;
        if s.is_nan() || s >= 256.0 {
            return Err(BackendError::Unsupported(format!(
                "{}: requantization scale {s} of output channel {c} is not below 256",
                b.field(i, node, "filter_id")
            )));
        }
        scales.push(s);
    }
    let (min, max) = output_bounds(node, qy);
    Ok(Qs8Requant {
        scales,
        zero_point: qy.zero_point,
        min,
        max,
    })
}

/// The int32 bias (zeros without one), one per output channel.
pub fn int32_bias(
    b: &Builder<'_>,
    i: usize,
    node: &NodeDef,
    n: usize,
) -> Result<Vec<i32>, BackendError> {
    let Some(v) = node.inputs.get(2).copied().flatten() else {
        return Ok(vec![0; n]);
    };
    let numel = b.graph.values[v].dims.numel().unwrap_or(0);
    let bytes = b.constant(v).unwrap_or(&[]);
    if numel != n || bytes.len() < 4 * n {
        return Err(invalid(
            b.field(i, node, "bias_id"),
            format!("bias of {numel} elements for {n} output channels"),
        ));
    }
    Ok(bytemuck::pod_collect_to_vec(&bytes[..4 * n]))
}
