//! The depthwise plane convolution of a square `K x K` filter (K = 3 or 5) with stride
//! `S` (1 or 2) in both directions and no dilation, read straight from the input plane
//! with AVX-512: no padded copy of the plane is made.
//!
//! Each output row is swept 16 outputs a vector. With stride 1, tap column `kx` of a
//! vector is one load of the input row shifted by `kx`; with stride 2 it is the even or
//! odd lanes of two loads (32 input columns) shifted by `kx & !1`, gathered by one
//! permute. A vector whose loads all lie inside the row loads without a mask; the first
//! and last vectors of a row load only the lanes inside the row (masked lanes read
//! nothing and give 0), masks worked out once per geometry. Rows whose kernel rows are
//! all inside the plane go four at a time, each input row loaded (and de-interleaved)
//! once for every output row it reaches; rows near the top and bottom go one at a time
//! with only their kernel rows inside the plane.
//!
//! Each output is the bias plus its taps in `(ky, kx)` order with fused multiply-adds, a
//! column tap outside the row adding `0 * w` as in the polyphase kernel; a kernel row
//! outside the plane is skipped rather than added as zeros, which leaves every sum's
//! value unchanged (only the sign of a zero sum can differ).

use std::arch::x86_64::*;
use std::ops::Range;

use super::depthwise_avx512::lanes_inside;
use crate::CpuSupport;
use crate::conv::ConvGeometry;

/// Most output vectors in a row (16 outputs each): rows up to 1024 outputs.
const MAX_VECTORS: usize = 64;

/// Widest filter the kernel handles.
const MAX_K: usize = 5;

/// Output rows summed together where every kernel row of each is inside the plane:
/// independent chains of fused multiply-adds, so that their latency overlaps, and each
/// input row loaded once for all of them.
const ROWS: usize = 4;

/// Per load of an output vector's row (load `j` at column offset `j` with stride 1, the
/// pair at `2 * j` and `2 * j + 16` with stride 2), the lanes inside the input row.
type LoadMasks = [[__mmask16; 2]; MAX_K];

/// The kernel prepared for one geometry.
pub(super) struct Square {
    cpu: CpuSupport,
    /// Per output vector of a row, the masks of its loads; `None` for a vector whose
    /// every load is whole and inside the row and whose outputs all lie in the row.
    masks: [Option<LoadMasks>; MAX_VECTORS],
}

impl Square {
    /// The kernel for `g`, or `None` when it does not handle it: a 3x3 or 5x5 filter,
    /// stride 1 or 2 (the same both ways), dilation 1, padding narrower than the filter,
    /// a plane at least as large as the filter, rows of at most 1024 outputs. `cpu`
    /// proves AVX-512 F.
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<Square> {
        let (k, s) = (g.kernel_h, g.stride_h);
        let handles = (k == 3 || k == 5)
            && g.kernel_w == k
            && (s == 1 || s == 2)
            && g.stride_w == s
            && (g.dilation_h, g.dilation_w) == (1, 1)
            && g.pad_top < k
            && g.pad_left < k
            && g.in_h >= k
            && g.in_w >= k
            && g.out_h > 0
            && g.out_w > 0
            && g.out_w <= 16 * MAX_VECTORS
            && g.in_h.checked_mul(g.in_w).is_some_and(|n| n < (1 << 31));
        if !handles {
            return None;
        }
        let (w, out_w) = (g.in_w as isize, g.out_w as isize);
        let mut masks = [None; MAX_VECTORS];
        for (v, m) in masks.iter_mut().enumerate().take(g.out_w.div_ceil(16)) {
            let first = (s * 16 * v) as isize - g.pad_left as isize;
            // Columns loaded: `first ..= first + last` (the last load's last lane).
            let last = if s == 1 {
                k - 1 + 15
            } else {
                2 * (k.div_ceil(2) - 1) + 31
            } as isize;
            let whole = first >= 0 && first + last < w && 16 * (v as isize + 1) <= out_w;
            if whole {
                continue;
            }
            *m = Some(std::array::from_fn(|j| {
                let at = first + (s * j) as isize;
                if s == 1 {
                    [lanes_inside(at, w), 0]
                } else {
                    [lanes_inside(at, w), lanes_inside(at + 16, w)]
                }
            }));
        }
        Some(Square { cpu, masks })
    }

