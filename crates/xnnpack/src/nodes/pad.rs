//! `StaticConstantPad`: the input embedded in an output filled with the padding value,
//! `pre` elements before and `post` after it along each axis.

use etch_kernels::{BackendError, KernelError};

use crate::dims::Dims;
use crate::graph::{NodeDef, Params, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::nodes::strided::{contiguous_strides, copy_block, offset};
use crate::plan_builder::Builder;

/// A constant pad node.
#[derive(Debug, Clone)]
pub struct Pad {
    x: usize,
    y: usize,
    pre: Dims,
    post: Dims,
    value: f32,
}

/// Reads a `StaticConstantPad` node: as many post paddings as pre paddings, each at
/// most 2^24.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    let pre = r.dims(0, "pre_paddings")?;
    let post = r.dims(1, "post_paddings")?;
    if pre.rank() != post.rank() {
        return Err(invalid(
            r.field("post_paddings"),
            "length differs from pre_paddings",
        ));
    }
    if pre
        .as_slice()
        .iter()
        .chain(post.as_slice())
        .any(|&p| p > 1 << 24)
    {
        return Err(invalid(r.field("pre_paddings"), "padding out of range"));
    }
    let value = r.f32(2, "padding_value")?;
    node.params = Params::Pad { pre, post, value };
    r.one_input(node, 3, 0)
}

/// Plans a `StaticConstantPad` node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Pad, BackendError> {
    let Params::Pad { pre, post, value } = node.params else {
        return Err(invalid(b.field(i, node, "pre_paddings"), "missing"));
    };
    Ok(Pad {
        x: b.input(node, 0),
        y: b.output(node),
        pre,
        post,
        value,
    })
}

impl NodeOp for Pad {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let xd = get(shapes, self.x);
        if xd.rank() > self.pre.rank() {
            return Err("fewer paddings than input dimensions");
        }
        let mut d = xd;
        for i in 0..xd.rank() {
            d.as_mut_slice()[i] = xd.get(i) + self.pre.get(i) + self.post.get(i);
        }
        set(shapes, self.y, d);
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let out = call.output;
        out.fill(self.value);
        let xd = call.shapes[self.x];
        let pre = &self.pre.as_slice()[..xd.rank()];
        embed(&xd, pre, &call.shapes[self.y], call.inputs[0], out)
    }
}

/// Writes `x` (shape `xd`) into `out` (shape `yd`) at offset `pre` per axis.
pub fn embed(
    xd: &Dims,
    pre: &[usize],
    yd: &Dims,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let ys = contiguous_strides(yd);
    let to = (out, offset(pre, &ys), &ys);
    copy_block(xd, (x, 0, &contiguous_strides(xd)), to, "pad")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeds_the_input() {
        let d = |v: &[usize]| Dims::new(v).unwrap();
        let mut p = [9f32; 8];
        embed(&d(&[1, 2]), &[1, 1], &d(&[2, 4]), &[1.0, 2.0], &mut p).unwrap();
        assert_eq!(p, [9.0, 9.0, 9.0, 9.0, 9.0, 1.0, 2.0, 9.0]);
    }
}
