//! 2-D convolutions over NHWC activations: the geometry, im2col (so a convolution is
//! a GEMM against OHWI filters, which are already `[out_channels, kh * kw * in]`
//! rows), a direct depthwise kernel, a transposed convolution, and a direct scalar
//! reference the others are tested against.

use std::ops::Range;

use crate::Isa;

/// Geometry of one 2-D convolution over an NHWC image (batch handled by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConvGeometry {
    /// Input height, width.
    pub in_h: usize,
    pub in_w: usize,
    /// Output height, width.
    pub out_h: usize,
    pub out_w: usize,
    /// Kernel height, width.
    pub kernel_h: usize,
    pub kernel_w: usize,
    /// Strides.
    pub stride_h: usize,
    pub stride_w: usize,
    /// Dilations.
    pub dilation_h: usize,
    pub dilation_w: usize,
    /// Padding before the first row and column (the rest is implied by the output size).
    pub pad_top: usize,
    pub pad_left: usize,
    /// Groups; channels per group in and out. For a depthwise convolution `groups` is
    /// the number of input channels and `group_out` the depth multiplier.
    pub groups: usize,
    pub group_in: usize,
    pub group_out: usize,
}

impl ConvGeometry {
    /// A `kernel_h x kernel_w` convolution over an `in_h x in_w` image with the same
    /// stride and the same padding (before and after) on both axes and no dilation, the
    /// output as large as they allow; `(groups, group_in, group_out)` channels.
    pub fn same_on_both_axes(
        (in_h, in_w): (usize, usize),
        (kernel_h, kernel_w): (usize, usize),
        (stride, pad): (usize, usize),
        (groups, group_in, group_out): (usize, usize, usize),
    ) -> ConvGeometry {
        let stride = stride.max(1);
        let out = |size: usize, k: usize| (size + 2 * pad).saturating_sub(k) / stride + 1;
        ConvGeometry {
            in_h,
            in_w,
            out_h: out(in_h, kernel_h),
            out_w: out(in_w, kernel_w),
            kernel_h,
            kernel_w,
            stride_h: stride,
            stride_w: stride,
            dilation_h: 1,
            dilation_w: 1,
            pad_top: pad,
            pad_left: pad,
            groups,
            group_in,
            group_out,
        }
    }

    /// Input channels of the image.
    pub fn in_channels(&self) -> usize {
        self.groups * self.group_in
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.groups * self.group_out
    }

    /// Length of one im2col row: `kernel_h * kernel_w * group_in`.
    pub fn patch_len(&self) -> usize {
        self.kernel_h * self.kernel_w * self.group_in
    }

    /// Output pixels of one image.
    pub fn out_pixels(&self) -> usize {
        self.out_h * self.out_w
    }

    /// Whether the slices hold one whole NHWC image, a filter of `out_channels` rows of
    /// `patch_len`, a bias per output channel and the whole NHWC output.
    fn fits(&self, input: &[f32], filter: &[f32], bias: &[f32], output: &[f32]) -> bool {
        let co = self.out_channels();
        input.len() >= self.in_h * self.in_w * self.in_channels()
            && filter.len() >= co * self.patch_len()
            && bias.len() >= co
            && output.len() >= self.out_pixels() * co
    }

    /// True when im2col would copy the input unchanged (1x1, stride 1, no padding, one group).
    pub fn is_pointwise(&self) -> bool {
        self.kernel_h == 1
            && self.kernel_w == 1
            && self.stride_h == 1
            && self.stride_w == 1
            && self.pad_top == 0
            && self.pad_left == 0
            && self.groups == 1
            && self.in_h == self.out_h
            && self.in_w == self.out_w
    }

    /// Output rows `rows` of each plane as a geometry of their own, with the input row
    /// it starts reading at: a plane kernel run on that geometry, over the input plane
    /// from that row on, writes the band's rows of the whole plane's output, each
    /// value as the whole plane's run computes it (the band's padding above is what
    /// of `pad_top` lies above its first input row).
    pub fn row_band(&self, rows: Range<usize>) -> (ConvGeometry, usize) {
        let top = rows.start * self.stride_h;
        let first = top.saturating_sub(self.pad_top).min(self.in_h);
        let band = ConvGeometry {
            in_h: self.in_h - first,
            out_h: rows.len(),
            pad_top: self.pad_top.saturating_sub(top),
            ..*self
        };
        (band, first)
    }

    /// The input row output row `oy` reads at kernel row `ky`, if inside the image.
    #[inline(always)]
    pub(crate) fn source_row(&self, oy: usize, ky: usize) -> Option<usize> {
        let (stride, dilation) = (self.stride_h, self.dilation_h);
        window_coord(oy, ky, stride, dilation, self.pad_top, self.in_h)
    }

