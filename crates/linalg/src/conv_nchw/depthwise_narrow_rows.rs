//! The depthwise plane convolution of a 3x3 filter, stride 1, one pixel of padding on
//! every side, over planes of narrow rows (MobileNetV2's 14x14 and 28x28), with AVX-512:
//! the plane swept as one flat row of 16-pixel vectors, as in `depthwise_flat`, but
//! each input vector loaded once. A tap `o` pixels from the output is lanes `r .. r +
//! 16` of two neighbouring input vectors side by side, picked by one two-source
//! permute. On rows of at most 14 pixels the taps of the row above lie in the vector
//! before and this one, those of the row below in this one and the next; on rows of 17
//! to 30 pixels, in the two vectors before and the two after. So three or five input
//! vectors in registers serve all nine taps.
//!
//! A tap whose row lies above or below the plane reads zeros (the vector before the
//! first, the lanes past the plane's end); one whose column lies past either edge of
//! its row leaves the lane's sum as it is (a masked fused multiply-add, the masks
//! worked out once per geometry). Each output is the bias plus its taps in `(ky, kx)`
//! order with fused multiply-adds, as in the polyphase kernel; only the sign of a zero
//! sum can differ. The row kernel loads at offsets that are not multiples of 16, each
//! load split across two cache lines, and masked: 576 planes of 14x14 took 38 us here
//! against 57 there (2-vCPU Xeon, one thread, hot, throwaway harness). On rows of at
//! most 8 pixels (7x7 planes, four vectors) the flat kernel is as fast, and runs them.

use std::arch::x86_64::*;

use super::{DirectPlane, WideTaps3x3, is_3x3_rows};
use crate::CpuSupport;
use crate::conv::ConvGeometry;

/// Rows whose taps above and below lie in the vector before or after: at most 14
/// pixels, every tap within 15 pixels of its output.
pub(super) const ONE_VECTOR_ROWS: std::ops::RangeInclusive<usize> = 2..=14;

/// Rows whose taps above and below lie in the second and first vector before or after:
/// 17 to 30 pixels.
pub(super) const TWO_VECTOR_ROWS: std::ops::RangeInclusive<usize> = 17..=30;

/// Most pixels of a plane the kernel handles.
pub(super) const MAX_PIXELS: usize = 1024;

/// Most vectors of a plane.
pub(super) const MAX_VECTORS: usize = MAX_PIXELS / 16;

/// The kernel prepared for one geometry.
pub(super) struct NarrowRows {
    cpu: CpuSupport,
    /// Pixels of the plane (in and out).
    pixels: usize,
    /// Rows of [`TWO_VECTOR_ROWS`] rather than [`ONE_VECTOR_ROWS`].
    two_vector_rows: bool,
    /// Per vector, the lanes whose left and right neighbours lie in their row.
    left: [u16; MAX_VECTORS],
    right: [u16; MAX_VECTORS],
    /// The permute indices of the taps other than the centre, in `(ky, kx)` order
    /// (offsets `-w-1`, `-w`, `-w+1`, `-1`, `1`, `w-1`, `w`, `w+1`): lanes `r .. r + 16`
    /// of the tap's pair of vectors.
    picks: [[i32; 16]; 8],
}

impl NarrowRows {
    /// The kernel for `g`, or `None` when it does not handle it ([`is_narrow_3x3`] at
    /// stride 1: a 3x3 filter, one pixel of padding before (and, the output as large
    /// as the input, after) each axis, rows of [`ONE_VECTOR_ROWS`] or
    /// [`TWO_VECTOR_ROWS`] pixels and at most [`MAX_PIXELS`] pixels). `cpu` proves
    /// AVX-512 F (with AVX2 and FMA).
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<NarrowRows> {
        if !is_narrow_3x3(g, 1) {
            return None;
        }
        let (pixels, w) = (g.in_h * g.in_w, g.in_w);
        let (left, right) = row_edges(pixels, w);
        let two_vector_rows = TWO_VECTOR_ROWS.contains(&w);
        // Each tap's lane offset within its pair: the offset less 16 times the pair's
        // first vector (-1 or 0 for one-vector rows' taps above and below, -2 or 1 for
        // two-vector rows'; -1 and 0 for the taps beside).
        let (above, below) = if two_vector_rows { (32, -16) } else { (16, 0) };
        let w = w as isize;
        let picks = lane_picks([
            above - w - 1,
            above - w,
            above - w + 1,
            15,
            1,
            below + w - 1,
            below + w,
            below + w + 1,
        ]);
        Some(NarrowRows {
            cpu,
            pixels,
            two_vector_rows,
            left,
            right,
            picks,
        })
    }

