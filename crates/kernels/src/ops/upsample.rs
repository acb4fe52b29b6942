//! 2-d upsampling of `[N, C, H, W]` f32 tensors (`.vec` overloads: an output size or
//! scale factors), one plane per task, following ExecuTorch's portable kernels:
//!
//! * `upsample_bilinear2d`: source coordinate `ratio * (o + 0.5) - 0.5` clamped at 0
//!   (or `ratio * o` with `align_corners`), in f32, with `ratio` from the scale factor
//!   (`1 / scale`), the sizes (`in / out`), or `(in - 1) / (out - 1)` with
//!   `align_corners`; an axis whose size does not change is copied.
//! * `upsample_nearest2d`: source `min(floor(o * ratio), in - 1)`.
//!
//! A scale factor gives the output size `floor(in * scale)`. The antialiased
//! `_upsample_bilinear2d_aa` is in `upsample/aa.rs`.

use etch_base::ScalarType;

mod aa;

use super::layout::{NchwOut, read_nchw};
use super::window::nchw_dims;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, GRAIN_SIZE, IntList, KernelContext, KernelError, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::upsample_bilinear2d.vec_out", upsample_bilinear2d);
    r.register("aten::upsample_nearest2d.vec_out", upsample_nearest2d);
    aa::register(r);
}

/// The output size and per-axis scale (`out / in`, or the given factor) of an
/// upsampling call.
struct Target {
    out_h: usize,
    out_w: usize,
    scale_h: f64,
    scale_w: f64,
}

/// Checks the input and the `output_size` / `scale_factors` pair (exactly one given)
/// and derives the target.
fn target(
    x: &Tensor,
    output_size: Option<IntList<'_>>,
    scale_factors: Option<&[f64]>,
) -> Result<Target, KernelError> {
    let (_, _, ih, iw) = nchw_dims(x, "upsample")?;
    if x.rank() != 4 || x.dtype() != ScalarType::Float {
        return Err(KernelError::invalid(format!(
            "upsample: expected a 4-d f32 input, got {:?} {}",
            x.sizes(),
            x.dtype()
        )));
    }
    let scales: Option<[f64; 2]> = match scale_factors {
        None => None,
        Some(&[h, w]) => Some([h, w]),
        Some(v) => {
            return Err(KernelError::invalid(format!(
                "upsample: scale_factors must be None or 2 floats, got {} floats",
                v.len()
            )));
        }
    };
    let t = match (output_size, scales) {
        (Some(s), None) if s.len() == 2 => {
            let (oh, ow) = (s.get(0)?, s.get(1)?);
            if oh <= 0 || ow <= 0 || ih == 0 || iw == 0 {
                return Err(KernelError::invalid(format!(
                    "upsample: output size [{oh}, {ow}] for input {:?}",
                    x.sizes()
                )));
            }
            Target {
                out_h: oh as usize,
                out_w: ow as usize,
                scale_h: oh as f64 / ih as f64,
                scale_w: ow as f64 / iw as f64,
            }
        }
        (None, Some([sh, sw])) => {
            let len = |i: usize, s: f64| {
                let v = i as f64 * s;
                (s.is_finite() && s > 0.0 && v >= 1.0 && v < (1u64 << 40) as f64)
                    .then_some(v as usize)
            };
            match (len(ih, sh), len(iw, sw)) {
                (Some(out_h), Some(out_w)) => Target {
                    out_h,
                    out_w,
                    scale_h: sh,
                    scale_w: sw,
                },
                _ => {
                    return Err(KernelError::invalid(format!(
                        "upsample: scale factors [{sh}, {sw}] give an empty output for {:?}",
                        x.sizes()
                    )));
                }
            }
        }
        _ => {
            return Err(KernelError::invalid(
                "upsample: exactly one of output_size (2 ints) and scale_factors must be given",
            ));
        }
    };
    Ok(t)
}

/// Resizes `out` to the target and checks it is an f32 tensor, contiguous or
/// channels-last.
fn out_for(a: &mut Args<'_>, out: OutArg, x: &Tensor, t: &Target) -> Result<Tensor, KernelError> {
    let s = x.sizes();
    let out = out.resize(a, &[s[0], s[1], t.out_h, t.out_w])?;
    if out.dtype() != ScalarType::Float {
        return Err(KernelError::UnsupportedDtype {
            dtype: out.dtype(),
            what: "upsample out (f32 only)",
        });
    }
    nchw_dims(&out, "upsample out")?;
    Ok(out)
}

/// Source indices and weights along one axis, as ExecuTorch's
/// `compute_source_index_and_lambda`: `(i0, i1, w0, w1)`.
fn bilinear_taps(
    ratio: f32,
    o: usize,
    in_size: usize,
    out_size: usize,
    align: bool,
) -> (usize, usize, f32, f32) {
    if in_size == out_size {
        return (o, o, 1.0, 0.0);
    }
    let real = if align {
        ratio * o as f32
    } else {
        (ratio * (o as f32 + 0.5) - 0.5).max(0.0)
    };
    let i0 = (real.floor() as usize).min(in_size - 1);
    let w1 = (real - i0 as f32).clamp(0.0, 1.0);
    let i1 = if i0 < in_size - 1 { i0 + 1 } else { i0 };
    (i0, i1, 1.0 - w1, w1)
}

/// The f32 ratio of one axis: ExecuTorch's `area_pixel_compute_scale` of the final
/// scale (the anti-aliased variant in `aa` uses it too).
fn bilinear_ratio(in_size: usize, out_size: usize, align: bool, scale: f64) -> f32 {
    if align {
        if out_size > 1 {
            ((in_size - 1) as f64 / (out_size - 1) as f64) as f32
        } else {
            0.0
        }
    } else {
        (1.0 / scale) as f32
    }
}