    /// The input column output column `ox` reads at kernel column `kx`, if inside.
    #[inline(always)]
    pub(crate) fn source_col(&self, ox: usize, kx: usize) -> Option<usize> {
        let (stride, dilation) = (self.stride_w, self.dilation_w);
        window_coord(ox, kx, stride, dilation, self.pad_left, self.in_w)
    }

    /// The output row of a transposed convolution that input row `iy` adds to at kernel
    /// row `ky`, if inside the output.
    pub(crate) fn target_row(&self, iy: usize, ky: usize) -> Option<usize> {
        let (stride, dilation) = (self.stride_h, self.dilation_h);
        window_coord(iy, ky, stride, dilation, self.pad_top, self.out_h)
    }

    /// The output column of a transposed convolution that input column `ix` adds to at
    /// kernel column `kx`, if inside the output.
    pub(crate) fn target_col(&self, ix: usize, kx: usize) -> Option<usize> {
        let (stride, dilation) = (self.stride_w, self.dilation_w);
        window_coord(ix, kx, stride, dilation, self.pad_left, self.out_w)
    }

    /// Calls `f(pixel, tap)` for every kernel tap of output pixel `(oy, ox)` that reads
    /// inside the input: `pixel = iy * in_w + ix` is the input pixel it reads and
    /// `tap = ky * kernel_w + kx` the filter tap.
    #[inline(always)]
    pub(crate) fn for_each_tap(&self, oy: usize, ox: usize, f: impl FnMut(usize, usize)) {
        self.for_each_window_tap((oy, ox), (self.in_h, self.in_w), f);
    }

    /// Calls `f(pixel, tap)` for every kernel tap through which input pixel `(iy, ix)` of
    /// a transposed convolution lands inside the output: `pixel = oy * out_w + ox` is
    /// the output pixel it adds to and `tap = ky * kernel_w + kx` the filter tap.
    #[inline(always)]
    pub(crate) fn for_each_target(&self, iy: usize, ix: usize, f: impl FnMut(usize, usize)) {
        self.for_each_window_tap((iy, ix), (self.out_h, self.out_w), f);
    }

    /// Calls `f(pixel, tap)` for every kernel tap `tap = ky * kernel_w + kx` at which the
    /// window placed at `(y, x)` reaches inside a `height x width` plane, with `pixel`
    /// the plane pixel it reaches, row-major: the walk of both [`Self::for_each_tap`]
    /// (the input a convolution reads) and [`Self::for_each_target`] (the output a
    /// transposed convolution writes).
    #[inline(always)]
    fn for_each_window_tap(
        &self,
        (y, x): (usize, usize),
        (height, width): (usize, usize),
        mut f: impl FnMut(usize, usize),
    ) {
        let (stride_h, dilation_h) = (self.stride_h, self.dilation_h);
        let (stride_w, dilation_w) = (self.stride_w, self.dilation_w);
        for ky in 0..self.kernel_h {
            let Some(py) = window_coord(y, ky, stride_h, dilation_h, self.pad_top, height) else {
                continue;
            };
            for kx in 0..self.kernel_w {
                if let Some(px) = window_coord(x, kx, stride_w, dilation_w, self.pad_left, width) {
                    f(py * width + px, ky * self.kernel_w + kx);
                }
            }
        }
    }
}

/// The coordinate `at * stride + tap * dilation - pad` a sliding window at `at` reaches
/// with tap `tap`, if inside `0..size` (the input a convolution or pooling window reads,
/// or the output a transposed convolution writes).
#[inline(always)]
pub(crate) fn window_coord(
    at: usize,
    tap: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    size: usize,
) -> Option<usize> {
    (at * stride + tap * dilation)
        .checked_sub(pad)
        .filter(|&s| s < size)
}

/// Writes the im2col rows of output pixels `pixels` (row-major over `out_h x out_w`)
/// for group `group` of one image: row `p` holds `[kh][kw][group_in]` input values,
/// zero where the tap falls in the padding. `col` must hold `pixels.len() *
/// patch_len()` elements and `input` one `in_h x in_w x in_channels` image; returns
/// `false` otherwise.
pub fn im2col_nhwc(
    g: &ConvGeometry,
    input: &[f32],
    group: usize,
    pixels: std::ops::Range<usize>,
    col: &mut [f32],
) -> bool {
    im2col_rows(g, input, group, pixels, col, g.patch_len(), 0.0)
}

