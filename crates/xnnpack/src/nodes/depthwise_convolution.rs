//! `DepthwiseConv2d` of NHWC images (filter `[1, kh, kw, channels * multiplier]`), its
//! output rows split over the pool: fp32 (`etch_linalg::conv`) and qint8 x qcint8 ->
//! qint8 with XNNPACK's requantization (`etch_linalg::quant::qs8`).

use std::sync::atomic::{AtomicBool, Ordering};

use etch_kernels::{BackendError, KernelError, ThreadPool};
use etch_linalg::conv::{self, ConvGeometry};
use etch_linalg::quant::qs8::{Qs8Requant, depthwise_conv2d_qs8};

use crate::dims::Dims;
use crate::graph::{NodeDef, Window};
use crate::nodes::call::{Inputs, NodeCall, checked, int8, int8_mut, per_image};
use crate::nodes::conv_filter::{self, f32_bias, int8_conv};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::ShapeResult;
use crate::nodes::window::conv_geometry;
use crate::plan_builder::{Builder, f32_data};

/// The filter and arithmetic of a depthwise convolution.
#[derive(Debug, Clone)]
pub enum Weights {
    /// fp32: the filter `[kh, kw, channels]`, one bias per channel (zeros without one),
    /// the output clamp.
    F32 {
        filter: Vec<f32>,
        bias: Vec<f32>,
        min: f32,
        max: f32,
    },
    /// qint8 input and output, qcint8 filter `[kh, kw, channels]`, int32 bias.
    Int8 {
        input_zero_point: i32,
        filter: Vec<i8>,
        bias: Vec<i32>,
        rq: Qs8Requant,
    },
}

/// A depthwise convolution node.
#[derive(Debug, Clone)]
pub struct DepthwiseConvolution {
    x: usize,
    y: usize,
    /// Channels in `groups`, the depth multiplier in `group_out`.
    window: Window,
    weights: Weights,
}

/// Plans a `DepthwiseConv2d` node.
pub fn plan(
    b: &mut Builder<'_>,
    i: usize,
    node: &NodeDef,
) -> Result<DepthwiseConvolution, BackendError> {
    let f = conv_filter::filter(b, i, node)?;
    let (w, out_c) = (f.window, f.out_channels);
    let y = b.output(node);
    let weights = if b.is_int8(y) {
        let q = int8_conv(b, i, node, out_c)?;
        let filter: Vec<i8> = bytemuck::cast_slice::<u8, i8>(f.bytes)
            .get(..w.kernel_h * w.kernel_w * out_c)
            .unwrap_or(&[])
            .to_vec();
        b.packed_bytes += filter.len() + 4 * out_c;
        Weights::Int8 {
            input_zero_point: q.input_zero_point,
            filter,
            bias: q.bias,
            rq: q.rq,
        }
    } else {
        let filter = f32_data(f.bytes);
        b.packed_bytes += filter.len() * 4;
        Weights::F32 {
            filter,
            bias: f32_bias(b, i, node, out_c)?,
            min: node.output_min,
            max: node.output_max,
        }
    };
    Ok(DepthwiseConvolution {
        x: b.input(node, 0),
        y,
        window: w,
        weights,
    })
}

impl NodeOp for DepthwiseConvolution {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        conv_filter::infer_shape(&self.window, true, false, (self.x, self.y), shapes)
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let (xd, yd) = (&call.shapes[self.x], &call.shapes[self.y]);
        let g = conv_geometry(&self.window, xd, yd);
        let in_img = g.in_h * g.in_w * g.in_channels();
        let out_img = g.out_pixels() * g.out_channels();
        let (pool, x, out) = (call.pool, call.inputs[0], call.output);
        match &self.weights {
            Weights::F32 {
                filter,
                bias,
                min,
                max,
            } => per_image(
                "convolution",
                xd.get(0),
                (x, in_img),
                (out, out_img),
                |src, dst| {
                    let ok = by_rows(&g, pool, dst, |rows, chunk| {
                        let isa = etch_linalg::dispatch().gemm;
                        conv::depthwise_conv2d_nhwc(
                            isa, &g, src, filter, bias, *min, *max, rows, chunk,
                        )
                    });
                    checked(ok, "convolution")
                },
            ),
            Weights::Int8 {
                input_zero_point,
                filter,
                bias,
                rq,
            } => per_image(
                "convolution",
                xd.get(0),
                (int8(x), in_img),
                (int8_mut(out), out_img),
                |src, dst| {
                    let ok = by_rows(&g, pool, dst, |rows, chunk| {
                        depthwise_conv2d_qs8(
                            &g,
                            src,
                            *input_zero_point,
                            filter,
                            bias,
                            rq,
                            rows,
                            chunk,
                        )
                    });
                    checked(ok, "depthwise convolution")
                },
            ),
        }
    }
}

/// Runs `rows(output rows, their elements)` over the output rows of one image split
/// evenly over the pool; false when any call was.
fn by_rows<T: Send>(
    g: &ConvGeometry,
    pool: &ThreadPool,
    out: &mut [T],
    rows: impl Fn(std::ops::Range<usize>, &mut [T]) -> bool + Sync + Send,
) -> bool {
    let row = g.out_w * g.out_channels();
    let per_task = g.out_h.div_ceil(pool.threads()).max(1);
    let ok = AtomicBool::new(true);
    pool.for_each_chunk_mut(out, per_task * row.max(1), 1, |i, chunk| {
        let r0 = i * per_task;
        let r1 = (r0 + chunk.len() / row.max(1)).min(g.out_h);
        if !rows(r0..r1, chunk) {
            ok.store(false, Ordering::Relaxed);
        }
    });
    ok.into_inner()
}
