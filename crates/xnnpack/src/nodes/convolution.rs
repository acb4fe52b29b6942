//! `Conv2d`: a grouped convolution of NHWC images as GEMMs against the filter packed at
//! init, one packed operand per group (the OHWI filter is already the `[n, k]` layout of
//! the im2col product):
//! - fp32: each thread of the pool takes one share of the output pixels and walks it in
//!   blocks of [`CONV_BLOCK_PIXELS`], a pointwise convolution multiplying the image rows
//!   themselves, the others an im2col block per group, with its own im2col and GEMM
//!   scratch (one hand-off per convolution, not one per block);
//! - qint8 x qcint8 -> qint8: im2col blocks of [`IM2COL_BLOCK`] pixels (int8, rows
//!   padded to four bytes) times the packed filter, XNNPACK's requantization
//!   (`etch_linalg::quant::qs8`).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use etch_kernels::{BackendError, KernelError, ThreadPool};
use etch_linalg::conv::{self, ConvGeometry};
use etch_linalg::quant::qs8::{
    Qs8Requant, Qs8Rows, Qs8Weights, gemm_qs8, gemm_qs8_parallel, im2col_qs8,
};
use etch_linalg::{GemmF32, PackedB, RhsF32, gemm_f32};

use crate::dims::Dims;
use crate::graph::{NodeDef, Window, invalid};
use crate::nodes::call::{Inputs, NodeCall, clamp_of, int8, int8_mut, linalg, per_image, short};
use crate::nodes::conv_filter::{self, f32_bias, int8_conv};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::ShapeResult;
use crate::nodes::window::conv_geometry;
use crate::plan_builder::{Builder, f32_data};

/// Output pixels one im2col block of an fp32 convolution holds: rows enough for the
/// GEMM's tiles on every thread, few enough for the block to stay in cache.
pub const CONV_BLOCK_PIXELS: usize = 256;

/// Output pixels one im2col block of an int8 convolution holds (per thread).
pub const IM2COL_BLOCK: usize = 64;

/// The packed filter and arithmetic of a convolution.
#[derive(Debug, Clone)]
pub enum Weights {
    /// fp32: the filter of each group packed for the GEMM (`[group_out, patch]`), one
    /// bias per output channel (zeros without one), the output clamp.
    F32 {
        packed: Vec<PackedB>,
        bias: Vec<f32>,
        min: f32,
        max: f32,
    },
    /// qint8 input and output, qcint8 filter.
    Int8 {
        input_zero_point: i32,
        /// One packed GEMM operand per group (`[group_out, patch]`, the bias inside).
        groups: Vec<Qs8Weights>,
        /// The requantization of the whole output (pointwise, one group).
        rq: Qs8Requant,
        /// Per group, its slice of the requantization.
        group_rq: Vec<Qs8Requant>,
    },
}

/// A convolution node.
#[derive(Debug, Clone)]
pub struct Convolution {
    x: usize,
    y: usize,
    window: Window,
    weights: Weights,
}

/// Plans a `Conv2d` node: its filter packed per group.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Convolution, BackendError> {
    let f = conv_filter::filter(b, i, node)?;
    let (w, out_c) = (f.window, f.out_channels);
    let y = b.output(node);
    let patch = w.kernel_h * w.kernel_w * w.group_in;
    let weights = if b.is_int8(y) {
        let q = int8_conv(b, i, node, out_c)?;
        let filter = bytemuck::cast_slice::<u8, i8>(f.bytes);
        let mut groups = Vec::with_capacity(w.groups);
        let mut group_rq = Vec::with_capacity(w.groups);
        for grp in 0..w.groups {
            let rows = grp * w.group_out..(grp + 1) * w.group_out;
            let wg = filter
                .get(rows.start * patch..rows.end * patch)
                .unwrap_or(&[]);
            let packed = Qs8Weights::new(
                w.group_out,
                patch,
                wg,
                Some(&q.bias[rows.clone()]),
                q.input_zero_point,
            )
            .map_err(|e| invalid(b.field(i, node, "filter_id"), e.to_string()))?;
            b.packed_bytes += packed.packed_bytes();
            groups.push(packed);
            group_rq.push(Qs8Requant {
                scales: q.rq.scales[rows].to_vec(),
                ..q.rq.clone()
            });
        }
        Weights::Int8 {
            input_zero_point: q.input_zero_point,
            groups,
            rq: q.rq,
            group_rq,
        }
    } else {
        let bias = f32_bias(b, i, node, out_c)?;
        let filter = match conv_filter::per_channel_int8_scales(b, node) {
            // A dynamically quantized convolution: its qcint8 filter, dequantized.
            Some(scales) => conv_filter::dequantize_per_output_channel(f.bytes, scales),
            None => f32_data(f.bytes),
        };
        let per_group = w.group_out * patch;
        let mut packed = Vec::with_capacity(w.groups);
        for grp in 0..w.groups {
            let rows = filter
                .get(grp * per_group..(grp + 1) * per_group)
                .ok_or_else(|| {
                    invalid(
                        b.field(i, node, "filter_id"),
                        "shorter than the node's geometry",
                    )
                })?;
            let p = PackedB::from_nk(rows, w.group_out, patch)
                .map_err(|e| invalid(b.field(i, node, "filter_id"), e.to_string()))?;
            packed.push(p);
        }
        b.packed_bytes += packed.iter().map(PackedB::packed_bytes).sum::<usize>();
        Weights::F32 {
            packed,
            bias,
            min: node.output_min,
            max: node.output_max,
        }
    };
    Ok(Convolution {
        x: b.input(node, 0),
        y,
        window: w,
        weights,
    })
}