/// [`im2col_nhwc`] for any element type, into rows of `stride >= patch_len()` elements:
/// taps in the padding read `pad`, the row's tail past the patch is `T::default()`.
pub(crate) fn im2col_rows<T: Copy + Default>(
    g: &ConvGeometry,
    input: &[T],
    group: usize,
    pixels: std::ops::Range<usize>,
    col: &mut [T],
    stride: usize,
    pad: T,
) -> bool {
    let patch = g.patch_len();
    let c = g.in_channels();
    if stride < patch
        || input.len() < g.in_h * g.in_w * c
        || col.len() < pixels.len() * stride
        || group >= g.groups
    {
        return false;
    }
    let c0 = group * g.group_in;
    for (row, p) in col.chunks_exact_mut(stride.max(1)).zip(pixels) {
        let (oy, ox) = (p / g.out_w.max(1), p % g.out_w.max(1));
        let mut at = 0;
        for ky in 0..g.kernel_h {
            let iy = g.source_row(oy, ky);
            // A kernel row wholly inside the image, over all channels and with no
            // dilation, is one run of the input: one copy instead of one per tap.
            if let (Some(iy), Some(ix0), Some(_)) = (
                iy,
                g.source_col(ox, 0),
                g.source_col(ox, g.kernel_w.saturating_sub(1)),
            ) && g.groups == 1
                && g.dilation_w == 1
            {
                let len = g.kernel_w * c;
                let s = (iy * g.in_w + ix0) * c;
                row[at..at + len].copy_from_slice(&input[s..s + len]);
                at += len;
                continue;
            }
            for kx in 0..g.kernel_w {
                let ix = g.source_col(ox, kx);
                let dst = &mut row[at..at + g.group_in];
                match (iy, ix) {
                    (Some(iy), Some(ix)) => {
                        let s = (iy * g.in_w + ix) * c + c0;
                        dst.copy_from_slice(&input[s..s + g.group_in]);
                    }
                    _ => dst.fill(pad),
                }
                at += g.group_in;
            }
        }
        row[patch..].fill(T::default());
    }
    true
}

/// Direct reference convolution of one NHWC image with an OHWI filter
/// (`[out_channels, kh, kw, group_in]`), bias per output channel, output clamped.
/// Returns `false` when a slice is too short.
pub fn conv2d_nhwc_reference(
    g: &ConvGeometry,
    input: &[f32],
    filter: &[f32],
    bias: &[f32],
    min: f32,
    max: f32,
    output: &mut [f32],
) -> bool {
    if !g.fits(input, filter, bias, output) {
        return false;
    }
    let (ci, co) = (g.in_channels(), g.out_channels());
    for oy in 0..g.out_h {
        for ox in 0..g.out_w {
            for oc in 0..co {
                let grp = oc / g.group_out;
                let mut s = bias[oc];
                g.for_each_tap(oy, ox, |pixel, tap| {
                    let taps = g.kernel_h * g.kernel_w;
                    for i in 0..g.group_in {
                        let x = input[pixel * ci + grp * g.group_in + i];
                        let w = filter[(oc * taps + tap) * g.group_in + i];
                        s += x * w;
                    }
                });
                output[(oy * g.out_w + ox) * co + oc] = s.max(min).min(max);
            }
        }
    }
    true
}

/// Depthwise convolution of output rows `rows` of one NHWC image: `g.groups` input
/// channels, depth multiplier `g.group_out`, filter `[kh, kw, channels * multiplier]`
/// (output channel `c * multiplier + m` reads input channel `c`). `output` holds the
/// rows `rows` only. Returns `false` when a slice is too short.
///
/// The channel loop runs with fused multiply-adds where `isa` has them (AVX2+FMA on
/// x86-64, NEON on aarch64); [`Isa::Scalar`] is the twin with separate multiply and add.
#[allow(clippy::too_many_arguments)]
pub fn depthwise_conv2d_nhwc(
    isa: Isa,
    g: &ConvGeometry,
    input: &[f32],
    filter: &[f32],
    bias: &[f32],
    min: f32,
    max: f32,
    rows: std::ops::Range<usize>,
    output: &mut [f32],
) -> bool {
    let co = g.groups * g.group_out;
    if input.len() < g.in_h * g.in_w * g.groups
        || filter.len() < g.kernel_h * g.kernel_w * co
        || bias.len() < co
        || output.len() < rows.len() * g.out_w * co
        || rows.end > g.out_h
    {
        return false;
    }
    let dw = Depthwise {
        g,
        input,
        filter,
        bias,
        min,
        max,
    };
    #[cfg(target_arch = "x86_64")]
    // Rows of at most `WIDE_PIXELS` outputs are mostly edge pixels, which the AVX2
    // path's 32-channel blocks ran as fast (MobileNetV2's 7x7 layers: 27-29 us either way).
    if let Some(t) = isa.avx512().filter(|_| g.out_w > x86::WIDE_PIXELS) {
        x86::depthwise_wide(t, &dw, rows, output);
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = isa.avx2() {
        x86::depthwise(t, &dw, rows, output);
        return true;
    }
    #[cfg(target_arch = "aarch64")]
    if isa.neon().is_some() {
        dw.rows::<true>(rows, output);
        return true;
    }
    let _ = isa;
    dw.rows::<false>(rows, output);
    true
}

/// The operands of one depthwise convolution, lengths already checked.
struct Depthwise<'a> {
    g: &'a ConvGeometry,
    input: &'a [f32],
    filter: &'a [f32],
    bias: &'a [f32],
    min: f32,
    max: f32,
}

