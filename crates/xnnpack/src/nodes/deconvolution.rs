//! `ConvTranspose2d` (deconvolution) of fp32 NHWC images, filter
//! `[groups * group_out, kh, kw, group_in]` (`etch_linalg::conv`).

use etch_kernels::{BackendError, KernelError};
use etch_linalg::conv;

use crate::dims::Dims;
use crate::graph::{NodeDef, Window};
use crate::nodes::call::{Inputs, NodeCall, checked, per_image};
use crate::nodes::conv_filter::{self, f32_bias};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::ShapeResult;
use crate::nodes::window::conv_geometry;
use crate::plan_builder::{Builder, f32_data};

/// A deconvolution node.
#[derive(Debug, Clone)]
pub struct Deconvolution {
    x: usize,
    y: usize,
    window: Window,
    filter: Vec<f32>,
    /// One per output channel (zeros without a bias).
    bias: Vec<f32>,
    min: f32,
    max: f32,
}

/// Plans a `ConvTranspose2d` node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Deconvolution, BackendError> {
    let f = conv_filter::filter(b, i, node)?;
    let filter = f32_data(f.bytes);
    b.packed_bytes += filter.len() * 4;
    Ok(Deconvolution {
        x: b.input(node, 0),
        y: b.output(node),
        window: f.window,
        bias: f32_bias(b, i, node, f.out_channels)?,
        filter,
        min: node.output_min,
        max: node.output_max,
    })
}

impl NodeOp for Deconvolution {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        conv_filter::infer_shape(&self.window, false, true, (self.x, self.y), shapes)
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let (xd, yd) = (&call.shapes[self.x], &call.shapes[self.y]);
        let g = conv_geometry(&self.window, xd, yd);
        let in_img = g.in_h * g.in_w * g.in_channels();
        let out_img = g.out_pixels() * g.out_channels();
        let (x, out) = (call.inputs[0], call.output);
        per_image(
            "convolution",
            xd.get(0),
            (x, in_img),
            (out, out_img),
            |src, dst| {
                let (filter, bias) = (&self.filter, &self.bias);
                let ok =
                    conv::conv_transpose2d_nhwc(&g, src, filter, bias, self.min, self.max, dst);
                checked(ok, "convolution")
            },
        )
    }
}
