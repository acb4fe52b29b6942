//! Which static int8 node patterns the delegate runs (checked at parse time), and how
//! their parameters are derived at init, as XNNPACK's operator creation does
//! (google/XNNPACK `src/subgraph/convolution-2d.c`, `fully-connected.c`, `binary.c`,
//! `max-pooling-2d.c`, `src/subgraph/deprecated.c` for global average pooling).

use etch_kernels::BackendError;
use etch_linalg::quant::qs8::{Qs8Requant, Qs8Weights, quantize_bound};

use crate::graph::{NodeDef, Quantization, ValueDef, invalid};
use crate::nodes::quantized::{
    TensorQuant, int32_bias as bias, is_fp32, is_qint8, per_tensor, requant, touches_qint8,
};
use crate::plan::{ConvKind, Op};
use crate::plan_builder::Builder;
use crate::qs8::{Qs8Conv, Qs8MeanParams};
use crate::schema::{Datatype, NodeKind};

/// Checks a node with qint8 values against the patterns PT2E exports produce:
/// `Ok(true)` when it is one of them, `Ok(false)` when it has no qint8 value, an
/// [`BackendError::Unsupported`] naming the node otherwise.
pub fn check_node(values: &[ValueDef], i: usize, node: &NodeDef) -> Result<bool, BackendError> {
    if !touches_qint8(values, node) {
        return Ok(false);
    }
    let v = |k: usize| node.inputs.get(k).copied().flatten().map(|x| &values[x]);
    let out = &values[node.outputs[0]];
    let unsupported = |why: &str| {
        BackendError::Unsupported(format!(
            "XNNPACK node {} (xnodes[{i}]) on qint8 values: {why}",
            node.kind.name()
        ))
    };
    let same_quant =
        |a: &ValueDef, b: &ValueDef| per_tensor(a).is_some() && per_tensor(a) == per_tensor(b);
    let weights_ok = |f: &ValueDef, channel_dim: usize| {
        f.constant.is_some()
            && match (f.datatype, &f.quant) {
                (Datatype::QcInt8, Some(Quantization::PerChannel { channel_dim: d, .. })) => {
                    *d == channel_dim
                }
                (Datatype::QInt8, Some(Quantization::PerTensor { zero_point: 0, .. })) => true,
                _ => false,
            }
    };
    let bias_ok = |b: Option<&ValueDef>| {
        b.is_none_or(|b| {
            b.constant.is_some()
                && matches!(
                    (b.datatype, &b.quant),
                    (Datatype::QcInt32, Some(Quantization::PerChannel { .. }))
                        | (Datatype::QInt32, Some(Quantization::PerTensor { .. }))
                )
        })
    };
    use NodeKind::*;
    let ok = match node.kind {
        Convert => {
            let x = v(0).ok_or_else(|| unsupported("no input"))?;
            (is_fp32(x) && is_qint8(out)) || (is_qint8(x) && is_fp32(out))
        }
        Conv2d | DepthwiseConv2d | FullyConnected => {
            let x = v(0).ok_or_else(|| unsupported("no input"))?;
            let f = v(1).ok_or_else(|| unsupported("no filter"))?;
            let channel_dim = if node.kind == DepthwiseConv2d { 3 } else { 0 };
            if node.kind == FullyConnected && node.flags != 0 {
                return Err(unsupported("transposed weights"));
            }
            is_qint8(x) && is_qint8(out) && weights_ok(f, channel_dim) && bias_ok(v(2))
        }
        Add | Multiply => {
            let (a, b) = (v(0), v(1));
            a.is_some_and(is_qint8) && b.is_some_and(is_qint8) && is_qint8(out)
        }
        GlobalAvgPooling2d => v(0).is_some_and(is_qint8) && is_qint8(out),
        Clamp | MaxPooling2d | StaticTranspose | StaticReshape | Copy | StaticSlice => {
            let x = v(0).ok_or_else(|| unsupported("no input"))?;
            if !same_quant(x, out) {
                return Err(unsupported("input and output quantization differ"));
            }
            true
        }
        Concatenate2 | Concatenate3 | Concatenate4 | Concatenate5 => {
            if !node
                .inputs
                .iter()
                .flatten()
                .all(|&x| same_quant(&values[x], out))
            {
                return Err(unsupported("input and output quantization differ"));
            }
            true
        }
        _ => return Err(unsupported("not implemented for int8")),
    };
    if ok {
        Ok(true)
    } else {
        Err(unsupported(
            "this combination of datatypes and quantizations",
        ))
    }
}