impl Depthwise<'_> {
    /// Output rows `rows` into `output`; `FUSED` computes `x * w + o` as one rounding.
    #[inline(always)]
    fn rows<const FUSED: bool>(&self, rows: std::ops::Range<usize>, output: &mut [f32]) {
        let g = self.g;
        let co = g.groups * g.group_out;
        for (r, oy) in rows.enumerate() {
            for ox in 0..g.out_w {
                let out = &mut output[(r * g.out_w + ox) * co..(r * g.out_w + ox + 1) * co];
                if g.group_out == 1 {
                    self.pixel_blocked::<FUSED>(oy, ox, 0, out);
                } else {
                    self.pixel_multiplier::<FUSED>(oy, ox, out);
                }
            }
        }
    }

    /// Channels `from..` of one output pixel of a depth multiplier of 1, in blocks of
    /// [`DEPTHWISE_LANES`] accumulated over the taps.
    #[inline(always)]
    fn pixel_blocked<const FUSED: bool>(&self, oy: usize, ox: usize, from: usize, out: &mut [f32]) {
        let g = self.g;
        let c = g.groups;
        let mut c0 = from;
        while c0 < c {
            let len = DEPTHWISE_LANES.min(c - c0);
            let mut acc = [0f32; DEPTHWISE_LANES];
            acc[..len].copy_from_slice(&self.bias[c0..c0 + len]);
            g.for_each_tap(oy, ox, |pixel, tap| {
                let px = &self.input[pixel * c + c0..][..len];
                let w = &self.filter[tap * c + c0..][..len];
                for ((a, &x), &w) in acc.iter_mut().zip(px).zip(w) {
                    *a = madd::<FUSED>(x, w, *a);
                }
            });
            for (o, &a) in out[c0..c0 + len].iter_mut().zip(&acc) {
                *o = a.max(self.min).min(self.max);
            }
            c0 += len;
        }
    }

    /// One output pixel of a depth multiplier above 1.
    #[inline(always)]
    fn pixel_multiplier<const FUSED: bool>(&self, oy: usize, ox: usize, out: &mut [f32]) {
        let g = self.g;
        let (c, mult) = (g.groups, g.group_out);
        let co = c * mult;
        out.copy_from_slice(&self.bias[..co]);
        g.for_each_tap(oy, ox, |pixel, tap| {
            let px = &self.input[pixel * c..][..c];
            let w = &self.filter[tap * co..][..co];
            for (ch, &x) in px.iter().enumerate() {
                let (o, w) = (&mut out[ch * mult..][..mult], &w[ch * mult..][..mult]);
                for (o, &w) in o.iter_mut().zip(w) {
                    *o = madd::<FUSED>(x, w, *o);
                }
            }
        });
        for o in out.iter_mut() {
            *o = o.max(self.min).min(self.max);
        }
    }
}

/// Channels one depthwise accumulator block holds (four AVX2 registers).
const DEPTHWISE_LANES: usize = 32;

/// `x * w + o`, fused into one rounding when `FUSED`.
#[inline(always)]
fn madd<const FUSED: bool>(x: f32, w: f32, o: f32) -> f32 {
    if FUSED { x.mul_add(w, o) } else { x * w + o }
}

