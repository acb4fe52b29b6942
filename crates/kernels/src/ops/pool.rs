//! 2-d pooling of `[N, C, H, W]` / `[C, H, W]` f32 tensors, one plane per task:
//!
//! * `max_pool2d_with_indices`: the window's largest value (the first of equal ones;
//!   NaN only when the window starts with it, as ExecuTorch's portable kernel) and its
//!   flat index `iy * W + ix` in the input plane;
//! * `avg_pool2d`: the window's sum over in-bounds values divided by
//!   `divisor_override`, or by the window size clipped to the padded input
//!   (`count_include_pad`) or to the input;
//! * `_adaptive_avg_pool2d`: the mean of rows `floor(o * H / OH) .. ceil((o + 1) * H /
//!   OH)` and likewise for columns.
//!
//! Output sizes follow PyTorch (`ceil_mode` included, see [`super::window`]).

use etch_base::ScalarType;
use etch_linalg::conv::ConvGeometry;
use etch_linalg::conv_nchw::{PlaneMaxPool, plane_scratch_len};

use super::f32_only;
use super::layout::{NchwOut, read_nchw};
use super::window::{nchw_dims, output_len, spatial_list};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, GRAIN_SIZE, IntList, KernelContext, KernelError, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::max_pool2d_with_indices.out", max_pool2d_with_indices);
    r.register("aten::avg_pool2d.out", avg_pool2d);
    r.register("aten::_adaptive_avg_pool2d.out", adaptive_avg_pool2d);
}

/// A 2-d pooling window over one plane.
#[derive(Debug, Clone, Copy)]
struct Window {
    in_h: usize,
    in_w: usize,
    out_h: usize,
    out_w: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
}

/// The output shape: the input's with its last two dims replaced.
fn pooled_shape(x: &Tensor, oh: usize, ow: usize) -> ([usize; 4], usize) {
    let mut s = [0usize; 4];
    let r = x.rank();
    s[..r].copy_from_slice(x.sizes());
    s[r - 2] = oh;
    s[r - 1] = ow;
    (s, r)
}

/// The `kernel_size`, `stride`, `padding` (and `dilation`) arguments of a pooling
/// call.
struct WindowLists<'a> {
    kernel_size: IntList<'a>,
    stride: IntList<'a>,
    padding: IntList<'a>,
    /// `None` for an op without dilation (a dilation of 1).
    dilation: Option<IntList<'a>>,
}

/// Checks the window arguments of a pooling call over `x` and derives its window.
fn window(
    lists: &WindowLists<'_>,
    x: &Tensor,
    ceil_mode: bool,
    what: &str,
) -> Result<Window, KernelError> {
    let (_, _, ih, iw) = nchw_dims(x, what)?;
    let k = spatial_list::<2>(&lists.kernel_size, 2, None, 1, "kernel_size")?;
    let default_stride = Some([k[0] as i64, k[1] as i64]);
    let s = spatial_list::<2>(&lists.stride, 2, default_stride, 1, "stride")?;
    let p = spatial_list::<2>(&lists.padding, 2, Some([0, 0]), 0, "padding")?;
    let d = match &lists.dilation {
        Some(list) => spatial_list::<2>(list, 2, Some([1, 1]), 1, "dilation")?,
        None => [1, 1],
    };
    if p[0] > k[0] / 2 || p[1] > k[1] / 2 {
        return Err(KernelError::invalid(format!(
            "{what}: padding {p:?} must be at most half the kernel {k:?}"
        )));
    }
    let oh = output_len(ih, k[0], s[0], p[0], d[0], ceil_mode);
    let ow = output_len(iw, k[1], s[1], p[1], d[1], ceil_mode);
    match (oh, ow) {
        (Some(out_h), Some(out_w)) if out_h > 0 && out_w > 0 => Ok(Window {
            in_h: ih,
            in_w: iw,
            out_h,
            out_w,
            k,
            s,
            p,
            d,
        }),
        _ => Err(KernelError::invalid(format!(
            "{what}: kernel {k:?} does not fit input {:?} with padding {p:?}",
            x.sizes()
        ))),
    }
}

/// Runs `f(plane_index, out_plane)` over the output planes in parallel.
fn planes<T: Send>(
    ctx: &KernelContext<'_>,
    out: &mut [T],
    plane: usize,
    work_per_plane: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if plane == 0 {
        return;
    }
    let min = (GRAIN_SIZE / work_per_plane.max(1)).max(1);
    ctx.pool().for_each_chunk_mut(out, plane, min, f);
}