    /// Convolves one plane into `output` (`pixels` values); `g` is the geometry the
    /// kernel was prepared for.
    pub(super) fn plane(&self, p: DirectPlane<'_>, output: &mut [f32]) {
        if p.input.len() < self.pixels || output.len() < self.pixels || p.filter.len() < 9 {
            return;
        }
        // SAFETY: `self.cpu` proves AVX-512 F, AVX2 and FMA (`new`'s contract); the
        // slices hold the plane's pixels and the filter's taps.
        unsafe {
            if self.two_vector_rows {
                sweep::<2>(self.cpu, self, &p, output)
            } else {
                sweep::<1>(self.cpu, self, &p, output)
            }
        }
    }
}

/// Whether `g` is a 3x3 filter of stride `stride` and dilation 1 both ways, with one
/// pixel of padding above and left, an input exactly `stride` times the output each
/// way, output rows of [`ONE_VECTOR_ROWS`] or [`TWO_VECTOR_ROWS`] pixels and at most
/// [`MAX_PIXELS`] output pixels: the planes this kernel (stride 1) and
/// `depthwise_phases` (stride 2) take.
pub(super) fn is_narrow_3x3(g: &ConvGeometry, stride: usize) -> bool {
    (is_3x3_rows(g, stride, ONE_VECTOR_ROWS) || is_3x3_rows(g, stride, TWO_VECTOR_ROWS))
        && g.pad_top == 1
        && (g.in_h, g.in_w) == (stride * g.out_h, stride * g.out_w)
        && g.out_h * g.out_w <= MAX_PIXELS
}

/// Per vector of a plane of `pixels` pixels in rows of `w`, the lanes whose left
/// neighbour and whose right neighbour lie in their row (bit `l` for lane `l`), the
/// column counted rather than divided out.
pub(super) fn row_edges(pixels: usize, w: usize) -> ([u16; MAX_VECTORS], [u16; MAX_VECTORS]) {
    let (mut left, mut right) = ([0u16; MAX_VECTORS], [0u16; MAX_VECTORS]);
    let mut x = 0;
    for p in 0..pixels.min(MAX_PIXELS) {
        let bit = 1u16 << (p % 16);
        if x != 0 {
            left[p / 16] |= bit;
        }
        if x + 1 != w {
            right[p / 16] |= bit;
        }
        x = if x + 1 == w { 0 } else { x + 1 };
    }
    (left, right)
}

/// The permute indices picking lanes `r .. r + 16` of a pair of vectors, for each lane
/// offset `r` (0 to 16).
pub(super) fn lane_picks<const N: usize>(offsets: [isize; N]) -> [[i32; 16]; N] {
    offsets.map(|r| std::array::from_fn(|l| (r + l as isize) as i32))
}

/// What every vector of a plane uses: the weights, bias and clamp bounds, and the
/// permute indices.
struct Taps {
    wide: WideTaps3x3,
    picks: [__m512i; 8],
}