/// The AVX2 + FMA entry points: blocks of [`DEPTHWISE_LANES`] channels held in four
/// registers over the taps, the rest by the generic loops compiled with the features.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{DEPTHWISE_LANES, Depthwise};
    use crate::CpuSupport;
    use crate::simd_x86::first_lanes;

    /// [`Depthwise::rows`] with AVX2 and FMA.
    pub(super) fn depthwise(
        _: CpuSupport,
        dw: &Depthwise<'_>,
        rows: std::ops::Range<usize>,
        output: &mut [f32],
    ) {
        // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
        unsafe { depthwise_avx2(dw, rows, output) }
    }

    /// [`Depthwise::rows`] with AVX-512 F: a vector of 16 channels of up to
    /// [`WIDE_PIXELS`] output pixels of a row at once where all their taps lie inside
    /// the image, one pixel at a time (taps outside skipped) elsewhere; each output the
    /// bias plus its taps in `(ky, kx)` order with fused multiply-adds, as the AVX2 path.
    pub(super) fn depthwise_wide(
        cpu: CpuSupport,
        dw: &Depthwise<'_>,
        rows: std::ops::Range<usize>,
        output: &mut [f32],
    ) {
        // SAFETY: the `CpuSupport` token proves AVX-512 F (with AVX2 and FMA).
        unsafe { depthwise_avx512(cpu, dw, rows, output) }
    }

    /// Output pixels of a row summed at once by [`depthwise_wide`] (independent chains
    /// of fused multiply-adds).
    pub(super) const WIDE_PIXELS: usize = 7;

    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn depthwise_avx512(
        _: CpuSupport,
        dw: &Depthwise<'_>,
        rows: std::ops::Range<usize>,
        output: &mut [f32],
    ) {
        let g = dw.g;
        if g.group_out != 1 {
            return dw.rows::<true>(rows, output);
        }
        let c = g.groups;
        // Output columns whose taps all lie inside the input's columns.
        let first_x = g.pad_left.div_ceil(g.stride_w);
        let reach_w = (g.kernel_w - 1) * g.dilation_w;
        let end_x = if g.in_w + g.pad_left > reach_w {
            ((g.in_w + g.pad_left - reach_w - 1) / g.stride_w + 1).min(g.out_w)
        } else {
            0
        };
        let reach_h = (g.kernel_h - 1) * g.dilation_h;
        for (r, oy) in rows.enumerate() {
            let top = (oy * g.stride_h).checked_sub(g.pad_top);
            let row_inside = top.is_some_and(|t| t + reach_h < g.in_h);
            let out_row = &mut output[r * g.out_w * c..][..g.out_w * c];
            for c0 in (0..c).step_by(16) {
                let mask = first_lanes(c - c0);
                let mut ox = 0;
                while ox < g.out_w {
                    let inside = row_inside && ox >= first_x && ox < end_x;
                    if let (true, Some(top)) = (inside, top) {
                        let n = (end_x - ox).min(WIDE_PIXELS);
                        let at = ((top, ox), c0, mask);
                        match n {
                            7 => wide_block::<7>(dw, at, out_row),
                            6 => wide_block::<6>(dw, at, out_row),
                            5 => wide_block::<5>(dw, at, out_row),
                            4 => wide_block::<4>(dw, at, out_row),
                            3 => wide_block::<3>(dw, at, out_row),
                            2 => wide_block::<2>(dw, at, out_row),
                            _ => wide_block::<1>(dw, at, out_row),
                        }
                        ox += n;
                    } else {
                        edge_pixel(dw, (oy, ox), c0, mask, out_row);
                        ox += 1;
                    }
                }
            }
        }
    }

    /// Channels `c0..` (the lanes of `mask`) of output pixels `ox..ox + N` of a row
    /// whose taps all lie inside the image, the first tap row being input row `top`,
    /// into `out_row`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn wide_block<const N: usize>(
        dw: &Depthwise<'_>,
        ((top, ox), c0, mask): ((usize, usize), usize, __mmask16),
        out_row: &mut [f32],
    ) {
        let g = dw.g;
        let c = g.groups;
        let left = ox * g.stride_w - g.pad_left;
        let last_tap = ((top + (g.kernel_h - 1) * g.dilation_h) * g.in_w
            + left
            + (N - 1) * g.stride_w
            + (g.kernel_w - 1) * g.dilation_w)
            * c;
        let last_out = (ox + N - 1) * c;
        assert!(
            last_tap + c <= dw.input.len()
                && (g.kernel_h * g.kernel_w) * c <= dw.filter.len()
                && c <= dw.bias.len()
                && last_out + c <= out_row.len()
        );
        // SAFETY (the block): AVX-512 F (the target features); every load reads the
        // lanes of `mask`, channels c0.. below `c`, of a pixel or tap at most the last
        // one asserted above to lie inside its slice; the stores likewise.
        unsafe {
            let bias = _mm512_maskz_loadu_ps(mask, dw.bias.as_ptr().add(c0));
            let mut acc = [bias; N];
            for ky in 0..g.kernel_h {
                let row = (top + ky * g.dilation_h) * g.in_w + left;
                for kx in 0..g.kernel_w {
                    let tap = ky * g.kernel_w + kx;
                    let w = _mm512_maskz_loadu_ps(mask, dw.filter.as_ptr().add(tap * c + c0));
                    let first = row + kx * g.dilation_w;
                    for (j, acc) in acc.iter_mut().enumerate() {
                        let at = (first + j * g.stride_w) * c + c0;
                        let x = _mm512_maskz_loadu_ps(mask, dw.input.as_ptr().add(at));
                        *acc = _mm512_fmadd_ps(x, w, *acc);
                    }
                }
            }
            let (lo, hi) = (_mm512_set1_ps(dw.min), _mm512_set1_ps(dw.max));
            for (j, acc) in acc.iter().enumerate() {
                // `max` then `min`, as the scalar `a.max(min).min(max)`: NaN becomes `min`.
                let v = _mm512_min_ps(_mm512_max_ps(*acc, lo), hi);
                let to = out_row.as_mut_ptr().add((ox + j) * c + c0);
                _mm512_mask_storeu_ps(to, mask, v);
            }
        }
    }

    /// Channels `c0..` (the lanes of `mask`) of output pixel `(oy, ox)`, its taps outside
    /// the image skipped, into `out_row`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn edge_pixel(
        dw: &Depthwise<'_>,
        (oy, ox): (usize, usize),
        c0: usize,
        mask: __mmask16,
        out_row: &mut [f32],
    ) {
        let g = dw.g;
        let c = g.groups;
        let lanes = (c - c0).min(16);
        let bias = &dw.bias[c0..c0 + lanes];
        // SAFETY (the block): AVX-512 F (the target features); each masked load and
        // store reads or writes `lanes` values of a slice checked to hold them.
        unsafe {
            let mut acc = _mm512_maskz_loadu_ps(mask, bias.as_ptr());
            for ky in 0..g.kernel_h {
                let Some(iy) = (oy * g.stride_h + ky * g.dilation_h).checked_sub(g.pad_top) else {
                    continue;
                };
                if iy >= g.in_h {
                    continue;
                }
                for kx in 0..g.kernel_w {
                    let Some(ix) = (ox * g.stride_w + kx * g.dilation_w).checked_sub(g.pad_left)
                    else {
                        continue;
                    };
                    if ix >= g.in_w {
                        continue;
                    }
                    let tap = ky * g.kernel_w + kx;
                    let x = &dw.input[(iy * g.in_w + ix) * c + c0..][..lanes];
                    let w = &dw.filter[tap * c + c0..][..lanes];
                    let x = _mm512_maskz_loadu_ps(mask, x.as_ptr());
                    let w = _mm512_maskz_loadu_ps(mask, w.as_ptr());
                    acc = _mm512_fmadd_ps(x, w, acc);
                }
            }
            let (lo, hi) = (_mm512_set1_ps(dw.min), _mm512_set1_ps(dw.max));
            let v = _mm512_min_ps(_mm512_max_ps(acc, lo), hi);
            let out = &mut out_row[ox * c + c0..][..lanes];
            _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, v);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn depthwise_avx2(dw: &Depthwise<'_>, rows: std::ops::Range<usize>, output: &mut [f32]) {
        let g = dw.g;
        if g.group_out != 1 {
            return dw.rows::<true>(rows, output);
        }
        let c = g.groups;
        let full = c / DEPTHWISE_LANES * DEPTHWISE_LANES;
        for (r, oy) in rows.enumerate() {
            for ox in 0..g.out_w {
                let out = &mut output[(r * g.out_w + ox) * c..][..c];
                let mut c0 = 0;
                while c0 < full {
                    block(dw, oy, ox, c0, &mut out[c0..c0 + DEPTHWISE_LANES]);
                    c0 += DEPTHWISE_LANES;
                }
                dw.pixel_blocked::<true>(oy, ox, full, out);
            }
        }
    }

    /// Channels `c0..c0 + 32` of output pixel `(oy, ox)` into `out` (32 values).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn block(dw: &Depthwise<'_>, oy: usize, ox: usize, c0: usize, out: &mut [f32]) {
        let g = dw.g;
        let c = g.groups;
        let load = |s: &[f32]| -> [__m256; 4] {
            let s = &s[..DEPTHWISE_LANES];
            // SAFETY: `s` holds 32 floats, four loads of 8.
            unsafe {
                [
                    _mm256_loadu_ps(s.as_ptr()),
                    _mm256_loadu_ps(s.as_ptr().add(8)),
                    _mm256_loadu_ps(s.as_ptr().add(16)),
                    _mm256_loadu_ps(s.as_ptr().add(24)),
                ]
            }
        };
        let mut acc = load(&dw.bias[c0..]);
        g.for_each_tap(oy, ox, |pixel, tap| {
            let x = load(&dw.input[pixel * c + c0..]);
            let w = load(&dw.filter[tap * c + c0..]);
            for l in 0..4 {
                acc[l] = _mm256_fmadd_ps(x[l], w[l], acc[l]);
            }
        });
        let (lo, hi) = (_mm256_set1_ps(dw.min), _mm256_set1_ps(dw.max));
        let out = &mut out[..DEPTHWISE_LANES];
        for (l, a) in acc.iter().enumerate() {
            // `max` then `min`, as the scalar `a.max(min).min(max)`: NaN becomes `min`.
            let v = _mm256_min_ps(_mm256_max_ps(*a, lo), hi);
            // SAFETY: `out` holds 32 floats; this stores 8 at 8 * l.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * l), v) };
        }
    }
}