impl NodeOp for Convolution {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        conv_filter::infer_shape(&self.window, false, false, (self.x, self.y), shapes)
    }

    fn gemm_scratch_len(&self, shapes: &[Dims], threads: usize) -> usize {
        let Weights::F32 { packed, .. } = &self.weights else {
            return 0;
        };
        let g = conv_geometry(&self.window, &shapes[self.x], &shapes[self.y]);
        threads.max(1) * gemm_scratch_per_task(&g, packed)
    }

    fn im2col_len_per_thread(&self) -> usize {
        let w = &self.window;
        let patch = w.kernel_h * w.kernel_w * w.group_in;
        match self.weights {
            Weights::F32 { .. } => {
                let grouped_out = if w.groups > 1 { w.group_out } else { 0 };
                CONV_BLOCK_PIXELS * (patch + grouped_out)
            }
            Weights::Int8 { .. } => patch * IM2COL_BLOCK,
        }
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let (xd, yd) = (&call.shapes[self.x], &call.shapes[self.y]);
        let g = conv_geometry(&self.window, xd, yd);
        let in_img = g.in_h * g.in_w * g.in_channels();
        let out_img = g.out_pixels() * g.out_channels();
        let (pool, x, out) = (call.pool, call.inputs[0], call.output);
        let mut scratch = call.scratch;
        match &self.weights {
            Weights::F32 { .. } => per_image(
                "convolution",
                xd.get(0),
                (x, in_img),
                (out, out_img),
                |src, dst| self.f32_image(&g, pool, src, dst, scratch.whole()),
            ),
            Weights::Int8 { .. } => {
                let (col, _) = scratch.parts();
                per_image(
                    "convolution",
                    xd.get(0),
                    (int8(x), in_img),
                    (int8_mut(out), out_img),
                    |src, dst| self.int8_image(&g, pool, src, dst, col),
                )
            }
        }
    }
}

impl Convolution {
    /// One fp32 image: each task of the pool takes a share of the output pixels, with
    /// its own im2col block and GEMM scratch from `scratch`.
    fn f32_image(
        &self,
        g: &ConvGeometry,
        pool: &ThreadPool,
        src: &[f32],
        dst: &mut [f32],
        scratch: &mut [f32],
    ) -> Result<(), KernelError> {
        let Weights::F32 { packed, bias, .. } = &self.weights else {
            return Err(short("convolution"));
        };
        let (co, pixels) = (g.out_channels(), g.out_pixels());
        if packed.len() != g.groups || bias.len() < co || dst.len() < pixels * co {
            return Err(short("convolution"));
        }
        let threads = pool.threads().max(1);
        let per_task = pixels.div_ceil(threads).max(1);
        let tasks = pixels.div_ceil(per_task);
        let (col_len, gemm_len) = (im2col_per_task(g), gemm_scratch_per_task(g, packed));
        let task_len = col_len + gemm_len;
        if scratch.len() < tasks * task_len {
            return Err(short("convolution scratch"));
        }
        let dst = &mut dst[..pixels * co];
        let failed = AtomicBool::new(false);
        pool.for_each_chunk_mut_with_scratch(
            dst,
            per_task * co,
            1,
            scratch,
            task_len,
            |t, out, task_scratch| {
                let first = t * per_task;
                let pixels = first..first + out.len() / co.max(1);
                let (col, gemm) = task_scratch.split_at_mut(col_len.min(task_scratch.len()));
                if self.f32_pixels(g, src, pixels, out, col, gemm).is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
            },
        );
        if failed.into_inner() {
            return Err(short("convolution"));
        }
        Ok(())
    }

