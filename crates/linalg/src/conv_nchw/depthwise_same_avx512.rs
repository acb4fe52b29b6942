//! The depthwise plane convolution of a stride-1 `K x K` filter (K = 3 or 5) whose
//! output has the input's size, read straight from the input plane with AVX-512.
//!
//! Each output row is swept 16 outputs a vector, each tap one load of an input row at
//! the vector's column shifted by the tap's. Vectors whose taps stay inside the row
//! load without a mask; the first and last vectors of a row load with the lanes inside
//! the row (masked lanes read nothing and give 0), worked out once per geometry. Rows
//! near the top and bottom sum only the kernel rows inside the plane. No padded copy of
//! the plane is made.
//!
//! Each output is the bias plus its taps in `(ky, kx)` order with fused multiply-adds,
//! a column tap outside the row adding `0 * w` as in the polyphase kernel; a kernel row
//! outside the plane is skipped rather than added as zeros, which leaves every sum's
//! value unchanged (only the sign of a zero sum can differ).

use std::arch::x86_64::*;

use crate::CpuSupport;
use crate::conv::ConvGeometry;

/// Most output vectors in a row (16 outputs each): rows up to 1024 outputs.
const MAX_VECTORS: usize = 64;

/// Widest filter the kernel handles.
const MAX_K: usize = 5;

/// The kernel prepared for one geometry.
pub(super) struct Same {
    cpu: CpuSupport,
    /// Per output vector of a row and tap column, the lanes of its load that lie inside
    /// the input row and whose output lies inside the output row; `None` for a vector
    /// whose every load is whole and inside.
    masks: [Option<[__mmask16; MAX_K]>; MAX_VECTORS],
}

impl Same {
    /// The kernel for `g`, or `None` when it does not handle it: stride 1, dilation 1, a
    /// square 3x3 or 5x5 filter, an output of the input's size, a plane at least as
    /// large as the filter. `cpu` proves AVX-512 F.
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<Same> {
        let k = g.kernel_h;
        let handles = (k == 3 || k == 5)
            && g.kernel_w == k
            && (g.stride_h, g.stride_w, g.dilation_h, g.dilation_w) == (1, 1, 1, 1)
            && g.pad_top < k
            && g.pad_left < k
            && (g.out_h, g.out_w) == (g.in_h, g.in_w)
            && g.in_h >= k
            && g.in_w >= k
            && g.in_w <= 16 * MAX_VECTORS
            && g.in_h.checked_mul(g.in_w).is_some_and(|n| n < (1 << 31));
        if !handles {
            return None;
        }
        let w = g.in_w as isize;
        let mut masks = [None; MAX_VECTORS];
        for (v, m) in masks.iter_mut().enumerate().take(g.in_w.div_ceil(16)) {
            let first = 16 * v as isize - g.pad_left as isize;
            let whole = first >= 0 && first + 16 + k as isize - 1 <= w;
            if !whole {
                let lanes = lanes_inside(16 * v as isize, w);
                *m = Some(std::array::from_fn(|kx| {
                    lanes & lanes_inside(first + kx as isize, w)
                }));
            }
        }
        Some(Same { cpu, masks })
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
        let n = g.in_h * g.in_w;
        let (input, output) = (&input[..n], &mut output[..n]);
        let k = g.kernel_h;
        let filter = &filter[..k * k];
        let bounds = clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
        // SAFETY: `self.cpu` proves AVX-512 F (and AVX2 with FMA) was detected; the
        // geometry is one `new` accepted, and the slices hold its planes.
        unsafe {
            match k {
                3 => run::<3>(
                    self.cpu,
                    g,
                    input,
                    filter,
                    (bias, bounds),
                    &self.masks,
                    output,
                ),
                _ => run::<5>(
                    self.cpu,
                    g,
                    input,
                    filter,
                    (bias, bounds),
                    &self.masks,
                    output,
                ),
            }
        }
    }
}

/// Lanes `l` of a 16-lane load at column `base` whose column `base + l` lies in
/// `0..width`.
fn lanes_inside(base: isize, width: isize) -> __mmask16 {
    let lo = (-base).clamp(0, 16) as u32;
    let hi = (width - base).clamp(lo as isize, 16) as u32;
    let below_hi = if hi == 16 { u32::MAX } else { (1u32 << hi) - 1 };
    (below_hi & !((1u32 << lo) - 1)) as __mmask16
}

/// Output rows summed together where every kernel row of each is inside the plane:
/// independent chains of fused multiply-adds, so that their latency overlaps, and each
/// input row loaded once for all of them.
const ROWS: usize = 4;

