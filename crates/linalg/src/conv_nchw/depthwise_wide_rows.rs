//! The depthwise plane convolution of a 3x3 filter, stride 1, one pixel of padding all
//! round ("same"), over planes whose rows are 31 to [`MAX_W`] pixels (MobileNetV2's
//! 112x112 and 56x56 layers), or a band of such a plane's rows (as threads split it),
//! with AVX-512.
//!
//! Each output row is summed a whole row at a time: every input row it reads is loaded
//! as whole aligned vectors, and each vector's left and right neighbours (the taps a
//! column either side) are shifted a lane in registers (`valignd`) from the vectors
//! beside it, zeros past the row's ends: a 512-bit load across a cache line costs about
//! twice one inside it (measured on a 2-vCPU AMD EPYC with a throwaway C loop: fused
//! multiply-adds fed from an aligned buffer ran at 7.1 per ns, from the same buffer one
//! float off at 3.9), and the square-filter kernel's shifted taps are such loads. The
//! row's vectors are independent chains of fused multiply-adds whose latencies overlap
//! (the square-filter kernel sums a column of rows for one vector, and its chains wait
//! on one another's loads and permutes). Only the last vector of a row loads through a
//! mask, worked out once per plane.
//!
//! Not measured on Intel when written (2026-12-07): its cores issue `valignd` on a port
//! shared with an FMA unit, so the trade of loads across lines for shifts may weigh
//! differently there (`bench/ab_minima.py` against the square kernel would say).
//!
//! Each output is the bias plus its taps in `(ky, kx)` order with fused multiply-adds, a
//! column tap in the padding adding `0 * w` and a kernel row in the padding skipped, as
//! the square-filter kernel does; only the sign of a zero sum can differ from the
//! polyphase kernel.

use std::arch::x86_64::*;

use super::{DirectPlane, is_3x3_rows, lanes_inside};
use crate::CpuSupport;
use crate::conv::ConvGeometry;

/// Widest row the kernel handles.
pub(super) const MAX_W: usize = 128;

/// Narrowest row it handles (narrower ones go to `depthwise_narrow_rows`).
pub(super) const MIN_W: usize = 31;

/// The kernel prepared for one geometry.
pub(super) struct WideRows {
    cpu: CpuSupport,
    /// Rows of the input, rows of the output, and columns of both.
    size: (usize, usize, usize),
    /// Rows of padding above the input (1 for a whole plane; 0 for a band of rows
    /// below the first, `ConvGeometry::row_band`).
    pad_top: usize,
}

impl WideRows {
    /// The kernel for `g`, or `None` when it does not handle it: a 3x3 filter, stride 1
    /// and dilation 1 both ways, one pixel of padding left and one or none above, output
    /// rows as wide as the input's, of [`MIN_W`] to [`MAX_W`] pixels (a "same" plane, or
    /// a band of its rows; kernel rows below the input are padding). `cpu` proves
    /// AVX-512 F (with AVX2 and FMA).
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<WideRows> {
        let handles = is_3x3_rows(g, 1, MIN_W..=MAX_W) && g.in_w == g.out_w && g.in_h > 0;
        handles.then_some(WideRows {
            cpu,
            size: (g.in_h, g.out_h, g.out_w),
            pad_top: g.pad_top,
        })
    }

    /// Convolves one plane into `output`; `p` holds the geometry's input plane and taps.
    pub(super) fn plane(&self, p: DirectPlane<'_>, output: &mut [f32]) {
        let (in_h, h, w) = self.size;
        if p.input.len() < in_h * w || output.len() < h * w || p.filter.len() < 9 {
            return;
        }
        // SAFETY: `self.cpu` proves AVX-512 F, AVX2 and FMA (`new`'s contract); the
        // slices hold the planes' pixels and the filter's taps (checked above), and
        // `w` is 31 to 128 pixels: 2 to 8 vectors.
        unsafe { by_row_vectors!(w, sweep(self.cpu, (self.size, self.pad_top), &p, output)) }
    }
}

/// The plane, an output row at a time, its `V` vectors at once.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; `p.input` holds the `in_h x w` input plane, `output` the
/// `h x w` output plane, `p.filter` 9 taps; `V == w.div_ceil(16)`, at least 2.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn sweep<const V: usize>(
    _: CpuSupport,
    ((in_h, h, w), pad_top): ((usize, usize, usize), usize),
    p: &DirectPlane<'_>,
    output: &mut [f32],
) {
    // The lanes of the last vector inside the row.
    let last = lanes_inside(16 * (V - 1) as isize, w as isize, 16);
    // SAFETY (the block): AVX-512 F (the caller's promise). Loads read vector `v` of
    // input row `r < in_h`, columns `16v ..`: the last one masked to the row's `w`
    // values; stores write vector `v` of output row `y < h`, the last one masked too.
    unsafe {
        let wide = p.wide_taps_3x3();
        let (weights, bias) = (wide.weights, wide.bias);
        let input = p.input.as_ptr();
        let out = output.as_mut_ptr();
        for y in 0..h {
            let mut acc = [bias; V];
            // Kernel rows inside the plane: input rows y - pad_top + ky in 0..in_h.
            let first = pad_top.saturating_sub(y);
            let end = (in_h + pad_top).saturating_sub(y).min(3);
            for ky in first..end {
                let row = input.add((y + ky - pad_top) * w);
                let [left_w, mid_w, right_w] = [0, 1, 2].map(|kx| weights[3 * ky + kx]);
                // The row's vectors in turn, each with its neighbours (zeros past the
                // row's ends), shifted a lane either way in registers: every load is
                // of whole aligned vectors where the row is, and a load across a cache
                // line costs twice one inside it.
                let (mut before, mut this) = (_mm512_setzero_si512(), load(row, 0, V, last));
                for (v, acc) in acc.iter_mut().enumerate() {
                    let after = if v + 1 < V {
                        load(row, v + 1, V, last)
                    } else {
                        _mm512_setzero_si512()
                    };
                    let left = _mm512_castsi512_ps(_mm512_alignr_epi32::<15>(this, before));
                    let right = _mm512_castsi512_ps(_mm512_alignr_epi32::<1>(after, this));
                    *acc = _mm512_fmadd_ps(left, left_w, *acc);
                    *acc = _mm512_fmadd_ps(_mm512_castsi512_ps(this), mid_w, *acc);
                    *acc = _mm512_fmadd_ps(right, right_w, *acc);
                    (before, this) = (this, after);
                }
            }
            wide.store_row(&acc, out.add(y * w), w);
        }
    }
}

/// Vector `v` of the `vectors` vectors of the row at `row`; the last one through the
/// mask `last` of its lanes inside the row (zeros past it).
///
/// # Safety
/// AVX-512 F; the row holds the vectors' values (the last one's lanes in `last`).
#[inline(always)]
unsafe fn load(row: *const f32, v: usize, vectors: usize, last: __mmask16) -> __m512i {
    // SAFETY: the caller's promise.
    unsafe {
        let x = if v + 1 == vectors {
            _mm512_maskz_loadu_ps(last, row.add(16 * v))
        } else {
            _mm512_loadu_ps(row.add(16 * v))
        };
        _mm512_castps_si512(x)
    }
}