    /// Output pixels `pixels` of one fp32 image into `out` (their rows only), on this
    /// thread.
    fn f32_pixels(
        &self,
        g: &ConvGeometry,
        src: &[f32],
        pixels: Range<usize>,
        out: &mut [f32],
        col: &mut [f32],
        scratch: &mut [f32],
    ) -> Result<(), KernelError> {
        let Weights::F32 {
            packed,
            bias,
            min,
            max,
        } = &self.weights
        else {
            return Err(short("convolution"));
        };
        let serial = ThreadPool::serial();
        let (co, go, patch) = (g.out_channels(), g.group_out, g.patch_len());
        let clamp = clamp_of(*min, *max);
        let pointwise = g.is_pointwise();
        let mut p0 = pixels.start;
        while p0 < pixels.end {
            let nb = CONV_BLOCK_PIXELS.min(pixels.end - p0);
            let rows = &mut out[(p0 - pixels.start) * co..][..nb * co];
            for (grp, packed) in packed.iter().enumerate() {
                let (cols, grouped) = col
                    .split_at_mut_checked(if pointwise { 0 } else { nb * patch })
                    .ok_or_else(|| short("convolution im2col"))?;
                let a: &[f32] = if pointwise {
                    src.get(p0 * patch..(p0 + nb) * patch)
                        .ok_or_else(|| short("convolution input"))?
                } else {
                    if !conv::im2col_nhwc(g, src, grp, p0..p0 + nb, cols) {
                        return Err(short("convolution im2col"));
                    }
                    cols
                };
                let p = GemmF32 {
                    m: nb,
                    n: go,
                    k: patch,
                    a,
                    lda: patch,
                    b: RhsF32::Packed(packed),
                    bias: Some(&bias[grp * go..(grp + 1) * go]),
                    clamp,
                };
                if g.groups == 1 {
                    gemm_f32(&serial, &p, rows, scratch)?;
                } else {
                    let block = grouped
                        .get_mut(..nb * go)
                        .ok_or_else(|| short("convolution group block"))?;
                    gemm_f32(&serial, &p, block, scratch)?;
                    for (r, row) in block.chunks_exact(go.max(1)).enumerate() {
                        rows[r * co + grp * go..][..go].copy_from_slice(row);
                    }
                }
            }
            p0 += nb;
        }
        Ok(())
    }

    /// One int8 image: im2col blocks times the packed filter of each group (a pointwise
    /// convolution reads the image directly); `col` is f32 scratch reused as bytes.
    fn int8_image(
        &self,
        g: &ConvGeometry,
        pool: &ThreadPool,
        x: &[i8],
        out: &mut [i8],
        col: &mut [f32],
    ) -> Result<(), KernelError> {
        let Weights::Int8 {
            input_zero_point,
            groups,
            rq,
            group_rq,
        } = &self.weights
        else {
            return Err(short("convolution"));
        };
        let co = g.out_channels();
        let patch = g.patch_len();
        let stride = patch.div_ceil(4) * 4;
        let pixels = g.out_pixels();
        let zp = *input_zero_point as i8;
        if g.is_pointwise() {
            let w = groups.first().ok_or_else(|| short("convolution"))?;
            let rows = Qs8Rows {
                m: pixels,
                stride: patch,
                data: x,
            };
            return gemm_qs8_parallel(pool, &rows, w, rq, out, co).map_err(linalg);
        }
        // Each task of the pool takes a share of the output pixels and runs their
        // im2col blocks and products on its own scratch (the im2col is as much work as
        // a thin product: done once before a split product, it would not scale).
        let col = int8_mut(col);
        let block = IM2COL_BLOCK * stride;
        let threads = pool.threads().max(1);
        let per_task = pixels.div_ceil(threads).max(1);
        let tasks = pixels.div_ceil(per_task);
        if col.len() < tasks * block || out.len() < pixels * co {
            return Err(short("im2col scratch"));
        }
        let failed = AtomicBool::new(false);
        pool.for_each_chunk_mut_with_scratch(
            &mut out[..pixels * co],
            per_task * co,
            1,
            &mut col[..tasks * block],
            block,
            |t, out, col| {
                let first = t * per_task;
                let task = first..first + out.len() / co.max(1);
                let mut p0 = task.start;
                while p0 < task.end {
                    let nb = IM2COL_BLOCK.min(task.end - p0);
                    for (grp, (w, rq)) in groups.iter().zip(group_rq).enumerate() {
                        let col = &mut col[..nb * stride];
                        let done = im2col_qs8(g, x, zp, grp, p0..p0 + nb, col, stride) && {
                            let rows = Qs8Rows {
                                m: nb,
                                stride,
                                data: col,
                            };
                            out.get_mut((p0 - task.start) * co + grp * g.group_out..)
                                .is_some_and(|dst| gemm_qs8(&rows, w, rq, dst, co).is_ok())
                        };
                        if !done {
                            failed.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                    p0 += nb;
                }
            },
        );
        if failed.into_inner() {
            return Err(short("convolution"));
        }
        Ok(())
    }
}

/// im2col elements one task of an fp32 convolution needs: an im2col block (none when
/// pointwise) and, with several groups, a block of one group's outputs.
fn im2col_per_task(g: &ConvGeometry) -> usize {
    let patch = if g.is_pointwise() { 0 } else { g.patch_len() };
    let grouped = if g.groups > 1 { g.group_out } else { 0 };
    CONV_BLOCK_PIXELS * (patch + grouped)
}

/// GEMM scratch one task of an fp32 convolution needs.
fn gemm_scratch_per_task(g: &ConvGeometry, packed: &[PackedB]) -> usize {
    let Some(packed) = packed.first() else {
        return 0;
    };
    GemmF32 {
        m: CONV_BLOCK_PIXELS.min(g.out_pixels()),
        n: g.group_out,
        k: g.patch_len(),
        a: &[],
        lda: g.patch_len(),
        b: RhsF32::Packed(packed),
        bias: None,
        clamp: None,
    }
    .scratch_len(1)
}