op_args! {
    /// `upsample_bilinear2d.vec_out(Tensor input, SymInt[]? output_size,
    /// bool align_corners, float[]? scale_factors, *, Tensor(a!) out)`.
    struct BilinearArgs<'a> = "aten::upsample_bilinear2d.vec_out" {
        input: Tensor,
        output_size: Option<IntList<'a>>,
        align_corners: bool,
        scale_factors: Option<&'a [f64]>,
        out: OutArg,
    } returns 1
}

fn upsample_bilinear2d(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let BilinearArgs {
        input: x,
        output_size,
        align_corners: align,
        scale_factors,
        out,
    } = BilinearArgs::unpack(a)?;
    let t = target(&x, output_size, scale_factors)?;
    let out = out_for(a, out, &x, &t)?;
    let (ih, iw) = (x.sizes()[2], x.sizes()[3]);
    let (oh, ow) = (t.out_h, t.out_w);
    let rh = bilinear_ratio(ih, oh, align, t.scale_h);
    let rw = bilinear_ratio(iw, ow, align, t.scale_w);
    let xs = read_nchw::<f32>(ctx, &x, "upsample_bilinear2d input")?;
    let mut staged = NchwOut::<f32>::new(ctx, &out, "upsample_bilinear2d out")?;
    let os = staged.data();
    let (in_plane, out_plane) = (ih * iw, oh * ow);
    if in_plane == 0 || os.len() != xs.len() / in_plane * out_plane {
        return Err(KernelError::invalid(
            "upsample_bilinear2d: unexpected storage length",
        ));
    }
    // Column taps once, in scratch.
    let col_i = ctx.scratch::<usize>(2 * ow)?;
    let col_w = ctx.scratch::<f32>(2 * ow)?;
    for o in 0..ow {
        let (i0, i1, w0, w1) = bilinear_taps(rw, o, iw, ow, align);
        col_i[2 * o] = i0;
        col_i[2 * o + 1] = i1;
        col_w[2 * o] = w0;
        col_w[2 * o + 1] = w1;
    }
    let (col_i, col_w): (&[usize], &[f32]) = (col_i, col_w);
    let plane = |pi: usize, o: &mut [f32]| {
        let src = &xs[pi * in_plane..(pi + 1) * in_plane];
        for y in 0..oh {
            let (y0, y1, wy0, wy1) = bilinear_taps(rh, y, ih, oh, align);
            let (top, bottom) = (&src[y0 * iw..(y0 + 1) * iw], &src[y1 * iw..(y1 + 1) * iw]);
            for (x, d) in o[y * ow..(y + 1) * ow].iter_mut().enumerate() {
                let (x0, x1) = (col_i[2 * x], col_i[2 * x + 1]);
                let (wx0, wx1) = (col_w[2 * x], col_w[2 * x + 1]);
                let t = top[x0] * wx0 + top[x1] * wx1;
                let b = bottom[x0] * wx0 + bottom[x1] * wx1;
                *d = t * wy0 + b * wy1;
            }
        }
    };
    let min = (GRAIN_SIZE / out_plane.max(1)).max(1);
    ctx.pool()
        .for_each_chunk_mut(os, out_plane.max(1), min, plane);
    staged.finish("upsample_bilinear2d out")
}

op_args! {
    /// `upsample_nearest2d.vec_out(Tensor input, SymInt[]? output_size,
    /// float[]? scale_factors, *, Tensor(a!) out)`.
    struct NearestArgs<'a> = "aten::upsample_nearest2d.vec_out" {
        input: Tensor,
        output_size: Option<IntList<'a>>,
        scale_factors: Option<&'a [f64]>,
        out: OutArg,
    } returns 1
}

fn upsample_nearest2d(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let NearestArgs {
        input: x,
        output_size,
        scale_factors,
        out,
    } = NearestArgs::unpack(a)?;
    let t = target(&x, output_size, scale_factors)?;
    let out = out_for(a, out, &x, &t)?;
    let (ih, iw) = (x.sizes()[2], x.sizes()[3]);
    let (oh, ow) = (t.out_h, t.out_w);
    let (rh, rw) = ((1.0 / t.scale_h) as f32, (1.0 / t.scale_w) as f32);
    let source = |o: usize, r: f32, n: usize| ((o as f32 * r).floor() as usize).min(n - 1);
    let xs = read_nchw::<f32>(ctx, &x, "upsample_nearest2d input")?;
    let mut staged = NchwOut::<f32>::new(ctx, &out, "upsample_nearest2d out")?;
    let os = staged.data();
    let (in_plane, out_plane) = (ih * iw, oh * ow);
    if in_plane == 0 || os.len() != xs.len() / in_plane * out_plane {
        return Err(KernelError::invalid(
            "upsample_nearest2d: unexpected storage length",
        ));
    }
    let col = ctx.scratch::<usize>(ow)?;
    for (o, c) in col.iter_mut().enumerate() {
        *c = source(o, rw, iw);
    }
    let col: &[usize] = col;
    let plane = |pi: usize, o: &mut [f32]| {
        let src = &xs[pi * in_plane..(pi + 1) * in_plane];
        for y in 0..oh {
            let row = &src[source(y, rh, ih) * iw..][..iw];
            for (d, &c) in o[y * ow..(y + 1) * ow].iter_mut().zip(col) {
                *d = row[c];
            }
        }
    };
    let min = (GRAIN_SIZE / out_plane.max(1)).max(1);
    ctx.pool()
        .for_each_chunk_mut(os, out_plane.max(1), min, plane);
    staged.finish("upsample_nearest2d out")
}

#[cfg(test)]
mod tests;
