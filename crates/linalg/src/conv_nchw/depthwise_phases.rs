//! The depthwise plane convolution of a 3x3 filter, stride 2, one pixel of padding
//! above and left, over planes of even height and width whose output rows are 2 to 14
//! or 17 to 30 pixels (MobileNetV2's 14x14 -> 7x7, 28x28 -> 14x14 and 56x56 -> 28x28
//! layers), with AVX-512.
//!
//! The input plane is first split into its four phases (even or odd rows by even or
//! odd columns: `ee[y][x] = in[2y][2x]`, `eo[y][x] = in[2y][2x + 1]`, `oe[y][x] =
//! in[2y + 1][2x]`, `oo[y][x] = in[2y + 1][2x + 1]`), each exactly the size of the
//! output, each input row de-interleaved by two permutes. Then every tap reads one
//! phase at the output pixel's own index or one row (`-w`), one column (`-1`) or both
//! before it, as a stride-1 kernel reads its plane: the sweep of
//! `depthwise_narrow_rows`, with a phase's vectors back to the row before in registers
//! (one vector back on rows of up to 14 pixels, two on rows of 17 to 30) and each
//! shifted tap picked from a pair of them by a two-source permute.
//!
//! A tap in the row above the plane reads zeros (the vector before the first); one in
//! the column left of the plane leaves the lane's sum as it is (a masked fused
//! multiply-add). Each output is the bias plus its taps in `(ky, kx)` order with fused
//! multiply-adds, as in the polyphase kernel; only the sign of a zero sum can differ.
//!
//! The row kernel it replaces there gathers even and odd lanes of two loads per tap
//! and fills 7 of 16 lanes on a 7-wide output row: 576 planes 14x14 -> 7x7 took 50 us
//! there and 33-34 here, 192 planes 28x28 -> 14x14 31 and 20, 144 planes 56x56 ->
//! 28x28 86 and 71 (2-vCPU Xeon, one thread, hot, throwaway harness).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::depthwise_narrow_rows::{
    MAX_PIXELS, MAX_VECTORS, TWO_VECTOR_ROWS, is_narrow_3x3, lane_picks, row_edges,
};
use super::{DirectPlane, WideTaps3x3};
use crate::CpuSupport;
use crate::conv::ConvGeometry;

/// The kernel prepared for one geometry.
pub(super) struct Phases {
    cpu: CpuSupport,
    /// Input rows and columns (twice the output's).
    input: (usize, usize),
    /// Output pixels (and each phase's).
    pixels: usize,
    /// Output rows of [`TWO_VECTOR_ROWS`] rather than of 2 to 14 pixels.
    two_vector_rows: bool,
    /// Per output vector, the lanes whose column is not the first (a left neighbour).
    left: [u16; MAX_VECTORS],
    /// The permutes picking a phase's pixels one row back (`w` before), one row and one
    /// column back, both from the pair of vectors 1 and 0 (2 and 1 on two-vector rows)
    /// before this one, and one column back, from the vector before and this one.
    picks: [[i32; 16]; 3],
}

impl Phases {
    /// The kernel for `g`, or `None` when it does not handle it ([`is_narrow_3x3`] at
    /// stride 2: a 3x3 filter, one pixel of padding above and left, an input of even
    /// height and width exactly twice the output's, output rows of 2 to 14 or
    /// [`TWO_VECTOR_ROWS`] pixels and at most [`MAX_PIXELS`] output pixels). `cpu`
    /// proves AVX-512 F (with AVX2 and FMA).
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<Phases> {
        if !is_narrow_3x3(g, 2) {
            return None;
        }
        let (pixels, w) = (g.out_h * g.out_w, g.out_w);
        let (left, _) = row_edges(pixels, w);
        let two_vector_rows = TWO_VECTOR_ROWS.contains(&w);
        // A row back is `w` pixels back: from the pair of vectors one and zero back (two
        // and one on two-vector rows); a column back from the vector before and this one.
        let back = if two_vector_rows { 32 } else { 16 };
        let w = w as isize;
        let picks = lane_picks([back - w, 15, back - w - 1]);
        Some(Phases {
            cpu,
            input: (g.in_h, g.in_w),
            pixels,
            two_vector_rows,
            left,
            picks,
        })
    }

    /// Convolves one plane into `output`; `p` holds the geometry's input plane and taps.
    pub(super) fn plane(&self, p: DirectPlane<'_>, output: &mut [f32]) {
        let (h, w) = self.input;
        if p.input.len() < h * w || output.len() < self.pixels || p.filter.len() < 9 {
            return;
        }
        // SAFETY: `self.cpu` proves AVX-512 F, AVX2 and FMA (`new`'s contract); the
        // slices hold the planes' pixels and the filter's taps.
        unsafe {
            if self.two_vector_rows {
                sweep::<2>(self.cpu, self, &p, output)
            } else {
                sweep::<1>(self.cpu, self, &p, output)
            }
        }
    }
}

/// The four phases of a plane, each `pixels` values written before any is read.
#[repr(C, align(64))]
struct PhasePlanes([[MaybeUninit<f32>; MAX_PIXELS + 16]; 4]);