    /// Convolves one plane (`in_h x in_w`, `filter` of `kernel_h x kernel_w`) into
    /// `output` (`out_h x out_w`), then clamps into `clamp` when given. `g` is the
    /// geometry the kernel was prepared for; the caller checked the slice lengths.
    pub(super) fn plane(
        &self,
        g: &ConvGeometry,
        (input, filter): (&[f32], &[f32]),
        (bias, clamp): (f32, Option<(f32, f32)>),
        output: &mut [f32],
    ) {
        let input = &input[..g.in_h * g.in_w];
        let output = &mut output[..g.out_h * g.out_w];
        let filter = &filter[..g.kernel_h * g.kernel_w];
        let bounds = clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
        let operands = (input, filter, (bias, bounds), &self.masks);
        // SAFETY: `self.cpu` proves AVX-512 F (and AVX2 with FMA) was detected; the
        // geometry is one `new` accepted, the masks were made for it, and the slices
        // hold its planes.
        unsafe {
            match (g.kernel_h, g.stride_h) {
                (3, 1) => run::<3, 1>(self.cpu, g, operands, output),
                (3, _) => run::<3, 2>(self.cpu, g, operands, output),
                (_, 1) => run::<5, 1>(self.cpu, g, operands, output),
                _ => run::<5, 2>(self.cpu, g, operands, output),
            }
        }
    }
}

/// Input plane, filter, (bias, clamp bounds) and load masks of one plane.
type Operands<'a> = (
    &'a [f32],
    &'a [f32],
    (f32, (f32, f32)),
    &'a [Option<LoadMasks>; MAX_VECTORS],
);

/// The plane: blocks of [`ROWS`] rows where their kernel rows are all inside the plane,
/// single rows elsewhere.
///
/// # Safety
/// AVX-512 F and FMA; `g` is accepted by [`Square::new`] with `kernel_h == K` and
/// `stride_h == S`, the masks were made for it; `input` holds `in_h * in_w` values,
/// `output` `out_h * out_w` and `filter` `K * K`.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn run<const K: usize, const S: usize>(
    _cpu: CpuSupport,
    g: &ConvGeometry,
    (input, filter, (bias, (lo, hi)), masks): Operands<'_>,
    output: &mut [f32],
) {
    let mut weights = [[_mm512_setzero_ps(); K]; K];
    for (ky, row) in weights.iter_mut().enumerate() {
        for (kx, wv) in row.iter_mut().enumerate() {
            *wv = _mm512_set1_ps(filter[ky * K + kx]);
        }
    }
    let plane = Plane::<K, S> {
        input: input.as_ptr(),
        output: output.as_mut_ptr(),
        g,
        weights: &weights,
        bias,
        bounds: (_mm512_set1_ps(lo), _mm512_set1_ps(hi)),
    };
    let (h, pad_top) = (g.in_h, g.pad_top);
    let vectors = masks.iter().enumerate().take(g.out_w.div_ceil(16));
    // Rows whose kernel rows are all inside the plane: `S * oy >= pad_top` and
    // `S * oy - pad_top + K <= h`.
    let inside = pad_top.div_ceil(S)..((h + pad_top - K) / S + 1).min(g.out_h);
    let mut oy = 0;
    while oy < g.out_h {
        let block = if inside.contains(&oy) && oy + ROWS <= inside.end {
            ROWS
        } else {
            1
        };
        for (v, mask) in vectors.clone() {
            // SAFETY: the rows summed are inside the plane (all kernel rows for rows in
            // `inside`, the rows `kernel_rows` gives otherwise), and the vector's masks
            // were made for this geometry.
            unsafe {
                match (block, mask) {
                    (ROWS, None) => plane.rows::<ROWS, false>(oy, v, &[[0xffff; 2]; MAX_K]),
                    (ROWS, Some(m)) => plane.rows::<ROWS, true>(oy, v, m),
                    (_, _) if inside.contains(&oy) => match mask {
                        None => plane.rows::<1, false>(oy, v, &[[0xffff; 2]; MAX_K]),
                        Some(m) => plane.rows::<1, true>(oy, v, m),
                    },
                    (_, _) => plane.edge_row(oy, v, plane.kernel_rows(oy), mask.as_ref()),
                }
            }
        }
        oy += block;
    }
}

/// One plane's operands, shared by its rows.
struct Plane<'a, const K: usize, const S: usize> {
    input: *const f32,
    output: *mut f32,
    g: &'a ConvGeometry,
    weights: &'a [[__m512; K]; K],
    bias: f32,
    /// The clamp's (lower, upper) bound in every lane.
    bounds: (__m512, __m512),
}