/// The sum of one output vector, from its input vectors: the pair holding the row
/// above, the vectors before, at and after it, the pair holding the row below; `l` and
/// `r` the lanes whose left and right neighbours lie in their row.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
unsafe fn vector_sum(
    taps: &Taps,
    (above, below): ((__m512, __m512), (__m512, __m512)),
    (before, this, after): (__m512, __m512, __m512),
    (l, r): (__mmask16, __mmask16),
) -> __m512 {
    let (w, p) = (&taps.wide.weights, &taps.picks);
    // SAFETY: the caller's promise.
    unsafe {
        let up = |i: usize| _mm512_permutex2var_ps(above.0, p[i], above.1);
        let down = |i: usize| _mm512_permutex2var_ps(below.0, p[i], below.1);
        let mut acc = taps.wide.bias;
        acc = _mm512_mask3_fmadd_ps(up(0), w[0], acc, l);
        acc = _mm512_fmadd_ps(up(1), w[1], acc);
        acc = _mm512_mask3_fmadd_ps(up(2), w[2], acc, r);
        let left = _mm512_permutex2var_ps(before, p[3], this);
        acc = _mm512_mask3_fmadd_ps(left, w[3], acc, l);
        acc = _mm512_fmadd_ps(this, w[4], acc);
        let right = _mm512_permutex2var_ps(this, p[4], after);
        acc = _mm512_mask3_fmadd_ps(right, w[5], acc, r);
        acc = _mm512_mask3_fmadd_ps(down(5), w[6], acc, l);
        acc = _mm512_fmadd_ps(down(6), w[7], acc);
        acc = _mm512_mask3_fmadd_ps(down(7), w[8], acc, r);
        // As `Vector::clamp`: a NaN, or a zero equal to a bound, kept.
        _mm512_min_ps(taps.wide.bounds.1, _mm512_max_ps(taps.wide.bounds.0, acc))
    }
}

/// The plane's vectors in order, the input vectors from `R` before to `R` after in
/// registers (`R` vectors per row above and below: 1 or 2).
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; `p.input` and `output` hold `k.pixels` values, `p.filter` 9.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn sweep<const R: usize>(
    _: CpuSupport,
    k: &NarrowRows,
    p: &DirectPlane<'_>,
    output: &mut [f32],
) {
    let pixels = k.pixels;
    let vectors = pixels.div_ceil(16);
    let lanes = |v: usize| ((1u32 << pixels.saturating_sub(v * 16).min(16)) - 1) as __mmask16;
    // SAFETY (the block): AVX-512 F (the caller's promise); every load reads the
    // plane's lanes of a vector of the plane (masked past its end), every store the
    // output's; `v` stays below `vectors`, at most `MAX_VECTORS`.
    unsafe {
        let load = |v: usize| {
            if v < vectors {
                _mm512_maskz_loadu_ps(lanes(v), p.input.as_ptr().add(v * 16))
            } else {
                _mm512_setzero_ps()
            }
        };
        let pick = |i: usize| _mm512_loadu_si512(k.picks[i].as_ptr().cast());
        let taps = Taps {
            wide: p.wide_taps_3x3(),
            picks: std::array::from_fn(pick),
        };
        let out = output.as_mut_ptr();
        // Output vector v from its pairs above and below and its vectors beside.
        let emit = |v: usize, pairs, beside| {
            let masks = (*k.left.get_unchecked(v), *k.right.get_unchecked(v));
            let sum = vector_sum(&taps, pairs, beside, masks);
            _mm512_mask_storeu_ps(out.add(v * 16), lanes(v), sum);
        };
        let zero = _mm512_setzero_ps();
        if R == 1 {
            let (mut before, mut this) = (zero, load(0));
            for v in 0..vectors {
                let after = load(v + 1);
                emit(v, ((before, this), (this, after)), (before, this, after));
                (before, this) = (this, after);
            }
        } else {
            let (mut m2, mut m1, mut this, mut p1) = (zero, zero, load(0), load(1));
            for v in 0..vectors {
                let p2 = load(v + 2);
                emit(v, ((m2, m1), (p1, p2)), (m1, this, p1));
                (m2, m1, this, p1) = (m1, this, p1, p2);
            }
        }
    }
}