/// Splits the input plane into its phases, then sweeps the output vectors, each phase's
/// vectors back to `R` before in registers (`R` vectors per row: 1 or 2).
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; `p.input` holds the input plane, `output` the output
/// plane, `p.filter` 9 taps.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn sweep<const R: usize>(
    _: CpuSupport,
    k: &Phases,
    p: &DirectPlane<'_>,
    output: &mut [f32],
) {
    let ((h, w), pixels) = (k.input, k.pixels);
    let out_w = w / 2;
    let mut phases = PhasePlanes([[MaybeUninit::uninit(); MAX_PIXELS + 16]; 4]);
    let [ee, eo, oe, oo] = phases.0.each_mut().map(|a| a.as_mut_ptr().cast::<f32>());
    // SAFETY (the block): AVX-512 F (the caller's promise); each input row is read
    // through masked loads of its `w` values, each phase row written through masked
    // stores of its `out_w` values (every value of every phase is written, rows being
    // `h / 2` by `out_w`); the sweep reads each phase's vectors below `pixels`, with
    // lanes past it not stored.
    unsafe {
        let lanes = |n: usize| ((1u32 << n.min(16)) - 1) as __mmask16;
        let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
        for row in 0..h {
            let src = p.input.as_ptr().add(row * w);
            let (even_cols, odd_cols) = if row % 2 == 0 { (ee, eo) } else { (oe, oo) };
            let at = (row / 2) * out_w;
            // 32 input values at a time, 16 even columns and 16 odd ones: rows of up to
            // 28 values in one step, of up to 60 in two.
            for c in (0..R).map(|i| 32 * i) {
                let a = _mm512_maskz_loadu_ps(lanes(w - c), src.add(c));
                let b = _mm512_maskz_loadu_ps(lanes(w.saturating_sub(c + 16)), src.add(c + 16));
                let m = lanes(out_w - c / 2);
                let e = _mm512_permutex2var_ps(a, evens, b);
                let o = _mm512_permutex2var_ps(a, odds, b);
                _mm512_mask_storeu_ps(even_cols.add(at + c / 2), m, e);
                _mm512_mask_storeu_ps(odd_cols.add(at + c / 2), m, o);
            }
        }
        // Lanes past the last pixel are loaded but never stored: give them a value.
        for phase in [ee, eo, oe, oo] {
            _mm512_mask_storeu_ps(phase.add(pixels), 0xffff, _mm512_setzero_ps());
        }
        let WideTaps3x3 {
            weights,
            bias,
            bounds: (lo, hi),
        } = p.wide_taps_3x3();
        let pick = |i: usize| _mm512_loadu_si512(k.picks[i].as_ptr().cast());
        let (row_back, col_back, both_back) = (pick(0), pick(1), pick(2));
        let load = |phase: *const f32, v: usize| _mm512_loadu_ps(phase.add(v * 16));
        let zero = _mm512_setzero_ps();
        // Per phase read a row back, its vectors v - R ..= v - 1 (zeros before the first);
        // the even rows' odd columns, only the vector before.
        let (mut oe_back, mut oo_back) = ([zero; 2], [zero; 2]);
        let mut eo_before = zero;
        for v in 0..pixels.div_ceil(16) {
            let (ee_v, eo_v, oe_v, oo_v) = (load(ee, v), load(eo, v), load(oe, v), load(oo, v));
            let l = *k.left.get_unchecked(v);
            let pair = |a, b, idx| _mm512_permutex2var_ps(a, idx, b);
            // The pair holding a row back: vectors v - 1 and v (one-vector rows) or
            // v - 2 and v - 1 (two-vector rows).
            let (oe_row, oo_row) = if R == 1 {
                ((oe_back[1], oe_v), (oo_back[1], oo_v))
            } else {
                ((oe_back[0], oe_back[1]), (oo_back[0], oo_back[1]))
            };
            let mut acc = bias;
            // Kernel row 0: the odd rows one back.
            acc = _mm512_mask3_fmadd_ps(pair(oo_row.0, oo_row.1, both_back), weights[0], acc, l);
            acc = _mm512_fmadd_ps(pair(oe_row.0, oe_row.1, row_back), weights[1], acc);
            acc = _mm512_fmadd_ps(pair(oo_row.0, oo_row.1, row_back), weights[2], acc);
            // Kernel row 1: the even rows.
            acc = _mm512_mask3_fmadd_ps(pair(eo_before, eo_v, col_back), weights[3], acc, l);
            acc = _mm512_fmadd_ps(ee_v, weights[4], acc);
            acc = _mm512_fmadd_ps(eo_v, weights[5], acc);
            // Kernel row 2: the odd rows.
            acc = _mm512_mask3_fmadd_ps(pair(oo_back[1], oo_v, col_back), weights[6], acc, l);
            acc = _mm512_fmadd_ps(oe_v, weights[7], acc);
            acc = _mm512_fmadd_ps(oo_v, weights[8], acc);
            // As `Vector::clamp`: a NaN, or a zero equal to a bound, kept.
            let out = _mm512_min_ps(hi, _mm512_max_ps(lo, acc));
            _mm512_mask_storeu_ps(output.as_mut_ptr().add(v * 16), lanes(pixels - v * 16), out);
            eo_before = eo_v;
            (oe_back, oo_back) = ([oe_back[1], oe_v], [oo_back[1], oo_v]);
        }
    }
}
