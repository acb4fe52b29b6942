//! What planning a node needs from the graph: its operands resolved to value indices
//! (constants read as plain operands marked, so the plan keeps their data), its
//! constants' bytes, its bias, and the count of bytes packed so far.

use std::borrow::Cow;

use etch_kernels::BackendError;

use crate::graph::{GraphDef, NodeDef, invalid};
use crate::schema::Datatype;

/// A bias operand.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum Bias {
    None,
    Packed(Vec<f32>),
    Value(usize),
}

/// Constant bytes as f32 values (copied).
pub(crate) fn f32_data(bytes: &[u8]) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(bytes)
}

/// `bytes` as f32 values: borrowed when they are aligned (no second copy of a large
/// weight while it is packed), copied otherwise.
pub(crate) fn f32_view(bytes: &[u8]) -> Cow<'_, [f32]> {
    match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(values) => Cow::Borrowed(values),
        Err(_) => Cow::Owned(f32_data(bytes)),
    }
}

/// The state of planning one graph, node after node.
pub(crate) struct Builder<'g> {
    pub(crate) graph: &'g GraphDef,
    /// Whether a constant is read as an ordinary operand somewhere.
    pub(crate) plain_use: Vec<bool>,
    pub(crate) packed_bytes: usize,
}

impl<'g> Builder<'g> {
    /// The error path of field `name` of node `i`.
    pub(crate) fn field(&self, i: usize, node: &NodeDef, name: &str) -> String {
        format!("xnodes[{i}].{}.{name}", node.kind.name())
    }

    /// The bytes of value `v` when it is a constant.
    pub(crate) fn constant(&self, v: usize) -> Option<&'g [u8]> {
        let graph: &'g GraphDef = self.graph;
        graph.values[v].constant.as_deref()
    }

    /// Value `v` read as a plain operand (a constant's data is then kept).
    pub(crate) fn operand(&mut self, v: usize) -> usize {
        if self.graph.values[v].constant.is_some() {
            self.plain_use[v] = true;
        }
        v
    }

    /// The value `node` writes.
    pub(crate) fn output(&self, node: &NodeDef) -> usize {
        node.outputs.first().copied().unwrap_or(0)
    }

    /// Whether value `v` is a qint8 tensor (int8 bytes in the arena).
    pub(crate) fn is_int8(&self, v: usize) -> bool {
        self.graph.values[v].datatype == Datatype::QInt8
    }

    /// Input `k` of `node` read as a plain operand.
    pub(crate) fn input(&mut self, node: &NodeDef, k: usize) -> usize {
        let v = node.inputs.get(k).copied().flatten().unwrap_or(0);
        self.operand(v)
    }

    /// The bias (input 2) of a node with `n` output channels: packed when constant.
    pub(crate) fn bias(
        &mut self,
        i: usize,
        node: &NodeDef,
        n: usize,
    ) -> Result<Bias, BackendError> {
        let Some(v) = node.inputs.get(2).copied().flatten() else {
            return Ok(Bias::None);
        };
        let numel = self.graph.values[v].dims.numel().unwrap_or(0);
        if numel != n {
            return Err(invalid(
                self.field(i, node, "bias_id"),
                format!("bias of {numel} elements for {n} output channels"),
            ));
        }
        match self.constant(v) {
            Some(bytes) => {
                self.packed_bytes += n * 4;
                Ok(Bias::Packed(f32_data(bytes)))
            }
            None => Ok(Bias::Value(self.operand(v))),
        }
    }
}
