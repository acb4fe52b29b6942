//! The argmax of max pooling (or, when nothing reads the indices, its values alone)
//! read straight from the input plane with AVX-512: 16
//! windows a vector, a square window of 2 to 5 taps a side, stride 1 or 2 both ways,
//! no dilation. No padded copy of the plane is made: loads are masked to the columns
//! inside the row, kernel rows outside the plane are skipped, and a lane whose tap lies
//! outside the plane never wins.
//!
//! Each lane keeps its best value and that tap's flat input index; a tap replaces them
//! only when strictly larger, taps row by row and left to right, so the first of equal
//! maxima wins, as in the scalar walk. A window whose every tap is `-inf` keeps no index,
//! and a window that meets a NaN is not ordered as the scalar walk orders it: the plane
//! is then left to the general kernel. The values alone need no index: a window of
//! `-inf` has the value `-inf`, as in the general kernel, and each lane keeps
//! `max(tap, best)`, which without NaN is the same strict comparison.

use std::arch::x86_64::*;

use super::lanes_inside;
use crate::CpuSupport;
use crate::conv::ConvGeometry;

/// Lanes of a vector.
const LANES: usize = 16;

/// Most taps a side.
const MAX_K: usize = 5;

/// Widest output row handled (lane indices and flat input indices fit in i32 below).
const MAX_OUT_W: usize = 4096;

/// The kernel for one geometry.
pub(super) struct MaxPoolArgmax {
    cpu: CpuSupport,
    g: ConvGeometry,
}

impl MaxPoolArgmax {
    /// The kernel for `g`, or `None` when it does not handle it: a square window of 2
    /// to 5 taps, stride 1 or 2 (the same both ways), dilation 1, padding narrower than
    /// the window, at most 4096 outputs a row and a plane of fewer than 2^31 values.
    /// `cpu` proves AVX-512 F.
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<MaxPoolArgmax> {
        let k = g.kernel_h;
        let handles = (2..=MAX_K).contains(&k)
            && g.kernel_w == k
            && (g.stride_h == 1 || g.stride_h == 2)
            && g.stride_w == g.stride_h
            && (g.dilation_h, g.dilation_w) == (1, 1)
            && g.pad_top < k
            && g.pad_left < k
            && g.out_w > 0
            && g.out_w <= MAX_OUT_W
            && g.in_h.checked_mul(g.in_w).is_some_and(|n| n < (1 << 31));
        handles.then_some(MaxPoolArgmax { cpu, g: *g })
    }

    /// Writes each window's argmax (flat input index) into `indices`; `false` (with
    /// `indices` partly written) when a window has no tap above `-inf` or meets a NaN.
    /// The caller checked that `input` holds the plane and `indices` its windows.
    pub(super) fn plane(&self, input: &[f32], indices: &mut [i64]) -> bool {
        let g = &self.g;
        let input = &input[..g.in_h * g.in_w];
        let indices = &mut indices[..g.out_h * g.out_w];
        // SAFETY: `self.cpu` proves AVX-512 F (`new`'s contract); the slices hold the
        // plane and its windows, as sliced above.
        unsafe { walk::<true>(self.cpu, g, input, (indices, &mut [])) }
    }

    /// Writes each window's maximum into `values` (the value at the index
    /// [`Self::plane`] would write; `-inf` for a window with no tap above it); `false`
    /// (with `values` partly written) when a window meets a NaN. The caller checked
    /// that `input` holds the plane and `values` its windows.
    pub(super) fn values(&self, input: &[f32], values: &mut [f32]) -> bool {
        let g = &self.g;
        let input = &input[..g.in_h * g.in_w];
        let values = &mut values[..g.out_h * g.out_w];
        // SAFETY: as in `plane`.
        unsafe { walk::<false>(self.cpu, g, input, (&mut [], values)) }
    }
}