impl<const K: usize, const S: usize> Plane<'_, K, S> {
    /// The kernel rows of output row `oy` that lie inside the plane.
    fn kernel_rows(&self, oy: usize) -> Range<usize> {
        let top = S * oy;
        self.g.pad_top.saturating_sub(top)..(self.g.in_h + self.g.pad_top - top).min(K)
    }

    /// Where tap `(0, 0)` of vector `v` of output row `oy` reads (it may lie outside
    /// the plane): kernel row `ky` is `ky * in_w` further.
    #[inline(always)]
    fn first_tap(&self, oy: usize, v: usize) -> *const f32 {
        let g = self.g;
        let offset =
            (S * oy * g.in_w + S * 16 * v) as isize - (g.pad_top * g.in_w + g.pad_left) as isize;
        self.input.wrapping_offset(offset)
    }

    /// The `K` tap vectors of one input row for one output vector: tap column `kx` in
    /// lane `l` is the row's value at `S * l + kx` from `row`.
    ///
    /// # Safety
    /// AVX-512 F; without `MASKED` every load is inside the row, with it `masks` keep
    /// the lanes read inside it.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn taps<const MASKED: bool>(&self, row: *const f32, masks: &LoadMasks) -> [__m512; K] {
        // SAFETY (every load): the caller's promise; masked-off lanes read nothing.
        let load = |at: usize, mask: __mmask16| unsafe {
            if MASKED {
                _mm512_maskz_loadu_ps(mask, row.wrapping_add(at))
            } else {
                _mm512_loadu_ps(row.wrapping_add(at))
            }
        };
        let mut x = [_mm512_setzero_ps(); K];
        if S == 1 {
            for (kx, x) in x.iter_mut().enumerate() {
                *x = load(kx, masks[kx][0]);
            }
        } else {
            let evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            let odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
            for j in 0..K.div_ceil(2) {
                let (a, b) = (load(2 * j, masks[j][0]), load(2 * j + 16, masks[j][1]));
                x[2 * j] = _mm512_permutex2var_ps(a, evens, b);
                if 2 * j + 1 < K {
                    x[2 * j + 1] = _mm512_permutex2var_ps(a, odds, b);
                }
            }
        }
        x
    }

    /// Clamps `sum` and stores the lanes of vector `v` of output row `oy` inside it.
    ///
    /// # Safety
    /// AVX-512 F; row `oy` is a row of the output plane and `v` one of its vectors.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn store(&self, oy: usize, v: usize, sum: __m512) {
        // Operand order keeps NaN and a signed zero equal to a bound (see
        // `output_clamp`).
        let sum = _mm512_min_ps(self.bounds.1, _mm512_max_ps(self.bounds.0, sum));
        let out_w = self.g.out_w;
        let lanes = (out_w - 16 * v).min(16);
        let mask = ((1u32 << lanes) - 1) as __mmask16;
        // SAFETY: the vector's `lanes` outputs lie inside output row `oy`.
        unsafe { _mm512_mask_storeu_ps(self.output.add(oy * out_w + 16 * v), mask, sum) };
    }

    /// Vector `v` of output rows `oy..oy + R`, every kernel row of each inside the
    /// plane: each input row they read loaded once and added to every output row it
    /// reaches, each output's taps in `(ky, kx)` order.
    ///
    /// # Safety
    /// AVX-512 F and FMA; the rows' kernel rows are inside the plane; without `MASKED`
    /// every load of vector `v` is inside its row, with it `masks` keep them inside.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn rows<const R: usize, const MASKED: bool>(
        &self,
        oy: usize,
        v: usize,
        masks: &LoadMasks,
    ) {
        let at = self.first_tap(oy, v);
        let mut acc = [_mm512_set1_ps(self.bias); R];
        for i in 0..S * (R - 1) + K {
            // SAFETY: input row `S * oy - pad_top + i` is inside the plane.
            let x = unsafe { self.taps::<MASKED>(at.wrapping_add(i * self.g.in_w), masks) };
            for (r, a) in acc.iter_mut().enumerate() {
                // Input row i is kernel row i - S * r of output row oy + r.
                if let Some(wr) = i.checked_sub(S * r).and_then(|ky| self.weights.get(ky)) {
                    for (&x, &wv) in x.iter().zip(wr) {
                        *a = _mm512_fmadd_ps(x, wv, *a);
                    }
                }
            }
        }
        for (r, &a) in acc.iter().enumerate() {
            // SAFETY: rows oy..oy + R are output rows.
            unsafe { self.store(oy + r, v, a) };
        }
    }

    /// Vector `v` of output row `oy`, summing kernel rows `rows` (those inside the
    /// plane), masked when `masks` is given.
    ///
    /// # Safety
    /// AVX-512 F and FMA; `rows` are the row's kernel rows inside the plane; without
    /// `masks` every load of vector `v` is inside its row, with them the masks keep the
    /// loads inside.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn edge_row(&self, oy: usize, v: usize, rows: Range<usize>, masks: Option<&LoadMasks>) {
        let at = self.first_tap(oy, v);
        let mut acc = _mm512_set1_ps(self.bias);
        for ky in rows {
            let row = at.wrapping_add(ky * self.g.in_w);
            // SAFETY: kernel row ky of row oy is inside the plane, and the loads stay
            // inside its row.
            let x = unsafe {
                match masks {
                    None => self.taps::<false>(row, &[[0xffff; 2]; MAX_K]),
                    Some(m) => self.taps::<true>(row, m),
                }
            };
            for (&x, &wv) in x.iter().zip(&self.weights[ky]) {
                acc = _mm512_fmadd_ps(x, wv, acc);
            }
        }
        // SAFETY: row oy is an output row.
        unsafe { self.store(oy, v, acc) };
    }
}
