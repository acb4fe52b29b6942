//! Which datatypes each node kind accepts, checked at init: fp32 values everywhere, plus
//! the quantized patterns real exports produce: the dynamically quantized linear layers
//! of 8da4w / 8da8w (`Convert` fp32 -> qdint8 per token, `FullyConnected` qdint8 x
//! qbint4 / qcint4 / qcint8), the dynamically quantized convolutions (`Conv2d` qdint8
//! per image x qcint8) and the static int8 nodes of PT2E-quantized CNNs (qint8
//! activations, qcint8 weights, qcint32 biases). Anything else is a
//! [`BackendError::Unsupported`] naming the node.

use etch_kernels::BackendError;

use crate::graph::{NodeDef, Quantization, ValueDef};
use crate::nodes::quantized::{is_fp32, is_qint8, per_tensor, touches_qint8};
use crate::schema::{Datatype, NodeKind};

/// Checks the datatypes of node `i`.
pub fn check(values: &[ValueDef], i: usize, node: &NodeDef) -> Result<(), BackendError> {
    if dynamic_quant_pattern(values, i, node)? || static_int8_pattern(values, i, node)? {
        return Ok(());
    }
    // Every other node's values must be fp32 tensors.
    for (slot, v) in node
        .inputs
        .iter()
        .flatten()
        .chain(node.outputs.iter())
        .enumerate()
    {
        let value = &values[*v];
        if value.datatype != Datatype::Fp32 || value.quant.is_some() {
            return Err(BackendError::Unsupported(format!(
                "XNNPACK node {} (xnodes[{}]) with a {} value (xvalues id {}, operand {slot}); \
                 quantized nodes are not implemented yet",
                node.kind.name(),
                i,
                value.datatype.name(),
                value.id
            )));
        }
    }
    Ok(())
}

fn dynamic_quant_pattern(
    values: &[ValueDef],
    i: usize,
    node: &NodeDef,
) -> Result<bool, BackendError> {
    let v = |k: usize| node.inputs.get(k).copied().flatten().map(|i| &values[i]);
    let out = &values[node.outputs[0]];
    let is_fp32 = |x: &ValueDef| x.datatype == Datatype::Fp32 && x.quant.is_none();
    let unsupported = || {
        BackendError::Unsupported(format!(
            "XNNPACK node {} (xnodes[{}]) with these quantized values",
            node.kind.name(),
            i
        ))
    };
    match node.kind {
        NodeKind::Convert if out.datatype == Datatype::QdInt8 => {
            let input = v(0).ok_or_else(unsupported)?;
            // One row per token (linear layers) or per image (convolutions).
            let ok = is_fp32(input)
                && matches!(
                    out.quant,
                    Some(Quantization::PerTokenDynamic { num_nonbatch_dims })
                        if (1..=out.dims.rank()).contains(&num_nonbatch_dims)
                )
                && out.dims.rank() == input.dims.rank();
            if ok { Ok(true) } else { Err(unsupported()) }
        }
        NodeKind::FullyConnected if v(0).is_some_and(|x| x.datatype == Datatype::QdInt8) => {
            let filter = v(1).ok_or_else(unsupported)?;
            let bias_ok = v(2).is_none_or(is_fp32);
            let filter_ok = matches!(
                (&filter.datatype, &filter.quant),
                (
                    Datatype::QbInt4,
                    Some(Quantization::PerChannelGroup { channel_dim: 0, .. })
                ) | (
                    Datatype::QcInt4 | Datatype::QcInt8,
                    Some(Quantization::PerChannel { channel_dim: 0, .. })
                )
            );
            let ok = bias_ok
                && filter_ok
                && filter.constant.is_some()
                && filter.dims.rank() == 2
                && node.flags == 0
                && is_fp32(out);
            if ok { Ok(true) } else { Err(unsupported()) }
        }
        NodeKind::Conv2d if v(0).is_some_and(|x| x.datatype == Datatype::QdInt8) => {
            let filter = v(1).ok_or_else(unsupported)?;
            let filter_ok = filter.datatype == Datatype::QcInt8
                && matches!(
                    filter.quant,
                    Some(Quantization::PerChannel { channel_dim: 0, .. })
                )
                && filter.constant.is_some();
            let ok = filter_ok && v(2).is_none_or(is_fp32) && is_fp32(out);
            if ok { Ok(true) } else { Err(unsupported()) }
        }
        _ => Ok(false),
    }
}

fn static_int8_pattern(
    values: &[ValueDef],
    i: usize,
    node: &NodeDef,
) -> Result<bool, BackendError> {
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
