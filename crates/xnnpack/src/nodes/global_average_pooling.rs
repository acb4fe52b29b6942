//! `GlobalAvgPooling2d`: the mean over the height and width of NHWC images (the dims
//! `r-3` and `r-2`, kept as 1 with `XNN_FLAG_KEEP_DIMS`), on fp32 values, and on qint8
//! values with XNNPACK's mean reduction (google/XNNPACK `src/operators/reduce-nd.c`,
//! `xnn_init_qs8_reduce_scalar_params` and `xnn_update_qs8_reduce_scalar_params`, the
//! int32 -> qint8 reference convert of `src/reference/unary-elementwise.cc`): the int32
//! sum `S` of `n` inputs becomes `rint(S · s + z)` with `s = (s_in / s_out) · (1 / n)`
//! and `z = zp_out - (n · zp_in) · s`, saturated, then clamped to the node's range.

use etch_kernels::{BackendError, KernelError};
use etch_linalg::pool;

use crate::dims::{Dims, MAX_DIMS};
use crate::graph::NodeDef;
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, checked, int8, int8_mut, per_image, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::quantized::{TensorQuant, output_bounds, tensor_quant};
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::plan_builder::Builder;
use crate::schema::FLAG_KEEP_DIMS;

/// The quantization of a qint8 mean: input and output, and the quantized output range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int8MeanParams {
    pub input: TensorQuant,
    pub output: TensorQuant,
    pub min: i8,
    pub max: i8,
}

/// A global average pooling node.
#[derive(Debug, Clone)]
pub struct GlobalAveragePooling {
    x: usize,
    y: usize,
    keep_dims: bool,
    min: f32,
    max: f32,
    /// The qint8 form.
    int8: Option<Int8MeanParams>,
}

/// Reads a `GlobalAvgPooling2d` node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    r.one_input(node, 0, FLAG_KEEP_DIMS)
}

/// Plans a `GlobalAvgPooling2d` node.
pub fn plan(
    b: &mut Builder<'_>,
    i: usize,
    node: &NodeDef,
) -> Result<GlobalAveragePooling, BackendError> {
    let x = node.inputs.first().copied().flatten().unwrap_or(0);
    let y = b.output(node);
    let keep_dims = node.flags & FLAG_KEEP_DIMS != 0;
    if !b.is_int8(y) {
        return Ok(GlobalAveragePooling {
            x: b.input(node, 0),
            y,
            keep_dims,
            min: node.output_min,
            max: node.output_max,
            int8: None,
        });
    }
    let input = tensor_quant(b, i, node, x, "input_id")?;
    let output = tensor_quant(b, i, node, y, "output_id")?;
    let (min, max) = output_bounds(node, output);
    Ok(GlobalAveragePooling {
        x: b.input(node, 0),
        y,
        keep_dims,
        min: f32::NEG_INFINITY,
        max: f32::INFINITY,
        int8: Some(Int8MeanParams {
            input,
            output,
            min,
            max,
        }),
    })
}

impl NodeOp for GlobalAveragePooling {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let xd = get(shapes, self.x);
        let r = xd.rank();
        if r < 3 {
            return Err("global average pooling needs rank 3 or more");
        }
        // The pooled height and width (dims r-3 and r-2) become 1 or go.
        let mut out = [0usize; MAX_DIMS];
        let mut n = 0;
        for (i, &d) in xd.as_slice().iter().enumerate() {
            let pooled = i == r - 3 || i == r - 2;
            if !pooled || self.keep_dims {
                out[n] = if pooled { 1 } else { d };
                n += 1;
            }
        }
        set(shapes, self.y, Dims::new(&out[..n]).unwrap_or_default());
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let d = call.shapes[self.x];
        let r = d.rank();
        let (h, w, c) = (d.get(r - 3), d.get(r - 2), d.get(r - 1));
        let batch = d.product(0..r - 3);
        let (x, out) = (call.inputs[0], call.output);
        if let Some(q) = &self.int8 {
            return mean_int8(q, batch, h * w, c, x, out);
        }
        per_image(
            "global average pooling",
            batch,
            (x, h * w * c),
            (out, c),
            |src, dst| {
                let ok = pool::global_avg_pool_nhwc(h * w, c, src, self.min, self.max, dst);
                checked(ok, "global average pooling")
            },
        )
    }
}

/// Global average pooling of `batch` int8 images of `pixels x channels`.
fn mean_int8(
    p: &Int8MeanParams,
    batch: usize,
    pixels: usize,
    channels: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let x = int8(x)
        .get(..batch * pixels * channels)
        .ok_or_else(|| short("global average pooling"))?;
    let out = int8_mut(out)
        .get_mut(..batch * channels)
        .ok_or_else(|| short("global average pooling"))?;
    let n = pixels;
    let scale = (p.input.scale / p.output.scale) * (1.0f32 / n as f32);
    // `(int32_t) n * x_zero_point` with a float zero point: an f32 product.
    let zero = p.output.zero_point as f32 - (n as i32 as f32 * p.input.zero_point as f32) * scale;
    for (img, dst) in x
        .chunks_exact(pixels * channels)
        .zip(out.chunks_exact_mut(channels))
    {
        for (c, o) in dst.iter_mut().enumerate() {
            let sum: i32 = (0..pixels).map(|i| i32::from(img[i * channels + c])).sum();
            let v = sum as f32 * scale + zero;
            // round_float_to_int: nearest-even, saturated.
            let q = v.round_ties_even().clamp(-128.0, 127.0) as i8;
            *o = q.clamp(p.min, p.max);
        }
    }
    Ok(())
}
