//! `AvgPooling2d` and `MaxPooling2d` of NHWC images (`etch_linalg::pool`), and
//! `MaxPooling2d` of qint8 images (input and output share their quantization; padding
//! ignored, the output clamped to the quantized output range).

use etch_kernels::{BackendError, KernelError};
use etch_linalg::pool::{self, PoolGeometry};

use crate::dims::Dims;
use crate::graph::{NodeDef, Params, Window, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, checked, int8, int8_mut, per_image, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::quantized::{output_bounds, tensor_quant};
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::nodes::window::{output_height, output_width, pool_geometry};
use crate::plan_builder::Builder;
use crate::schema::{FLAG_KEEP_DIMS, NodeKind};

/// A pooling node.
#[derive(Debug, Clone)]
pub struct Pooling {
    max_pool: bool,
    x: usize,
    y: usize,
    window: Window,
    min: f32,
    max: f32,
    /// Max pooling on qint8: the quantized output bounds.
    int8_bounds: Option<(i8, i8)>,
}

/// Reads an `AvgPooling2d` or `MaxPooling2d` node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    node.params = Params::Window(r.window(false)?);
    r.one_input(node, 10, FLAG_KEEP_DIMS)
}

/// Plans a pooling node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Pooling, BackendError> {
    let Params::Window(window) = node.params else {
        return Err(invalid(b.field(i, node, "pooling_height"), "missing"));
    };
    let y = b.output(node);
    let int8_bounds = if b.is_int8(y) {
        Some(output_bounds(
            node,
            tensor_quant(b, i, node, y, "output_id")?,
        ))
    } else {
        None
    };
    Ok(Pooling {
        max_pool: node.kind == NodeKind::MaxPooling2d,
        x: b.input(node, 0),
        y,
        window,
        min: node.output_min,
        max: node.output_max,
        int8_bounds,
    })
}

impl NodeOp for Pooling {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let xd = get(shapes, self.x);
        if xd.rank() != 4 {
            return Err("pooling input must be NHWC (rank 4)");
        }
        let w = &self.window;
        let oh =
            output_height(w, xd.get(1)).ok_or("pooling window taller than the padded input")?;
        let ow = output_width(w, xd.get(2)).ok_or("pooling window wider than the padded input")?;
        let d = [xd.get(0), oh, ow, xd.get(3)];
        set(shapes, self.y, Dims::new(&d).unwrap_or_default());
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let (xd, yd) = (&call.shapes[self.x], &call.shapes[self.y]);
        let g = pool_geometry(&self.window, xd, yd);
        let in_img = g.in_h * g.in_w * g.channels;
        let out_img = g.out_h * g.out_w * g.channels;
        let (x, out) = (call.inputs[0], call.output);
        if let Some((min, max)) = self.int8_bounds {
            return per_image(
                "pooling",
                xd.get(0),
                (int8(x), in_img),
                (int8_mut(out), out_img),
                |s, d| max_pool_int8(&g, s, min, max, d),
            );
        }
        per_image(
            "pooling",
            xd.get(0),
            (x, in_img),
            (out, out_img),
            |src, dst| {
                let ok = if self.max_pool {
                    pool::max_pool2d_nhwc(&g, src, self.min, self.max, dst)
                } else {
                    pool::avg_pool2d_nhwc(&g, src, self.min, self.max, dst)
                };
                checked(ok, "pooling")
            },
        )
    }
}

/// Max pooling of one int8 NHWC image (padding ignored), clamped to `[min, max]`.
fn max_pool_int8(
    g: &PoolGeometry,
    x: &[i8],
    min: i8,
    max: i8,
    out: &mut [i8],
) -> Result<(), KernelError> {
    let c = g.channels;
    if x.len() < g.in_h * g.in_w * c || out.len() < g.out_h * g.out_w * c {
        return Err(short("max pooling"));
    }
    let source = |o: usize, t: usize, s: usize, d: usize, p: usize, n: usize| {
        (o * s + t * d).checked_sub(p).filter(|&v| v < n)
    };
    for oy in 0..g.out_h {
        for ox in 0..g.out_w {
            let dst = &mut out[(oy * g.out_w + ox) * c..(oy * g.out_w + ox + 1) * c];
            dst.fill(i8::MIN);
            for ky in 0..g.kernel_h {
                let Some(iy) = source(oy, ky, g.stride_h, g.dilation_h, g.pad_top, g.in_h) else {
                    continue;
                };
                for kx in 0..g.kernel_w {
                    let Some(ix) = source(ox, kx, g.stride_w, g.dilation_w, g.pad_left, g.in_w)
                    else {
                        continue;
                    };
                    let src = &x[(iy * g.in_w + ix) * c..(iy * g.in_w + ix + 1) * c];
                    for (o, &v) in dst.iter_mut().zip(src) {
                        *o = (*o).max(v);
                    }
                }
            }
            for o in dst.iter_mut() {
                *o = (*o).clamp(min, max);
            }
        }
    }
    Ok(())
}