op_args! {
    /// `max_pool2d_with_indices.out(Tensor self, int[2] kernel_size, int[2] stride=[],
    /// int[2] padding=0, int[2] dilation=1, bool ceil_mode=False, *, Tensor(a!) out,
    /// Tensor(b!) indices) -> (Tensor(a!), Tensor(b!))`, returning both outs (one
    /// TensorList slot).
    struct MaxPoolArgs<'a> = "aten::max_pool2d_with_indices.out" {
        input: Tensor,
        kernel_size: IntList<'a>,
        stride: IntList<'a>,
        padding: IntList<'a>,
        dilation: IntList<'a>,
        ceil_mode: bool,
        out: OutArg,
        indices: OutArg,
    } returns 1
}

fn max_pool2d_with_indices(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let MaxPoolArgs {
        input: x,
        kernel_size,
        stride,
        padding,
        dilation,
        ceil_mode,
        out,
        indices,
    } = MaxPoolArgs::unpack(a)?;
    f32_only(&x, "max_pool2d (f32 only)")?;
    let lists = WindowLists {
        kernel_size,
        stride,
        padding,
        dilation: Some(dilation),
    };
    let w = window(&lists, &x, ceil_mode, "max_pool2d")?;
    let (shape, rank) = pooled_shape(&x, w.out_h, w.out_w);
    let out = out.resize(a, &shape[..rank])?;
    let idx = indices.resize(a, &shape[..rank])?;
    f32_only(&out, "max_pool2d out (f32 only)")?;
    if idx.dtype() != ScalarType::Long {
        return Err(KernelError::UnsupportedDtype {
            dtype: idx.dtype(),
            what: "max_pool2d indices (int64 only)",
        });
    }
    nchw_dims(&out, "max_pool2d out")?;
    nchw_dims(&idx, "max_pool2d indices")?;
    let xs = read_nchw::<f32>(ctx, &x, "max_pool2d input")?;
    let mut staged_out = NchwOut::<f32>::new(ctx, &out, "max_pool2d out")?;
    let g = w.geometry();
    let (in_plane, out_plane) = (w.in_h * w.in_w, w.out_h * w.out_w);
    if ctx.epilogue().indices_unread {
        // Nothing reads the indices (arranged at load): the values alone.
        let os = staged_out.data();
        if os.len() != (xs.len() / in_plane.max(1)) * out_plane {
            return Err(KernelError::invalid(
                "max_pool2d: unexpected storage length",
            ));
        }
        let fast = PlaneMaxPool::new(&g, 0);
        planes(ctx, os, out_plane, out_plane * w.k[0] * w.k[1], |pi, o| {
            let src = &xs[pi * in_plane..(pi + 1) * in_plane];
            if !fast.run_values(src, o) {
                for (oy, row) in o.chunks_mut(w.out_w.max(1)).enumerate() {
                    max_values_row(&w, src, oy, row);
                }
            }
        });
        return staged_out.finish("max_pool2d out");
    }
    let mut staged_idx = NchwOut::<i64>::new(ctx, &idx, "max_pool2d indices")?;
    let (os, is) = (staged_out.data(), staged_idx.data());
    let n_planes = xs.len() / in_plane.max(1);
    if os.len() != n_planes * out_plane || is.len() != os.len() {
        return Err(KernelError::invalid(
            "max_pool2d: unexpected storage length",
        ));
    }
    // Indices first, then each value gathered at its index: two passes, each splitting
    // one slice over the pool, and the windows compared once. The polyphase kernel
    // decides a plane when it can (no NaN, every window above -inf); the row walk
    // otherwise.
    let per_task = plane_scratch_len(&g);
    let scratch = ctx.scratch_dirty::<f32>(per_task * ctx.pool().threads())?;
    let fast = PlaneMaxPool::new(&g, per_task);
    if out_plane > 0 {
        let min = (GRAIN_SIZE / (out_plane * w.k[0] * w.k[1]).max(1)).max(1);
        let indices_of = |pi: usize, ix: &mut [i64], scratch: &mut [f32]| {
            let src = &xs[pi * in_plane..(pi + 1) * in_plane];
            if !fast.run(src, ix, scratch) {
                for (oy, row) in ix.chunks_mut(w.out_w.max(1)).enumerate() {
                    max_indices_row(&w, src, oy, row);
                }
            }
        };
        ctx.pool()
            .for_each_chunk_mut_with_scratch(is, out_plane, min, scratch, per_task, indices_of);
    }
    let is: &[i64] = is;
    planes(ctx, os, out_plane, out_plane, |pi, o| {
        let src = &xs[pi * in_plane..(pi + 1) * in_plane];
        let ix = &is[pi * out_plane..(pi + 1) * out_plane];
        for (o, &i) in o.iter_mut().zip(ix) {
            // -1 (a window with no tap inside the input) reads as -inf.
            *o = usize::try_from(i)
                .ok()
                .and_then(|i| src.get(i))
                .copied()
                .unwrap_or(f32::NEG_INFINITY);
        }
    });
    staged_out.finish("max_pool2d out")?;
    staged_idx.finish("max_pool2d indices")
}

