//! Graph rewrites made once at load, as XNNPACK's subgraph optimizer makes them
//! (`xnn_subgraph_fusion`, google/XNNPACK `src/subgraph.c`).
//!
//! A `Clamp` of qint8 values right after an int8 convolution becomes the convolution's
//! output range: PT2E exports keep every ReLU / ReLU6 of a quantized CNN as its own
//! node (35 of them in MobileNetV2), each a pass over an activation. The fusion is
//! exact: an int8 clamp requantizes nothing (its input and output share their
//! quantization, which is checked), so clamping the convolution's requantized output
//! to the intersection of both ranges gives the same bytes.

use crate::graph::{NodeDef, ValueDef};
use crate::nodes::quantized::per_tensor;
use crate::schema::NodeKind;

/// Folds each int8 `Clamp` whose input only it reads, written by a `Conv2d` or
/// `DepthwiseConv2d`, into that convolution.
pub(crate) fn fuse_int8_clamps(values: &[ValueDef], nodes: &mut Vec<NodeDef>) {
    let mut readers = vec![0usize; values.len()];
    for node in nodes.iter() {
        for v in node.inputs.iter().flatten() {
            if let Some(r) = readers.get_mut(*v) {
                *r += 1;
            }
        }
    }
    let mut writer: Vec<Option<usize>> = vec![None; values.len()];
    for (i, node) in nodes.iter().enumerate() {
        for &v in &node.outputs {
            if let Some(w) = writer.get_mut(v) {
                *w = Some(i);
            }
        }
    }
    let mut folded = vec![false; nodes.len()];
    for c in 0..nodes.len() {
        let clamp = &nodes[c];
        let (Some(&Some(x)), Some(&y)) = (clamp.inputs.first(), clamp.outputs.first()) else {
            continue;
        };
        if clamp.kind != NodeKind::Clamp || clamp.inputs.len() != 1 || clamp.outputs.len() != 1 {
            continue;
        }
        let Some(p) = writer.get(x).copied().flatten() else {
            continue;
        };
        let producer = &nodes[p];
        let (Some(vx), Some(vy)) = (values.get(x), values.get(y)) else {
            continue;
        };
        let fusable = matches!(producer.kind, NodeKind::Conv2d | NodeKind::DepthwiseConv2d)
            && producer.outputs.len() == 1
            && readers[x] == 1
            && vx.external.is_none()
            && per_tensor(vx).is_some()
            && per_tensor(vx) == per_tensor(vy)
            && !folded[p];
        if !fusable {
            continue;
        }
        let (min, max) = (clamp.output_min, clamp.output_max);
        let producer = &mut nodes[p];
        producer.output_min = producer.output_min.max(min);
        producer.output_max = producer.output_max.min(max);
        producer.outputs[0] = y;
        writer[y] = Some(p);
        folded[c] = true;
    }
    let mut keep = folded.into_iter().map(|f| !f);
    nodes.retain(|_| keep.next().unwrap_or(true));
}