/// Transposed convolution (deconvolution) of one NHWC image: input pixel `(iy, ix)`
/// contributes to output `(iy * stride + ky * dilation - pad_top, ...)`. The filter is
/// `[groups * group_out, kh, kw, group_in]`; `g.in_*` / `g.out_*` are the deconvolution's
/// own input and output sizes. Returns `false` when a slice is too short.
pub fn conv_transpose2d_nhwc(
    g: &ConvGeometry,
    input: &[f32],
    filter: &[f32],
    bias: &[f32],
    min: f32,
    max: f32,
    output: &mut [f32],
) -> bool {
    if !g.fits(input, filter, bias, output) {
        return false;
    }
    let (ci, co) = (g.in_channels(), g.out_channels());
    let taps = g.kernel_h * g.kernel_w;
    let output = &mut output[..g.out_pixels() * co];
    for px in output.chunks_exact_mut(co.max(1)) {
        px.copy_from_slice(&bias[..co]);
    }
    for iy in 0..g.in_h {
        for ix in 0..g.in_w {
            let x = &input[(iy * g.in_w + ix) * ci..(iy * g.in_w + ix + 1) * ci];
            g.for_each_target(iy, ix, |pixel, tap| {
                let out = &mut output[pixel * co..(pixel + 1) * co];
                for grp in 0..g.groups {
                    let xs = &x[grp * g.group_in..(grp + 1) * g.group_in];
                    for o in 0..g.group_out {
                        let oc = grp * g.group_out + o;
                        let w0 = (oc * taps + tap) * g.group_in;
                        let w = &filter[w0..w0 + g.group_in];
                        let mut s = 0f32;
                        for (&a, &b) in xs.iter().zip(w) {
                            s = a.mul_add(b, s);
                        }
                        out[oc] += s;
                    }
                }
            });
        }
    }
    for o in output.iter_mut() {
        *o = o.max(min).min(max);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::{Mat, matmul_nt};
    use crate::test_util::{conv_geometry, grid_values};
    use proptest::prelude::*;

    /// The depthwise layers of MobileNetV2 (3x3, "same", stride 1 and 2; rows long
    /// enough for whole blocks of pixels), 40 channels (two vectors and a tail): every
    /// instruction set with fused multiply-adds gives the same bits.
    #[test]
    fn depthwise_fused_paths_agree_on_mobile_layers() {
        for (size, stride) in [(14, 1), (14, 2), (28, 1), (17, 2), (7, 1)] {
            let g = ConvGeometry::same_on_both_axes((size, size), (3, 3), (stride, 1), (40, 1, 1));
            let input = grid_values(g.in_h * g.in_w * 40, 3);
            let filter = grid_values(9 * 40, 5);
            let bias = grid_values(40, 7);
            let mut outputs = Vec::new();
            for &isa in crate::Isa::available()
                .iter()
                .filter(|i| **i != crate::Isa::Scalar)
            {
                let mut out = vec![f32::NAN; g.out_pixels() * 40];
                let rows = 0..g.out_h;
                assert!(depthwise_conv2d_nhwc(
                    isa, &g, &input, &filter, &bias, -0.5, 6.0, rows, &mut out
                ));
                outputs.push((isa, out));
            }
            for (isa, out) in &outputs[1..] {
                let first = &outputs[0].1;
                let same = out
                    .iter()
                    .zip(first)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{} on {size}x{size} stride {stride}", isa.name());
            }
        }
    }

    proptest! {
        #[test]
        fn im2col_gemm_matches_the_reference(g in conv_geometry(), seed in 0u32..100) {
            let input = grid_values(g.in_h * g.in_w * g.in_channels(), seed);
            let filter = grid_values(g.out_channels() * g.patch_len(), seed + 1);
            let bias = grid_values(g.out_channels(), seed + 2);
            let mut want = vec![0f32; g.out_pixels() * g.out_channels()];
            prop_assert!(conv2d_nhwc_reference(&g, &input, &filter, &bias, -0.5, 2.0, &mut want));
            let mut got = vec![0f32; want.len()];
            let mut col = vec![0f32; g.out_pixels() * g.patch_len()];
            for grp in 0..g.groups {
                prop_assert!(im2col_nhwc(&g, &input, grp, 0..g.out_pixels(), &mut col));
                let rows = grp * g.group_out * g.patch_len();
                let ok = matmul_nt(
                    g.out_pixels(), g.group_out, g.patch_len(),
                    Mat { data: &col, ld: g.patch_len() },
                    Mat { data: &filter[rows..], ld: g.patch_len() },
                    Some(&bias[grp * g.group_out..]),
                    &mut got[grp * g.group_out..], g.out_channels(), -0.5, 2.0,
                );
            prop_assert!(ok);
            }
            for (a, b) in got.iter().zip(&want) {
                prop_assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()));
            }
        }

        #[test]
        fn depthwise_matches_the_grouped_reference(
            g in conv_geometry(),
            channels in prop_oneof![Just(0usize), 30usize..70],
            seed in 0u32..100,
        ) {
            // `channels` > 0: enough channels for the 32-lane register blocks and a tail.
            let groups = if channels > 0 { channels } else { g.groups };
            let group_out = if channels > 0 { 1 } else { g.group_out };
            let g = ConvGeometry { group_in: 1, groups, group_out, ..g };
            let (c, m) = (g.groups, g.group_out);
            let input = grid_values(g.in_h * g.in_w * c, seed);
            // Depthwise filter [kh, kw, c * m] and the same as OHWI [c * m, kh, kw, 1].
            let dw = grid_values(g.kernel_h * g.kernel_w * c * m, seed + 3);
            let mut ohwi = vec![0f32; dw.len()];
            for t in 0..g.kernel_h * g.kernel_w {
                for k in 0..c * m {
                    ohwi[k * g.kernel_h * g.kernel_w + t] = dw[t * c * m + k];
                }
            }
            let bias = grid_values(c * m, seed + 4);
            let mut want = vec![0f32; g.out_pixels() * c * m];
            prop_assert!(conv2d_nhwc_reference(&g, &input, &ohwi, &bias, f32::NEG_INFINITY, 6.0, &mut want));
            let mut got = vec![0f32; want.len()];
            // Every instruction set with fused multiply-adds gives the same bits.
            let mut fused: Option<Vec<f32>> = None;
            for &isa in crate::Isa::available() {
                got.fill(0.0);
                prop_assert!(depthwise_conv2d_nhwc(isa, &g, &input, &dw, &bias, f32::NEG_INFINITY, 6.0, 0..g.out_h, &mut got));
                for (a, b) in got.iter().zip(&want) {
                    prop_assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{}: {a} vs {b}", isa.name());
                }
                if isa == crate::Isa::Scalar {
                    continue;
                }
                match &fused {
                    None => fused = Some(got.clone()),
                    Some(first) => {
                        let same = got.iter().zip(first).all(|(a, b)| a.to_bits() == b.to_bits());
                        prop_assert!(same, "{} differs from the first fused instruction set", isa.name());
                    }
                }
            }
        }

        #[test]
        fn transposed_is_the_adjoint(g in conv_geometry(), seed in 0u32..100) {
            // <conv(x), y> == <x, conv_transpose(y)> with the roles of in/out swapped.
            let x = grid_values(g.in_h * g.in_w * g.in_channels(), seed);
            let f = grid_values(g.out_channels() * g.patch_len(), seed + 5);
            let zero_out = vec![0f32; g.out_channels()];
            let zero_in = vec![0f32; g.in_channels()];
            let mut cx = vec![0f32; g.out_pixels() * g.out_channels()];
            prop_assert!(conv2d_nhwc_reference(&g, &x, &f, &zero_out, f32::NEG_INFINITY, f32::INFINITY, &mut cx));
            let y = grid_values(cx.len(), seed + 6);
            // The transposed convolution maps out_channels -> in_channels; its filter is
            // [groups * group_in, kh, kw, group_out].
            let t = ConvGeometry { in_h: g.out_h, in_w: g.out_w, out_h: g.in_h, out_w: g.in_w, group_in: g.group_out, group_out: g.group_in, ..g };
            let mut ft = vec![0f32; f.len()];
            for grp in 0..g.groups {
                for o in 0..g.group_out {
                    for tap in 0..g.kernel_h * g.kernel_w {
                        for i in 0..g.group_in {
                            let src = (((grp * g.group_out + o) * g.kernel_h * g.kernel_w) + tap) * g.group_in + i;
                            let dst = (((grp * g.group_in + i) * g.kernel_h * g.kernel_w) + tap) * g.group_out + o;
                            ft[dst] = f[src];
                        }
                    }
                }
            }
            let mut ty = vec![0f32; x.len()];
            prop_assert!(conv_transpose2d_nhwc(&t, &y, &ft, &zero_in, f32::NEG_INFINITY, f32::INFINITY, &mut ty));
            let lhs: f32 = cx.iter().zip(&y).map(|(a, b)| a * b).sum();
            let rhs: f32 = x.iter().zip(&ty).map(|(a, b)| a * b).sum();
            prop_assert!((lhs - rhs).abs() <= 1e-3 * (1.0 + lhs.abs()));
        }
    }
}
