//! `_upsample_bilinear2d_aa`: bilinear resizing with antialiasing, as
//! `F.interpolate(..., mode="bilinear", antialias=True)`. Each output pixel averages
//! the input pixels under a triangle filter centered on it, widened by the
//! downscaling factor, with weights normalized to sum to 1.
//!
//! As the official portable kernel (`op_upsample_bilinear2d_aa.cpp`): per axis the
//! ratio `r` is `1 / scale` (the `scales_h`/`scales_w` pair when both are given, else
//! `out / in`), or `(in - 1) / (out - 1)` with `align_corners`; output `o` is centered
//! at `r (o + 0.5)` with support `max(r, 1)`; taps run from `trunc(center - support +
//! 0.5)` (at least 0) to `trunc(center + support + 0.5)` (at most `in`), weighted by
//! `max(0, 1 - |(i - center + 0.5) / max(r, 1)|)` over their total (the nearest pixel
//! alone when there is no tap or no weight). Weights are f32; sums run in f32 (f64 for
//! f64), tap by tap, rows outer, as upstream. Upstream also accepts integer inputs
//! and rounds f16/bf16 sums after each tap; here the input must be floating point and
//! f16/bf16 sums round once.

use etch_base::cast;

use crate::ops::elementwise::dtype::with_float;
use crate::ops::elementwise::num::Real;
use crate::ops::same_dtype;
use crate::ops::upsample::bilinear_ratio;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, Registry, Tensor};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::_upsample_bilinear2d_aa.out", upsample_bilinear2d_aa);
}

op_args! {
    /// `_upsample_bilinear2d_aa.out(Tensor self, SymInt[2] output_size, bool
    /// align_corners, float? scales_h=None, float? scales_w=None, *, Tensor(a!) out)`.
    struct AaArgs<'a> = "aten::_upsample_bilinear2d_aa.out" {
        input: Tensor,
        output_size: IntList<'a>,
        align_corners: bool,
        scales_h: Option<f64>,
        scales_w: Option<f64>,
        out: OutArg,
    } returns 1
}

/// The taps of one output index along one axis: inputs `start..end` and the weight
/// of each, or a single fallback input of weight 1.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Taps {
    start: usize,
    end: usize,
    center: f32,
    invscale: f32,
    total: f32,
    fallback: bool,
}

fn triangle(x: f32) -> f32 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

impl Taps {
    /// Output `o` of an axis of `in_size` inputs at ratio `r`.
    fn new(o: usize, r: f32, in_size: usize) -> Self {
        let center = r * (o as f32 + 0.5);
        let support = if r >= 1.0 { r } else { 1.0 };
        let invscale = if r >= 1.0 { 1.0 / r } else { 1.0 };
        // C's float-to-int conversion truncates toward zero.
        let lo = ((center - support + 0.5) as i64).max(0);
        let hi = ((center + support + 0.5) as i64).min(in_size as i64);
        let fallback = || {
            let i = (center as i64).clamp(0, in_size as i64 - 1) as usize;
            Taps {
                start: i,
                end: i + 1,
                center,
                invscale,
                total: 1.0,
                fallback: true,
            }
        };
        if hi <= lo {
            return fallback();
        }
        let (start, end) = (lo as usize, hi as usize);
        let mut total = 0.0f32;
        for i in start..end {
            total += triangle((i as f32 - center + 0.5) * invscale);
        }
        if total <= 0.0 {
            return fallback();
        }
        Taps {
            start,
            end,
            center,
            invscale,
            total,
            fallback: false,
        }
    }

    fn weight(&self, i: usize) -> f32 {
        if self.fallback {
            return 1.0;
        }
        triangle((i as f32 - self.center + 0.5) * self.invscale) / self.total
    }
}

/// As upstream: a 4-d input, `output_size` two positive sizes, out of the input's
/// dtype resized to `[N, C, out_h, out_w]`; both layouts (contiguous and channels
/// last) through the tensors' strides. An input with an empty plane gives an error
/// unless the output is empty.
fn upsample_bilinear2d_aa(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let AaArgs {
        input,
        output_size,
        align_corners,
        scales_h,
        scales_w,
        out,
    } = AaArgs::unpack(a)?;
    if input.rank() != 4 {
        return Err(KernelError::invalid(format!(
            "_upsample_bilinear2d_aa needs a 4-d input, got {:?}",
            input.sizes()
        )));
    }
    if output_size.len() != 2 {
        return Err(KernelError::invalid(format!(
            "_upsample_bilinear2d_aa: output_size has {} sizes, expected 2",
            output_size.len()
        )));
    }
    let (oh, ow) = (output_size.get(0)?, output_size.get(1)?);
    if oh <= 0 || ow <= 0 {
        return Err(KernelError::invalid(format!(
            "_upsample_bilinear2d_aa: output size [{oh}, {ow}] must be positive"
        )));
    }
    let (oh, ow) = (oh as usize, ow as usize);
    same_dtype(&input, &out.tensor())?;
    let [n, c, ih, iw] = [0, 1, 2, 3].map(|d| input.sizes()[d]);
    let out = out.resize(a, &[n, c, oh, ow])?;
    if out.numel() == 0 {
        return Ok(());
    }
    if ih == 0 || iw == 0 {
        return Err(KernelError::invalid(
            "_upsample_bilinear2d_aa: the input's planes are empty",
        ));
    }
    let (sh, sw) = match (scales_h, scales_w) {
        (Some(h), Some(w)) => (h, w),
        _ => (oh as f64 / ih as f64, ow as f64 / iw as f64),
    };
    let (rh, rw) = (
        bilinear_ratio(ih, oh, align_corners, sh),
        bilinear_ratio(iw, ow, align_corners, sw),
    );
    with_float!(input.dtype(), "_upsample_bilinear2d_aa", E, A => {
        let x = ctx.read::<E>(&input)?;
        let o = ctx.write::<E>(&out)?;
        resample::<E, A>(x, &input, o, &out, rh, rw)
    })
}