/// The maximum of each window of output row `oy`, compared as [`max_indices_row`]
/// compares (`-inf` for a window with no tap inside the input): the value at the index
/// it would write.
fn max_values_row(w: &Window, src: &[f32], oy: usize, out: &mut [f32]) {
    for (ox, o) in out.iter_mut().enumerate() {
        *o = window_max(w, src, oy, ox).map_or(f32::NEG_INFINITY, |(v, _)| v);
    }
}

/// The input index of the maximum of each window of output row `oy` (-1 for a window
/// with no tap inside the input).
fn max_indices_row(w: &Window, src: &[f32], oy: usize, out: &mut [i64]) {
    for (ox, o) in out.iter_mut().enumerate() {
        *o = window_max(w, src, oy, ox).map_or(-1, |(_, at)| at as i64);
    }
}

/// The maximum of window `(oy, ox)` and its flat input index; `None` for a window with
/// no tap inside the input. Taps are read row by row, left to right, and the first of
/// equal maxima wins (a NaN wins only as the first tap).
fn window_max(w: &Window, src: &[f32], oy: usize, ox: usize) -> Option<(f32, usize)> {
    let mut best: Option<(f32, usize)> = None;
    for ky in w.taps_inside(0, oy) {
        let iy = oy * w.s[0] + ky * w.d[0] - w.p[0];
        for kx in w.taps_inside(1, ox) {
            let at = iy * w.in_w + ox * w.s[1] + kx * w.d[1] - w.p[1];
            let v = src[at];
            if best.is_none_or(|(b, _)| v > b) {
                best = Some((v, at));
            }
        }
    }
    best
}

impl Window {
    /// The window as the geometry of a one-channel convolution (for the polyphase
    /// kernel).
    fn geometry(&self) -> ConvGeometry {
        ConvGeometry {
            in_h: self.in_h,
            in_w: self.in_w,
            out_h: self.out_h,
            out_w: self.out_w,
            kernel_h: self.k[0],
            kernel_w: self.k[1],
            stride_h: self.s[0],
            stride_w: self.s[1],
            dilation_h: self.d[0].max(1),
            dilation_w: self.d[1].max(1),
            pad_top: self.p[0],
            pad_left: self.p[1],
            groups: 1,
            group_in: 1,
            group_out: 1,
        }
    }

    /// The taps `k` of `axis` (0: rows, 1: columns) whose input coordinate
    /// `o * stride + k * dilation - pad` for output `o` lies inside the input.
    fn taps_inside(&self, axis: usize, o: usize) -> std::ops::Range<usize> {
        let (stride, dilation, pad) = (self.s[axis], self.d[axis].max(1), self.p[axis]);
        let size = if axis == 0 { self.in_h } else { self.in_w };
        let start = o * stride;
        // First tap at or past the padding; first tap past the input's far edge.
        let lo = pad.saturating_sub(start).div_ceil(dilation);
        let hi = (size + pad).saturating_sub(start).div_ceil(dilation);
        let lo = lo.min(self.k[axis]);
        lo..hi.clamp(lo, self.k[axis])
    }
}

op_args! {
    /// `avg_pool2d.out(Tensor self, int[2] kernel_size, int[2] stride=[],
    /// int[2] padding=0, bool ceil_mode=False, bool count_include_pad=True,
    /// int? divisor_override=None, *, Tensor(a!) out)`.
    struct AvgPoolArgs<'a> = "aten::avg_pool2d.out" {
        input: Tensor,
        kernel_size: IntList<'a>,
        stride: IntList<'a>,
        padding: IntList<'a>,
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: Option<i64>,
        out: OutArg,
    } returns 1
}

