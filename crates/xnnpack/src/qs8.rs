//! The static int8 nodes of PT2E-quantized CNNs (XNNPACKQuantizer: `qint8` activations
//! per tensor, `qcint8` weights per output channel, `qcint32` biases): their parameters
//! as XNNPACK derives them at operator creation, and their execution.
//!
//! A qint8 value occupies its arena slot as int8 bytes packed four to an f32 word.
//! Every node reproduces XNNPACK's integer arithmetic and its one f32 rounding step
//! (`etch_linalg::quant::qs8`), so outputs match the official runtime's exactly.

use etch_kernels::{KernelError, ThreadPool};
use etch_linalg::conv::ConvGeometry;
use etch_linalg::quant::qs8::{
    Qs8Requant, Qs8Rows, Qs8Weights, depthwise_conv2d_qs8, gemm_qs8_parallel, im2col_qs8,
};

use crate::nodes::quantized::TensorQuant;

fn short(what: &str) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {what}: operand too short"))
}

fn linalg(e: etch_linalg::LinalgError) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {e}"))
}

/// `GlobalAvgPooling2d` on qint8: XNNPACK's mean reduction (google/XNNPACK
/// `src/operators/reduce-nd.c`, `xnn_init_qs8_reduce_scalar_params` and
/// `xnn_update_qs8_reduce_scalar_params`, the int32 -> qint8 reference convert of
/// `src/reference/unary-elementwise.cc`): the int32 sum `S` of `n` inputs becomes
/// `rint(S · s + z)` with `s = (s_in / s_out) · (1 / n)` and
/// `z = zp_out - (n · zp_in) · s`, saturated, then clamped to the node's range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Qs8MeanParams {
    pub input: TensorQuant,
    pub output: TensorQuant,
    pub min: i8,
    pub max: i8,
}

/// The quantized part of a convolution node.
#[derive(Debug, Clone)]
pub struct Qs8Conv {
    pub input_zero_point: i32,
    /// Grouped convolutions: one packed GEMM operand per group (`[group_out, patch]`).
    pub groups: Vec<Qs8Weights>,
    /// Depthwise: the filter `[kh, kw, channels]` and int32 bias.
    pub dw_filter: Vec<i8>,
    pub dw_bias: Vec<i32>,
    pub rq: Qs8Requant,
    /// Per group, its slice of the requantization (grouped convolutions).
    pub group_rq: Vec<Qs8Requant>,
}

fn bytes(words: &[f32]) -> &[i8] {
    bytemuck::cast_slice(words)
}

fn bytes_mut(words: &mut [f32]) -> &mut [i8] {
    bytemuck::cast_slice_mut(words)
}

/// Max pooling of one int8 NHWC image (padding ignored), clamped to `[min, max]`.
pub fn max_pool(
    g: &etch_linalg::pool::PoolGeometry,
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

/// Global average pooling of `batch` int8 images of `pixels x channels`.
pub fn mean(
    p: &Qs8MeanParams,
    batch: usize,
    pixels: usize,
    channels: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let x = bytes(x)
        .get(..batch * pixels * channels)
        .ok_or_else(|| short("global average pooling"))?;
    let out = bytes_mut(out)
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

/// A convolution of one int8 NHWC image: im2col blocks times the packed filter of each
/// group, or the direct depthwise kernel; `col` is f32 scratch reused as bytes.
pub fn convolution(
    g: &ConvGeometry,
    q: &Qs8Conv,
    depthwise: bool,
    pool: &ThreadPool,
    x: &[i8],
    out: &mut [i8],
    col: &mut [f32],
) -> Result<(), KernelError> {
    let co = g.out_channels();
    if depthwise {
        let row = g.out_w * co;
        let rows = g.out_h.div_ceil(pool.threads()).max(1);
        let ok = std::sync::atomic::AtomicBool::new(true);
        pool.for_each_chunk_mut(out, rows * row.max(1), 1, |i, chunk| {
            let r0 = i * rows;
            let r1 = (r0 + chunk.len() / row.max(1)).min(g.out_h);
            if !depthwise_conv2d_qs8(
                g,
                x,
                q.input_zero_point,
                &q.dw_filter,
                &q.dw_bias,
                &q.rq,
                r0..r1,
                chunk,
            ) {
                ok.store(false, std::sync::atomic::Ordering::Relaxed);
            }
        });
        return if ok.into_inner() {
            Ok(())
        } else {
            Err(short("depthwise convolution"))
        };
    }
    let patch = g.patch_len();
    let stride = patch.div_ceil(4) * 4;
    let pixels = g.out_pixels();
    let zp = q.input_zero_point as i8;
    // Pointwise convolutions read the image directly.
    if g.is_pointwise() {
        let w = q.groups.first().ok_or_else(|| short("convolution"))?;
        let rows = Qs8Rows {
            m: pixels,
            stride: patch,
            data: x,
        };
        return gemm_qs8_parallel(pool, &rows, w, &q.rq, out, co).map_err(linalg);
    }
    let col = bytes_mut(col);
    let block = crate::exec::IM2COL_BLOCK;
    if col.len() < block * stride {
        return Err(short("im2col scratch"));
    }
    let col = &mut col[..block * stride];
    let mut p0 = 0;
    while p0 < pixels {
        let nb = block.min(pixels - p0);
        for (grp, (w, rq)) in q.groups.iter().zip(&q.group_rq).enumerate() {
            if !im2col_qs8(g, x, zp, grp, p0..p0 + nb, &mut col[..nb * stride], stride) {
                return Err(short("im2col"));
            }
            let rows = Qs8Rows {
                m: nb,
                stride,
                data: &col[..nb * stride],
            };
            let dst = out
                .get_mut(p0 * co + grp * g.group_out..)
                .ok_or_else(|| short("convolution"))?;
            gemm_qs8_parallel(pool, &rows, w, rq, dst, co).map_err(linalg)?;
        }
        p0 += nb;
    }
    Ok(())
}