/// Fills every output pixel of `out` (sizes `[N, C, oh, ow]`) from `x`, both read
/// through their strides.
fn resample<E: etch_base::Element, A: Real>(
    x: &[E],
    input: &Tensor,
    o: &mut [E],
    out: &Tensor,
    rh: f32,
    rw: f32,
) -> Result<(), KernelError> {
    let (is, os) = (input.strides(), out.strides());
    let [n, c, ih, iw] = [0, 1, 2, 3].map(|d| input.sizes()[d]);
    let (oh, ow) = (out.sizes()[2], out.sizes()[3]);
    let last_in = (n - 1) * is[0] + (c - 1) * is[1] + (ih - 1) * is[2] + (iw - 1) * is[3];
    let last_out = (n - 1) * os[0] + (c - 1) * os[1] + (oh - 1) * os[2] + (ow - 1) * os[3];
    if last_in >= x.len() || last_out >= o.len() {
        return Err(KernelError::invalid(
            "_upsample_bilinear2d_aa: strides exceed the tensors' storage",
        ));
    }
    for b in 0..n {
        for y in 0..oh {
            let th = Taps::new(y, rh, ih);
            for xo in 0..ow {
                let tw = Taps::new(xo, rw, iw);
                for ch in 0..c {
                    let base = b * is[0] + ch * is[1];
                    let mut v = A::ZERO;
                    for i in th.start..th.end {
                        let wh = A::from_f32(th.weight(i));
                        for j in tw.start..tw.end {
                            let ww = A::from_f32(tw.weight(j));
                            let px = cast::<E, A>(x[base + i * is[2] + j * is[3]]);
                            v += px * wh * ww;
                        }
                    }
                    o[b * os[0] + ch * os[1] + y * os[2] + xo * os[3]] = cast::<A, E>(v);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;

    use super::{Taps, triangle};
    use crate::testing::Harness;

    /// The triangle-filter resampling of one axis, in f64, for a reference.
    fn weights(o: usize, r: f64, in_size: usize) -> Vec<(usize, f64)> {
        let center = r * (o as f64 + 0.5);
        let support = r.max(1.0);
        let lo = ((center - support + 0.5).trunc() as i64).max(0) as usize;
        let hi = ((center + support + 0.5).trunc() as i64).min(in_size as i64) as usize;
        let w: Vec<(usize, f64)> = (lo..hi)
            .map(|i| {
                (
                    i,
                    (1.0 - ((i as f64 - center + 0.5) / support).abs()).max(0.0),
                )
            })
            .collect();
        let total: f64 = w.iter().map(|p| p.1).sum();
        w.into_iter().map(|(i, v)| (i, v / total)).collect()
    }

    #[test]
    fn downscaling_averages_under_the_filter() {
        let (ih, iw, oh, ow) = (6usize, 7usize, 3usize, 2usize);
        let data: Vec<f32> = (0..2 * ih * iw)
            .map(|i| ((i * 37) % 23) as f32 - 11.0)
            .collect();
        let mut h = Harness::new();
        let x = h.tensor(&[1, 2, ih, iw], &data);
        let size = h.int_list(&[oh as i64, ow as i64]);
        let (f, none) = (h.bool(false), h.none());
        let out = h.out(ScalarType::Float, &[1, 2, oh, ow]);
        h.call(
            "aten::_upsample_bilinear2d_aa.out",
            &[x, size, f, none, none, out, out],
        )
        .unwrap();
        let got = h.read::<f32>(out);
        let (rh, rw) = (ih as f64 / oh as f64, iw as f64 / ow as f64);
        for c in 0..2 {
            for y in 0..oh {
                for xo in 0..ow {
                    let mut want = 0.0;
                    for (i, wh) in weights(y, rh, ih) {
                        for (j, ww) in weights(xo, rw, iw) {
                            want += data[(c * ih + i) * iw + j] as f64 * wh * ww;
                        }
                    }
                    let g = got[(c * oh + y) * ow + xo] as f64;
                    assert!((g - want).abs() < 1e-4, "{c} {y} {xo}: {g} vs {want}");
                }
            }
        }
    }

    #[test]
    fn upscaling_is_a_normalized_triangle_and_the_same_size_copies() {
        // Ratio 0.5: support 1, weights of the two nearest pixels.
        let t = Taps::new(1, 0.5, 4);
        assert_eq!((t.start, t.end), (0, 2));
        let sum: f32 = (t.start..t.end).map(|i| t.weight(i)).sum();
        assert!((sum - 1.0).abs() < 1e-6);
        assert_eq!(triangle(0.25), 0.75);
        // Same size: each output is its own pixel.
        let mut h = Harness::new();
        let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let x = h.tensor(&[1, 1, 3, 4], &data);
        let size = h.int_list(&[3, 4]);
        let (f, none) = (h.bool(false), h.none());
        let out = h.out(ScalarType::Float, &[1, 1, 3, 4]);
        let op = "aten::_upsample_bilinear2d_aa.out";
        h.call(op, &[x, size, f, none, none, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), data);
        // Bad sizes and dtypes.
        let zero = h.int_list(&[0, 4]);
        assert!(h.call(op, &[x, zero, f, none, none, out, out]).is_err());
        let three = h.int_list(&[3, 4, 1]);
        assert!(h.call(op, &[x, three, f, none, none, out, out]).is_err());
        let io = h.out(ScalarType::Int, &[1, 1, 3, 4]);
        assert!(h.call(op, &[x, size, f, none, none, io, io]).is_err());
    }
}