fn avg_pool2d(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let AvgPoolArgs {
        input: x,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad: include_pad,
        divisor_override: divisor,
        out,
    } = AvgPoolArgs::unpack(a)?;
    f32_only(&x, "avg_pool2d (f32 only)")?;
    if divisor == Some(0) {
        return Err(KernelError::invalid(
            "avg_pool2d: divisor_override must not be 0",
        ));
    }
    let lists = WindowLists {
        kernel_size,
        stride,
        padding,
        dilation: None,
    };
    let w = window(&lists, &x, ceil_mode, "avg_pool2d")?;
    let (shape, rank) = pooled_shape(&x, w.out_h, w.out_w);
    let out = out.resize(a, &shape[..rank])?;
    f32_only(&out, "avg_pool2d out (f32 only)")?;
    nchw_dims(&out, "avg_pool2d out")?;
    let xs = read_nchw::<f32>(ctx, &x, "avg_pool2d input")?;
    let mut staged = NchwOut::<f32>::new(ctx, &out, "avg_pool2d out")?;
    let os = staged.data();
    let (in_plane, out_plane) = (w.in_h * w.in_w, w.out_h * w.out_w);
    if os.len() != (xs.len() / in_plane.max(1)) * out_plane {
        return Err(KernelError::invalid(
            "avg_pool2d: unexpected storage length",
        ));
    }
    planes(ctx, os, out_plane, out_plane * w.k[0] * w.k[1], |pi, o| {
        let src = &xs[pi * in_plane..(pi + 1) * in_plane];
        for oy in 0..w.out_h {
            // Rows of the window: clipped to the padded input for the count, to the
            // input for the sum.
            let y0 = (oy * w.s[0]) as i64 - w.p[0] as i64;
            let y1 = (y0 + w.k[0] as i64).min((w.in_h + w.p[0]) as i64);
            let (ys, ye) = (y0.max(0) as usize, y1.min(w.in_h as i64).max(0) as usize);
            for ox in 0..w.out_w {
                let x0 = (ox * w.s[1]) as i64 - w.p[1] as i64;
                let x1 = (x0 + w.k[1] as i64).min((w.in_w + w.p[1]) as i64);
                let (xs0, xe) = (x0.max(0) as usize, x1.min(w.in_w as i64).max(0) as usize);
                let o = &mut o[oy * w.out_w + ox];
                if ys >= ye || xs0 >= xe {
                    *o = 0.0;
                    continue;
                }
                let mut sum = 0f32;
                for iy in ys..ye {
                    for &v in &src[iy * w.in_w + xs0..iy * w.in_w + xe] {
                        sum += v;
                    }
                }
                let count = match divisor {
                    Some(d) => d as f32,
                    None if include_pad => ((y1 - y0) * (x1 - x0)) as f32,
                    None => ((ye - ys) * (xe - xs0)) as f32,
                };
                *o = sum / count;
            }
        }
    });
    staged.finish("avg_pool2d out")
}

op_args! {
    /// `_adaptive_avg_pool2d.out(Tensor self, SymInt[2] output_size, *,
    /// Tensor(a!) out)`.
    struct AdaptiveAvgPoolArgs<'a> = "aten::_adaptive_avg_pool2d.out" {
        input: Tensor,
        output_size: IntList<'a>,
        out: OutArg,
    } returns 1
}

fn adaptive_avg_pool2d(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let AdaptiveAvgPoolArgs {
        input: x,
        output_size,
        out,
    } = AdaptiveAvgPoolArgs::unpack(a)?;
    f32_only(&x, "adaptive_avg_pool2d (f32 only)")?;
    let (_, _, ih, iw) = nchw_dims(&x, "adaptive_avg_pool2d")?;
    let size = spatial_list::<2>(&output_size, 2, None, 1, "adaptive_avg_pool2d output_size")?;
    let (oh, ow) = (size[0], size[1]);
    let (shape, rank) = pooled_shape(&x, oh, ow);
    let out = out.resize(a, &shape[..rank])?;
    f32_only(&out, "adaptive_avg_pool2d out (f32 only)")?;
    nchw_dims(&out, "adaptive_avg_pool2d out")?;
    let xs = read_nchw::<f32>(ctx, &x, "adaptive_avg_pool2d input")?;
    let mut staged = NchwOut::<f32>::new(ctx, &out, "adaptive_avg_pool2d out")?;
    let os = staged.data();
    let (in_plane, out_plane) = (ih * iw, oh * ow);
    if in_plane == 0 || os.len() != (xs.len() / in_plane) * out_plane {
        return Err(KernelError::invalid(
            "adaptive_avg_pool2d: empty input or unexpected storage length",
        ));
    }
    let start = |o: usize, out: usize, inp: usize| (o * inp) / out;
    let end = |o: usize, out: usize, inp: usize| ((o + 1) * inp).div_ceil(out);
    planes(ctx, os, out_plane, in_plane, |pi, o| {
        let src = &xs[pi * in_plane..(pi + 1) * in_plane];
        for oy in 0..oh {
            let (y0, y1) = (start(oy, oh, ih), end(oy, oh, ih));
            for ox in 0..ow {
                let (x0, x1) = (start(ox, ow, iw), end(ox, ow, iw));
                let mut sum = 0f32;
                for iy in y0..y1 {
                    for &v in &src[iy * iw + x0..iy * iw + x1] {
                        sum += v;
                    }
                }
                o[oy * ow + ox] = sum / ((y1 - y0) * (x1 - x0)) as f32;
            }
        }
    });
    staged.finish("adaptive_avg_pool2d out")
}

#[cfg(test)]
mod tests;