/// Column tap `kx` of one output vector: its lanes' input columns, the lanes whose
/// column lies inside the row, and the masks of its one (stride 1) or two (stride 2)
/// loads. The same for every kernel row and output row.
#[derive(Clone, Copy)]
struct ColumnTap {
    cols: __m512i,
    inside: u16,
    loads: [u16; 2],
}

/// [`MaxPoolArgmax::plane`] (`INDICES`, into `indices`) or [`MaxPoolArgmax::values`]
/// (into `values`).
///
/// # Safety
/// Needs AVX-512 F; `input` holds `in_h * in_w` values, the out `INDICES` picks
/// `out_h * out_w`, and `g` is one [`MaxPoolArgmax::new`] accepted.
#[target_feature(enable = "avx512f")]
unsafe fn walk<const INDICES: bool>(
    _: CpuSupport,
    g: &ConvGeometry,
    input: &[f32],
    (indices, values): (&mut [i64], &mut [f32]),
) -> bool {
    let (k, s) = (g.kernel_h, g.stride_h);
    let (in_w, in_h) = (g.in_w as isize, g.in_h as isize);
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    // Lane l's column offset from the vector's first tap: l * stride.
    let steps = _mm512_mullo_epi32(lane, _mm512_set1_epi32(s as i32));
    for oy in 0..g.out_h {
        let top = (oy * s) as isize - g.pad_top as isize;
        for v in 0..g.out_w.div_ceil(LANES) {
            let ox0 = v * LANES;
            let outputs = (g.out_w - ox0).min(LANES);
            let first = (ox0 * s) as isize - g.pad_left as isize;
            let mut taps = [ColumnTap {
                cols: _mm512_setzero_si512(),
                inside: 0,
                loads: [0; 2],
            }; MAX_K];
            for (kx, tap) in taps.iter_mut().enumerate().take(k) {
                let c0 = first + kx as isize;
                let cols = _mm512_add_epi32(_mm512_set1_epi32(c0 as i32), steps);
                *tap = ColumnTap {
                    cols,
                    inside: _mm512_cmpge_epi32_mask(cols, _mm512_setzero_si512())
                        & _mm512_cmplt_epi32_mask(cols, _mm512_set1_epi32(in_w as i32)),
                    loads: [
                        lanes_inside(c0, in_w, LANES),
                        lanes_inside(c0 + LANES as isize, in_w, LANES),
                    ],
                };
            }
            let mut best = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut from = _mm512_set1_epi32(-1);
            // Lanes that met a NaN (which the comparisons above do not order as the
            // scalar walk does).
            let mut unordered: u16 = 0;
            for ky in 0..k {
                let iy = top + ky as isize;
                if iy < 0 || iy >= in_h {
                    continue;
                }
                let row = input[iy as usize * g.in_w..][..g.in_w].as_ptr();
                let row_start = _mm512_set1_epi32((iy * in_w) as i32);
                for (kx, tap) in taps.iter().enumerate().take(k) {
                    let c0 = first + kx as isize;
                    // SAFETY: every load is masked to the lanes whose column lies in
                    // 0..in_w of row iy (masked lanes read nothing), so the addresses
                    // formed for the others are inside `row`.
                    let x = unsafe {
                        let at = |c: isize| row.wrapping_offset(c);
                        let a = _mm512_maskz_loadu_ps(tap.loads[0], at(c0));
                        if s == 1 {
                            a
                        } else {
                            let b = _mm512_maskz_loadu_ps(tap.loads[1], at(c0 + LANES as isize));
                            _mm512_permutex2var_ps(a, evens, b)
                        }
                    };
                    unordered |= _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(tap.inside, x, x);
                    if !INDICES {
                        // `max(x, best)` is `x` only when `x > best`, without NaN.
                        best = _mm512_mask_max_ps(best, tap.inside, x, best);
                        continue;
                    }
                    let above = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(tap.inside, x, best);
                    best = _mm512_mask_blend_ps(above, best, x);
                    let at = _mm512_add_epi32(row_start, tap.cols);
                    from = _mm512_mask_blend_epi32(above, from, at);
                }
            }
            let live = lanes_inside(0, outputs as isize, LANES);
            if unordered != 0 {
                return false;
            }
            if !INDICES {
                let dst = &mut values[oy * g.out_w + ox0..][..outputs];
                // SAFETY: `dst` holds `outputs` values; the store writes only the lanes
                // of its mask, which lie inside it.
                unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), live, best) };
                continue;
            }
            if _mm512_mask_cmpeq_epi32_mask(live, from, _mm512_set1_epi32(-1)) != 0 {
                return false;
            }
            let dst = &mut indices[oy * g.out_w + ox0..][..outputs];
            let low = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(from));
            let high = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(from));
            // SAFETY: `dst` holds `outputs` values; each store writes only the lanes of
            // its mask, which lie inside it.
            unsafe {
                let p = dst.as_mut_ptr();
                _mm512_mask_storeu_epi64(p, (live & 0xff) as u8, low);
                if outputs > 8 {
                    _mm512_mask_storeu_epi64(p.add(8), (live >> 8) as u8, high);
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The direct kernel's indices, and its values alone, are the scalar walk's,
        /// over window sizes, strides, paddings and rows of one to several vectors,
        /// with ties; a plane with a NaN some window meets is declined.
        #[test]
        fn argmax_matches_the_scalar_walk(
            k in 2usize..=5, s in 1usize..=2, pad in 0usize..5, in_h in 5usize..20,
            in_w in 5usize..80, seed in 0u64..1000, neg_inf_row in any::<bool>(),
            nan_at in proptest::option::of(0usize..1600),
        ) {
            let Some(cpu) = crate::dispatch().gemm.avx512() else {
                return Ok(());
            };
            let pad = pad.min(k - 1).min(k / 2);
            let out_h = (in_h + 2 * pad - k) / s + 1;
            let out_w = (in_w + 2 * pad - k) / s + 1;
            let g = ConvGeometry {
                in_h, in_w, out_h, out_w, kernel_h: k, kernel_w: k, stride_h: s, stride_w: s,
                dilation_h: 1, dilation_w: 1, pad_top: pad, pad_left: pad, groups: 1,
                group_in: 1, group_out: 1,
            };
            // Coarse values, so that windows hold ties; optionally a row of -inf and a
            // NaN.
            let mut input: Vec<f32> = crate::test_util::rand_vec(in_h * in_w, seed)
                .iter()
                .map(|v| (v * 3.0).round())
                .collect();
            if neg_inf_row {
                input[..in_w].fill(f32::NEG_INFINITY);
            }
            let nan_at = nan_at.map(|i| i % input.len());
            if let Some(i) = nan_at {
                input[i] = f32::NAN;
            }
            let Some(kernel) = MaxPoolArgmax::new(cpu, &g) else {
                return Err(TestCaseError::fail("the geometry is one the kernel handles"));
            };
            let want = super::super::max_pool_reference(&g, &input);
            // The values alone: the value at each reference index, -inf without one.
            let mut values = vec![f32::NAN; want.len()];
            if kernel.values(&input, &mut values) {
                for (v, &i) in values.iter().zip(&want) {
                    let at = usize::try_from(i).map_or(f32::NEG_INFINITY, |i| input[i]);
                    prop_assert_eq!(v.to_bits(), at.to_bits());
                }
            } else {
                prop_assert!(nan_at.is_some());
            }
            let mut got = vec![-7i64; want.len()];
            if kernel.plane(&input, &mut got) {
                prop_assert_eq!(got, want);
            } else {
                // Declined only for a NaN or a window with no tap above -inf.
                let windows_without_value = want.iter().any(|&i| i < 0 || input[i as usize] == f32::NEG_INFINITY);
                prop_assert!(windows_without_value || nan_at.is_some());
            }
        }
    }
}
