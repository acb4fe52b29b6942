//! The depthwise convolution of sixteen NCHW planes at once with the planes in the
//! AVX-512 lanes, for small planes (up to 256 output pixels; taken for MobileNetV2's
//! 7x7 outputs), where the plane kernels spend more time per plane than per pixel.
//!
//! The sixteen input planes are transposed in registers, sixteen pixels at a time, into
//! a zero-bordered image of pixels (`[row][column][plane]`, one vector a pixel). Each
//! output pixel is then the bias plus its taps in `(ky, kx)` order with fused
//! multiply-adds, one vector of sixteen planes at a time, as the plane kernels sum
//! them; the outputs are transposed back into the sixteen output planes. A tap in the
//! padding multiplies a zero, as the plane kernels' rows above the plane do: only the
//! sign of a zero sum can differ from the polyphase kernel's.
//!
//! Measured on an AMD EPYC, one thread (`cargo bench -p etch-linalg --bench depthwise`):
//! 960 planes of 7x7 16 us against 22 for the flat plane kernel, 576 planes of 14x14 ->
//! 7x7 15 against 20 for the phases kernel; but 576 planes of 14x14 28 against 22 for the
//! narrow-rows kernel (the transposes cost more than the plane kernels' per-plane work
//! there), hence `LANES_DEPTHWISE_MAX_PREFERRED_PIXELS`.

use std::arch::x86_64::*;

use crate::CpuSupport;
use crate::conv::ConvGeometry;
use crate::simd_x86::{first_lanes, transpose_16x16};

/// Planes convolved at once: the lanes of a vector.
pub(crate) const PLANES: usize = 16;

/// Most output pixels of a plane this kernel takes.
const MAX_OUTPUT_PIXELS: usize = 256;

/// Most pixels of the zero-bordered input image.
const MAX_PADDED_PIXELS: usize = 576;

/// Most filter taps.
const MAX_TAPS: usize = 25;

/// The kernel prepared for one geometry.
pub(super) struct LanesDepthwise {
    cpu: CpuSupport,
    g: ConvGeometry,
    /// Rows and columns of the zero-bordered input image.
    padded: (usize, usize),
    /// The column stride of a 3x3 filter of dilation 1 with stride 1 or 2 (the output
    /// blocks' taps unrolled), or `None`.
    square_3x3_stride: Option<usize>,
}

impl LanesDepthwise {
    /// The kernel for `g`, or `None` where it does not take it: a depthwise convolution
    /// of one input plane per output plane, at most [`MAX_TAPS`] taps, at most
    /// [`MAX_OUTPUT_PIXELS`] output pixels and [`MAX_PADDED_PIXELS`] pixels of padded
    /// input. `cpu` proves AVX-512 F.
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<LanesDepthwise> {
        let taps = g.kernel_h * g.kernel_w;
        let out_pixels = g.out_h * g.out_w;
        if g.group_in != 1
            || g.group_out != 1
            || taps == 0
            || taps > MAX_TAPS
            || out_pixels == 0
            || out_pixels > MAX_OUTPUT_PIXELS
            || g.stride_h == 0
            || g.stride_w == 0
            || g.dilation_h == 0
            || g.dilation_w == 0
        {
            return None;
        }
        // Rows (columns) the taps reach, from the top (left) of the padding.
        let reach = |out: usize, stride: usize, kernel: usize, dilation: usize| {
            (out - 1) * stride + (kernel - 1) * dilation + 1
        };
        let rows = reach(g.out_h, g.stride_h, g.kernel_h, g.dilation_h).max(g.pad_top + g.in_h);
        let cols = reach(g.out_w, g.stride_w, g.kernel_w, g.dilation_w).max(g.pad_left + g.in_w);
        if rows * cols > MAX_PADDED_PIXELS {
            return None;
        }
        let square_3x3 = (g.kernel_h, g.kernel_w, g.dilation_w) == (3, 3, 1);
        Some(LanesDepthwise {
            cpu,
            g: *g,
            padded: (rows, cols),
            square_3x3_stride: Some(g.stride_w).filter(|s| square_3x3 && (1..=2).contains(s)),
        })
    }

    /// Scratch (f32 values) of one call: the padded image, the output pixels and the
    /// filters' taps, a vector each.
    pub(super) fn scratch_len(&self) -> usize {
        let (rows, cols) = self.padded;
        let taps = self.g.kernel_h * self.g.kernel_w;
        (rows * cols + self.g.out_h * self.g.out_w + taps) * PLANES
    }