/// The int8 op of a node accepted by [`check_node`]; `None` for the data-movement
/// nodes, which the generic builder handles (the interpreter copies bytes for qint8).
pub fn build(
    b: &mut Builder<'_>,
    i: usize,
    node: &NodeDef,
    y: usize,
) -> Result<Option<Op>, BackendError> {
    use NodeKind::*;
    let g = b.graph;
    let quant = |v: usize, what: &str| {
        per_tensor(&g.values[v])
            .ok_or_else(|| invalid(b.field(i, node, what), "not a per-tensor qint8 value"))
    };
    let input = |k: usize| node.inputs.get(k).copied().flatten();
    let x = input(0).unwrap_or(0);
    let bounds = |q: TensorQuant| {
        (
            quantize_bound(node.output_min, q.scale, q.zero_point),
            quantize_bound(node.output_max, q.scale, q.zero_point),
        )
    };
    let op = match node.kind {
        MaxPooling2d => {
            let bounds = bounds(quant(y, "output_id")?);
            let Op::Pool(mut p) = b.plain_op(i, node)? else {
                return Err(invalid(b.field(i, node, "input_id"), "not a pooling node"));
            };
            p.q = Some(bounds);
            Op::Pool(p)
        }
        GlobalAvgPooling2d => {
            let input = quant(x, "input_id")?;
            let output = quant(y, "output_id")?;
            let (min, max) = bounds(output);
            let Op::GlobalAvgPool { keep_dims, .. } = b.plain_op(i, node)? else {
                return Err(invalid(b.field(i, node, "input_id"), "not a pooling node"));
            };
            Op::GlobalAvgPool {
                x: b.input(node, 0),
                y,
                keep_dims,
                min: f32::NEG_INFINITY,
                max: f32::INFINITY,
                q: Some(Qs8MeanParams {
                    input,
                    output,
                    min,
                    max,
                }),
            }
        }
        Conv2d | DepthwiseConv2d => conv(b, i, node, y)?,
        _ => return Ok(None),
    };
    Ok(Some(op))
}

fn conv(b: &mut Builder<'_>, i: usize, node: &NodeDef, y: usize) -> Result<Op, BackendError> {
    let x = node.inputs.first().copied().flatten().unwrap_or(0);
    let qx = per_tensor(&b.graph.values[x])
        .ok_or_else(|| invalid(b.field(i, node, "input1_id"), "not qint8"))?;
    let qy = per_tensor(&b.graph.values[y])
        .ok_or_else(|| invalid(b.field(i, node, "output_id"), "not qint8"))?;
    // The geometry and filter-shape checks of the fp32 path.
    let before = b.packed_bytes;
    let Op::Conv(mut c) = b.conv_op(i, node, y)? else {
        return Err(invalid(b.field(i, node, "filter_id"), "not a convolution"));
    };
    b.packed_bytes = before;
    c.filter = Vec::new();
    c.bias = Vec::new();
    let w = c.window;
    let fv = node.inputs.get(1).copied().flatten().unwrap_or(0);
    let filter = bytemuck::cast_slice::<u8, i8>(b.constant(fv).unwrap_or(&[]));
    let out_c = w.groups * w.group_out;
    let rq = requant(b, i, node, qx, qy, out_c)?;
    let bias = bias(b, i, node, out_c)?;
    let mut q = Qs8Conv {
        input_zero_point: qx.zero_point,
        groups: Vec::new(),
        dw_filter: Vec::new(),
        dw_bias: Vec::new(),
        rq: rq.clone(),
        group_rq: Vec::new(),
    };
    match c.kind {
        ConvKind::Depthwise => {
            q.dw_filter = filter
                .get(..w.kernel_h * w.kernel_w * out_c)
                .unwrap_or(&[])
                .to_vec();
            q.dw_bias = bias;
            b.packed_bytes += q.dw_filter.len() + 4 * out_c;
        }
        _ => {
            let patch = w.kernel_h * w.kernel_w * w.group_in;
            for grp in 0..w.groups {
                let rows = grp * w.group_out..(grp + 1) * w.group_out;
                let wg = filter
                    .get(rows.start * patch..rows.end * patch)
                    .unwrap_or(&[]);
                let packed = Qs8Weights::new(
                    w.group_out,
                    patch,
                    wg,
                    Some(&bias[rows.clone()]),
                    qx.zero_point,
                )
                .map_err(|e| invalid(b.field(i, node, "filter_id"), e.to_string()))?;
                b.packed_bytes += packed.packed_bytes();
                q.groups.push(packed);
                q.group_rq.push(Qs8Requant {
                    scales: rq.scales[rows].to_vec(),
                    ..rq.clone()
                });
            }
        }
    }
    c.q = Some(Box::new(q));
    Ok(Op::Conv(c))
}