/// The plane: blocks of [`ROWS`] rows where their kernel rows are all inside the plane,
/// single rows near the top and bottom; each row 16 outputs a vector.
///
/// # Safety
/// AVX-512 F and FMA; `g` is accepted by [`Same::new`] with `kernel_h == K`, `masks`
/// were made for it; `input` and `output` hold `in_h * in_w` values and `filter`
/// `K * K`.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn run<const K: usize>(
    _cpu: CpuSupport,
    g: &ConvGeometry,
    input: &[f32],
    filter: &[f32],
    (bias, (lo, hi)): (f32, (f32, f32)),
    masks: &[Option<[__mmask16; MAX_K]>; MAX_VECTORS],
    output: &mut [f32],
) {
    let (h, w) = (g.in_h, g.in_w);
    let mut weights = [[_mm512_setzero_ps(); K]; K];
    for (ky, row) in weights.iter_mut().enumerate() {
        for (kx, wv) in row.iter_mut().enumerate() {
            *wv = _mm512_set1_ps(filter[ky * K + kx]);
        }
    }
    let plane = Plane {
        input: input.as_ptr(),
        output: output.as_mut_ptr(),
        w,
        pad: (g.pad_top, g.pad_left),
        weights: &weights,
        bias,
        bounds: (_mm512_set1_ps(lo), _mm512_set1_ps(hi)),
    };
    let vectors = w.div_ceil(16);
    // Rows whose kernel rows are all inside the plane.
    let inside = g.pad_top..h + g.pad_top + 1 - K;
    let mut oy = 0;
    while oy < h {
        if inside.contains(&oy) && oy + ROWS <= inside.end {
            for (v, mask) in masks.iter().enumerate().take(vectors) {
                // SAFETY: the rows' kernel rows are inside the plane, and the vector's
                // masks were made for this geometry.
                unsafe {
                    match mask {
                        None => plane.rows::<ROWS, false>(oy, v, &[0xffff; MAX_K]),
                        Some(m) => plane.rows::<ROWS, true>(oy, v, m),
                    }
                }
            }
            oy += ROWS;
        } else if inside.contains(&oy) {
            for (v, mask) in masks.iter().enumerate().take(vectors) {
                // SAFETY: as above, for one row.
                unsafe {
                    match mask {
                        None => plane.rows::<1, false>(oy, v, &[0xffff; MAX_K]),
                        Some(m) => plane.rows::<1, true>(oy, v, m),
                    }
                }
            }
            oy += 1;
        } else {
            let rows = g.pad_top.saturating_sub(oy)..(h + g.pad_top - oy).min(K);
            for (v, mask) in masks.iter().enumerate().take(vectors) {
                // SAFETY: `rows` are the row's kernel rows inside the plane.
                unsafe { plane.edge_row(oy, v, rows.clone(), mask.as_ref()) };
            }
            oy += 1;
        }
    }
}

/// One plane's operands, shared by its rows.
struct Plane<'a, const K: usize> {
    input: *const f32,
    output: *mut f32,
    w: usize,
    /// (top, left) padding.
    pad: (usize, usize),
    weights: &'a [[__m512; K]; K],
    bias: f32,
    /// The clamp's (lower, upper) bound in every lane.
    bounds: (__m512, __m512),
}

impl<const K: usize> Plane<'_, K> {
    /// Where tap `(0, 0)` of vector `v` of output row `oy` reads: tap `(ky, kx)` reads
    /// `ky * w + kx` further.
    #[inline(always)]
    fn first_tap(&self, oy: usize, v: usize) -> *const f32 {
        let (top, left) = self.pad;
        let offset = (oy * self.w + 16 * v) as isize - (top * self.w + left) as isize;
        self.input.wrapping_offset(offset)
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
        let lanes = (self.w - 16 * v).min(16);
        let mask = ((1u32 << lanes) - 1) as __mmask16;
        // SAFETY: the vector's `lanes` outputs lie inside output row `oy`.
        unsafe { _mm512_mask_storeu_ps(self.output.add(oy * self.w + 16 * v), mask, sum) };
    }

    /// Vector `v` of output rows `oy..oy + R`, every kernel row of each inside the
    /// plane: input rows `oy - pad_top ..` loaded once each and added to every output
    /// row they reach, each output's taps in `(ky, kx)` order.
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
        masks: &[__mmask16; MAX_K],
    ) {
        let at = self.first_tap(oy, v);
        let mut acc = [_mm512_set1_ps(self.bias); R];
        for i in 0..R + K - 1 {
            let row = at.wrapping_add(i * self.w);
            for kx in 0..K {
                // SAFETY: input row `oy - pad_top + i` is inside the plane, and the load
                // stays inside it (whole, or masked lanes reading nothing).
                let x = unsafe {
                    if MASKED {
                        _mm512_maskz_loadu_ps(masks[kx], row.wrapping_add(kx))
                    } else {
                        _mm512_loadu_ps(row.wrapping_add(kx))
                    }
                };
                for (r, a) in acc.iter_mut().enumerate() {
                    // Input row i is kernel row i - r of output row oy + r.
                    if let Some(wr) = i.checked_sub(r).and_then(|ky| self.weights.get(ky)) {
                        *a = _mm512_fmadd_ps(x, wr[kx], *a);
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
    unsafe fn edge_row(
        &self,
        oy: usize,
        v: usize,
        rows: std::ops::Range<usize>,
        masks: Option<&[__mmask16; MAX_K]>,
    ) {
        let at = self.first_tap(oy, v);
        let mut acc = _mm512_set1_ps(self.bias);
        for ky in rows {
            for kx in 0..K {
                let p = at.wrapping_add(ky * self.w + kx);
                // SAFETY: kernel row ky of row oy is inside the plane, and the load stays
                // inside its row.
                let x = unsafe {
                    match masks {
                        None => _mm512_loadu_ps(p),
                        Some(m) => _mm512_maskz_loadu_ps(m[kx], p),
                    }
                };
                acc = _mm512_fmadd_ps(x, self.weights[ky][kx], acc);
            }
        }
        // SAFETY: row oy is an output row.
        unsafe { self.store(oy, v, acc) };
    }
}