    /// Convolves consecutive planes, a multiple of sixteen: `input` their input planes
    /// (`in_h x in_w` each, one after another), `filters` their filters (`kernel_h x
    /// kernel_w` each), `bias` their biases (zeros for none), `bounds` the clamp's
    /// (lower, upper) bounds, into `output`'s output planes, as many as `output` holds
    /// whole. Returns false, writing nothing, when a slice is too short or the planes
    /// are not a multiple of sixteen.
    pub(super) fn run(
        &self,
        (input, filters, bias): (&[f32], &[f32], Option<&[f32]>),
        bounds: (f32, f32),
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> bool {
        let g = &self.g;
        let (in_px, out_px, taps) = (g.in_h * g.in_w, g.out_h * g.out_w, g.kernel_h * g.kernel_w);
        let planes = output.len() / out_px;
        if !planes.is_multiple_of(PLANES)
            || input.len() < planes * in_px
            || filters.len() < planes * taps
            || bias.is_some_and(|b| b.len() < planes)
            || scratch.len() < self.scratch_len()
        {
            return false;
        }
        zero_border(self, scratch);
        // SAFETY: `self.cpu` proves AVX-512 F; the slices' lengths were checked above,
        // and the image's border is zeroed.
        unsafe {
            for (i, out) in output.chunks_exact_mut(PLANES * out_px).enumerate() {
                let x = &input[i * PLANES * in_px..][..PLANES * in_px];
                let w = &filters[i * PLANES * taps..][..PLANES * taps];
                let b = bias.map(|b| &b[i * PLANES..][..PLANES]);
                convolve(self.cpu, self, (x, w, b), bounds, out, scratch);
            }
        }
        true
    }
}

/// Output pixels of a row computed at once, each its own chain of fused multiply-adds.
const ROW_BLOCK: usize = 7;

/// Zeros the border of the padded image at the start of `scratch` (`rows x cols`
/// pixel vectors): the rows above and below the input's, the columns left and right of
/// it. Every group of planes writes the inside only, so the border stays zero for all.
fn zero_border(k: &LanesDepthwise, scratch: &mut [f32]) {
    let g = &k.g;
    let (rows, cols) = k.padded;
    let inside_rows = g.pad_top..g.pad_top + g.in_h;
    let (left, right) = (g.pad_left * PLANES, (g.pad_left + g.in_w) * PLANES);
    let image = &mut scratch[..rows * cols * PLANES];
    for (r, row) in image.chunks_exact_mut(cols * PLANES).enumerate() {
        if inside_rows.contains(&r) {
            row[..left].fill(0.0);
            row[right..].fill(0.0);
        } else {
            row.fill(0.0);
        }
    }
}

/// Sixteen planes of [`LanesDepthwise::run`].
///
/// # Safety
/// AVX-512 F; `input` holds 16 input planes, `filters` 16 filters, `bias` (when given)
/// 16 values, `output` 16 output planes and `scratch` [`LanesDepthwise::scratch_len`]
/// values, the image's border zeroed ([`zero_border`]).
#[target_feature(enable = "avx512f")]
unsafe fn convolve(
    _: CpuSupport,
    k: &LanesDepthwise,
    (input, filters, bias): (&[f32], &[f32], Option<&[f32]>),
    (lo, hi): (f32, f32),
    output: &mut [f32],
    scratch: &mut [f32],
) {
    let g = &k.g;
    let (rows, cols) = k.padded;
    let (in_px, out_px, taps) = (g.in_h * g.in_w, g.out_h * g.out_w, g.kernel_h * g.kernel_w);
    let (image, rest) = scratch.split_at_mut(rows * cols * PLANES);
    let (outs, weights) = rest.split_at_mut(out_px * PLANES);
    let zero = _mm512_setzero_ps();
    // SAFETY (the block): AVX-512 F (the caller's promise). Every address below is a
    // vector inside the slice it is computed from: `image` holds `rows x cols` pixel
    // vectors and the input pixel (y, x) lands at (y + pad_top, x + pad_left), inside
    // by `LanesDepthwise::new`'s bounds; the taps of output (oy, ox) read image rows
    // oy * stride_h + ky * dilation_h < rows (columns likewise); `outs` holds `out_px`
    // vectors and `weights` `taps`; the input, filter and output planes are read and
    // written through masks of the values they hold.
    unsafe {
        // The filters, transposed into a vector a tap (lane: plane), `taps` <= 25.
        for t0 in (0..taps).step_by(16) {
            let n = (taps - t0).min(16);
            let mut block = [zero; 16];
            for (plane, row) in block.iter_mut().enumerate() {
                *row =
                    _mm512_maskz_loadu_ps(first_lanes(n), filters.as_ptr().add(plane * taps + t0));
            }
            for (t, tap) in transpose_16x16(block).iter().enumerate().take(n) {
                _mm512_storeu_ps(weights.as_mut_ptr().add((t0 + t) * PLANES), *tap);
            }
        }
        // The input pixels, sixteen at a time, transposed into pixel vectors.
        let image_ptr = image.as_mut_ptr();
        let (mut y, mut x) = (0, 0);
        for p0 in (0..in_px).step_by(16) {
            let n = (in_px - p0).min(16);
            let mut block = [zero; 16];
            for (plane, row) in block.iter_mut().enumerate() {
                *row =
                    _mm512_maskz_loadu_ps(first_lanes(n), input.as_ptr().add(plane * in_px + p0));
            }
            for pixel in &transpose_16x16(block)[..n] {
                let at = (y + g.pad_top) * cols + x + g.pad_left;
                _mm512_storeu_ps(image_ptr.add(at * PLANES), *pixel);
                x += 1;
                if x == g.in_w {
                    (y, x) = (y + 1, 0);
                }
            }
        }
        // The outputs: bias, then the taps in (ky, kx) order, then the clamp, a block
        // of a row's pixels at a time.
        let bias = match bias {
            Some(b) => _mm512_loadu_ps(b.as_ptr()),
            None => zero,
        };
        let bounds = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
        let taps_at = (image.as_ptr(), weights.as_ptr());
        for oy in 0..g.out_h {
            let mut ox = 0;
            while ox + ROW_BLOCK <= g.out_w {
                let at = outs.as_mut_ptr().add((oy * g.out_w + ox) * PLANES);
                let block = (oy, ox);
                match k.square_3x3_stride {
                    Some(1) => {
                        output_block::<ROW_BLOCK, 3, 1>(g, cols, taps_at, block, bias, bounds, at)
                    }
                    Some(2) => {
                        output_block::<ROW_BLOCK, 3, 2>(g, cols, taps_at, block, bias, bounds, at)
                    }
                    _ => output_block::<ROW_BLOCK, 0, 0>(g, cols, taps_at, block, bias, bounds, at),
                }
                ox += ROW_BLOCK;
            }
            for ox in ox..g.out_w {
                let at = outs.as_mut_ptr().add((oy * g.out_w + ox) * PLANES);
                output_block::<1, 0, 0>(g, cols, taps_at, (oy, ox), bias, bounds, at);
            }
        }
        // Back into the output planes, sixteen pixels at a time.
        for p0 in (0..out_px).step_by(16) {
            let n = (out_px - p0).min(16);
            let mut block = [zero; 16];
            for (j, pixel) in block.iter_mut().enumerate().take(n) {
                *pixel = _mm512_loadu_ps(outs.as_ptr().add((p0 + j) * PLANES));
            }
            for (plane, values) in transpose_16x16(block).iter().enumerate() {
                let to = output.as_mut_ptr().add(plane * out_px + p0);
                _mm512_mask_storeu_ps(to, first_lanes(n), *values);
            }
        }
    }
}

/// Output pixels `(oy, ox..ox + N)`, each the bias plus its taps in `(ky, kx)` order
/// with fused multiply-adds, clamped to `(lo, hi)`, stored as `N` pixel vectors at `to`.
/// `K` and `S` are 0 for any filter, or a `K x K` filter's size and column stride
/// (dilation 1) known when compiling, so that its taps are unrolled.
///
/// # Safety
/// AVX-512 F; `image` holds the padded image (`cols` pixel vectors a row) that the
/// taps of these outputs read, `weights` a vector per tap, `to` `N` vectors.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn output_block<const N: usize, const K: usize, const S: usize>(
    g: &ConvGeometry,
    cols: usize,
    (image, weights): (*const f32, *const f32),
    (oy, ox): (usize, usize),
    bias: __m512,
    (lo, hi): (__m512, __m512),
    to: *mut f32,
) {
    let mut acc = [bias; N];
    // SAFETY: the caller's promise: every tap of these outputs is inside `image`, every
    // tap's weights inside `weights`, and `to` holds N vectors.
    unsafe {
        let (kh, kw, sw) = if K == 0 {
            (g.kernel_h, g.kernel_w, g.stride_w)
        } else {
            (K, K, S)
        };
        for ky in 0..kh {
            let row = (oy * g.stride_h + ky * g.dilation_h) * cols + ox * sw;
            for kx in 0..kw {
                let w = _mm512_loadu_ps(weights.add((ky * kw + kx) * PLANES));
                let at = image.add((row + kx * g.dilation_w) * PLANES);
                for (j, acc) in acc.iter_mut().enumerate() {
                    let v = _mm512_loadu_ps(at.add(j * sw * PLANES));
                    *acc = _mm512_fmadd_ps(v, w, *acc);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            // As `Vector::clamp`: a NaN, or a zero equal to a bound, kept.
            let out = _mm512_min_ps(hi, _mm512_max_ps(lo, *acc));
            _mm512_storeu_ps(to.add(j * PLANES), out);
        }
    }
}
