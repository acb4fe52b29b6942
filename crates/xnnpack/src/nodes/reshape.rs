//! `StaticReshape` and `Copy` (and `Convert` between two fp32 values): the output holds
//! the input's elements in order, under new dims for a reshape. Words are copied, so
//! the same code moves int8 values (four bytes to a word).

use etch_kernels::{BackendError, KernelError};

use crate::dims::Dims;
use crate::graph::{NodeDef, Params, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::plan_builder::Builder;
use crate::schema::NodeKind;

/// A reshape, or a copy (which keeps the input's dims).
#[derive(Debug, Clone)]
pub struct Reshape {
    x: usize,
    y: usize,
    /// The serialized new shape (0 for the one inferred dim); `None` for a copy.
    new_shape: Option<Dims>,
}

/// Reads a `Copy` or `StaticReshape` node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    if r.kind == NodeKind::Copy {
        return r.one_input(node, 0, 0);
    }
    let shape = r.dims(1, "new_shape")?;
    if shape.as_slice().iter().filter(|&&d| d == 0).count() > 1 {
        return Err(invalid(
            r.field("new_shape"),
            format!("{shape:?} has more than one inferred (0) dim"),
        ));
    }
    node.params = Params::Reshape(shape);
    r.one_input(node, 2, 0)
}

/// Plans a `Copy`, a `StaticReshape` or an fp32 -> fp32 `Convert`.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Reshape, BackendError> {
    let new_shape = match (node.kind, &node.params) {
        (NodeKind::StaticReshape, Params::Reshape(shape)) => Some(*shape),
        (NodeKind::StaticReshape, _) => {
            return Err(invalid(b.field(i, node, "new_shape"), "missing"));
        }
        _ => None,
    };
    Ok(Reshape {
        x: b.input(node, 0),
        y: b.output(node),
        new_shape,
    })
}

impl NodeOp for Reshape {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let Some(shape) = self.new_shape else {
            set(shapes, self.y, get(shapes, self.x));
            return Ok(());
        };
        let n = get(shapes, self.x).numel().ok_or("input size overflows")?;
        let mut d = shape;
        let inferred = d.as_slice().iter().position(|&v| v == 0);
        if let Some(k) = inferred {
            d.as_mut_slice()[k] = 1;
            let rest = d.numel().ok_or("shape overflows")?;
            if rest == 0 || n % rest != 0 {
                return Err("cannot infer the reshape dimension");
            }
            d.as_mut_slice()[k] = n / rest;
        } else if d.numel() != Some(n) {
            return Err("reshape changes the element count");
        }
        set(shapes, self.y, d);
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let out = call.output;
        let x = call.inputs[0]
            .get(..out.len())
            .ok_or_else(|| short("copy"))?;
        out.copy_from_slice(x);
        Ok(())
    }
}
