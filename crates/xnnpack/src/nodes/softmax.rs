//! `Softmax` over the last axis.

use etch_kernels::{BackendError, KernelError};

use crate::dims::Dims;
use crate::graph::NodeDef;
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::plan_builder::Builder;

/// A softmax node.
#[derive(Debug, Clone)]
pub struct Softmax {
    x: usize,
    y: usize,
}

/// Reads a `Softmax` node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    r.one_input(node, 0, 0)
}

/// Plans a `Softmax` node.
pub fn plan(b: &mut Builder<'_>, node: &NodeDef) -> Softmax {
    Softmax {
        x: b.input(node, 0),
        y: b.output(node),
    }
}

impl NodeOp for Softmax {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let d = get(shapes, self.x);
        if d.rank() == 0 {
            return Err("softmax needs at least one dimension");
        }
        set(shapes, self.y, d);
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let d = call.shapes[self.x];
        softmax(d.get(d.rank() - 1), call.inputs[0], call.output);
        Ok(())
    }
}

/// Softmax over rows of `cols` elements.
fn softmax(cols: usize, x: &[f32], out: &mut [f32]) {
    for (row, o) in x
        .chunks_exact(cols.max(1))
        .zip(out.chunks_exact_mut(cols.max(1)))
    {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (d, &v) in o.iter_mut().zip(row) {
            *d = (v - m).exp();
            sum += *d;
        }
        let inv = 1.0 / sum;
        for d in o.iter_mut() {
            *d *= inv;
        }
    }
}
