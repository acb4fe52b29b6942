//! The depthwise plane convolution with column stride 2, read straight from the input
//! plane with AVX-512: 16 outputs of a row a vector, each tap two masked loads of the
//! input row (lanes in the padding load 0 and fault nothing) and an even-lane permute.
//! No phase planes are written and no rows copied out: the sums go straight to the
//! output with a masked store for a row's last vector. Vectors are summed four at a
//! time, so that their chains of fused multiply-adds overlap.
//!
//! Each output is the bias plus its taps in `(ky, kx)` order with fused multiply-adds,
//! the padding taps adding `0 * w`, exactly as in the polyphase kernel, so the two give
//! the same bits.

use std::arch::x86_64::*;

use super::{DirectPlane, lanes_inside};
use crate::CpuSupport;
use crate::conv::ConvGeometry;

/// Most taps the kernel keeps in registers (larger filters use the polyphase kernel).
const MAX_TAPS: usize = 25;

/// Widest filter (columns) the kernel handles.
const MAX_KW: usize = 8;

/// Most output vectors in a row (16 outputs each): rows up to 1024 outputs.
const MAX_VECTORS: usize = 64;

/// Per output vector of a row and tap column, the lanes of its (first, second) load
/// that lie inside the input row.
type RowMasks = [[(__mmask16, __mmask16); MAX_KW]; MAX_VECTORS];

/// True when the direct kernel handles `g`: column stride 2 and dilation 1, at most
/// [`MAX_TAPS`] taps ([`MAX_KW`] columns), rows of at most [`MAX_VECTORS`] vectors.
/// With stride 2 the polyphase kernel spends more splitting the phases than this kernel
/// spends de-interleaving in registers. (3x3 and 5x5 filters with stride 1 or 2 both
/// ways have their own kernel, `depthwise_square`; stride 1 through this one was
/// no faster than the polyphase kernel.)
fn handles(g: &ConvGeometry) -> bool {
    g.stride_w == 2
        && g.dilation_w == 1
        && g.stride_h >= 1
        && g.kernel_h * g.kernel_w <= MAX_TAPS
        && g.kernel_w <= MAX_KW
        && g.out_w <= 16 * MAX_VECTORS
        && g.in_w < (1 << 30)
        && g.pad_left < (1 << 30)
}

/// The direct kernel prepared for one geometry: which lanes of each load lie inside
/// the input row (they depend on the vector's column and the tap's only, so they are
/// worked out once, not per plane).
pub(super) struct Direct {
    cpu: CpuSupport,
    masks: RowMasks,
}

impl Direct {
    /// The kernel for `g`, or `None` when it does not [handle](handles) it; `cpu` proves
    /// AVX-512 F.
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<Direct> {
        if !handles(g) {
            return None;
        }
        let mut masks: RowMasks = [[(0, 0); MAX_KW]; MAX_VECTORS];
        let width = g.in_w as isize;
        for (v, row) in masks.iter_mut().enumerate().take(g.out_w.div_ceil(16)) {
            let first = (g.stride_w * 16 * v) as isize - g.pad_left as isize;
            for (kx, m) in row.iter_mut().enumerate().take(g.kernel_w) {
                let base = first + kx as isize;
                *m = (
                    lanes_inside(base, width, 16),
                    lanes_inside(base + 16, width, 16),
                );
            }
        }
        Some(Direct { cpu, masks })
    }

    /// Convolves one plane into `output` (`out_h x out_w`); `g` is the geometry the
    /// kernel was prepared for.
    pub(super) fn plane(&self, g: &ConvGeometry, p: DirectPlane<'_>, output: &mut [f32]) {
        if g.out_w == 0 || g.out_h == 0 {
            return;
        }
        let (input, filter, bias) = (p.input, p.filter, p.bias);
        // Infinite bounds clamp nothing (NaN and signed zeros kept).
        let clamp = Some(p.bounds);
        let output = &mut output[..g.out_h * g.out_w];
        // SAFETY: `self.cpu` proves AVX-512 F was detected on this CPU; the slices are
        // cut to the geometry's lengths (`DirectPlane`, the output above), which is all
        // `run` reads and writes, and the masks were made for this geometry.
        unsafe {
            run(
                self.cpu,
                g,
                input,
                filter,
                (bias, clamp),
                &self.masks,
                output,
            )
        }
    }
}

/// Output vectors summed together: independent chains of fused multiply-adds, so that
/// their latency overlaps.
const GROUP: usize = 4;

/// One output vector: up to 16 outputs of row `oy` from column `ox0 = 16 * v`.
#[derive(Clone, Copy, Default)]
struct Unit {
    oy: usize,
    v: usize,
    ox0: usize,
    /// Outputs in the vector (0: none, a filler in the last group).
    lanes: usize,
}

/// The body of [`plane`]: the plane's output vectors, row by row, [`GROUP`] at a time.
///
/// # Safety
/// AVX-512 F; `input`, `filter` and `output` hold the geometry's planes.
#[target_feature(enable = "avx512f")]
unsafe fn run(
    _cpu: CpuSupport,
    g: &ConvGeometry,
    input: &[f32],
    filter: &[f32],
    (bias, clamp): (f32, Option<(f32, f32)>),
    masks: &RowMasks,
    output: &mut [f32],
) {
    let mut weights = [_mm512_setzero_ps(); MAX_TAPS];
    for (w, &f) in weights.iter_mut().zip(filter) {
        *w = _mm512_set1_ps(f);
    }
    let per_row = g.out_w.div_ceil(16);
    let (mut oy, mut v) = (0, 0);
    while oy < g.out_h {
        let mut units = [Unit::default(); GROUP];
        for unit in units.iter_mut() {
            if oy == g.out_h {
                break;
            }
            let ox0 = 16 * v;
            *unit = Unit {
                oy,
                v,
                ox0,
                lanes: (g.out_w - ox0).min(16),
            };
            v += 1;
            if v == per_row {
                (oy, v) = (oy + 1, 0);
            }
        }
        // SAFETY: as for `run`; the units are output vectors of the plane.
        unsafe { group(g, (input, &weights, masks), (bias, clamp), &units, output) };
    }
}

/// Sums, clamps and stores the vectors `units`: for every tap, two masked loads, an
/// even-lane permute and one fused multiply-add per vector, with no branch (a padding
/// row loads with an empty mask, which reads nothing and gives 0).
///
/// # Safety
/// AVX-512 F; `input` and `output` hold the geometry's planes, and every unit with
/// lanes lies inside the output.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn group(
    g: &ConvGeometry,
    (input, weights, masks): (&[f32], &[__m512; MAX_TAPS], &RowMasks),
    (bias, clamp): (f32, Option<(f32, f32)>),
    units: &[Unit; GROUP],
    output: &mut [f32],
) {
    let (kh, kw) = (g.kernel_h, g.kernel_w);
    let ih = g.in_h as isize;
    let evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    // Per vector: its first input column for tap column 0, and for each kernel row the
    // input row (the plane's start for a padding row) and whether it is inside.
    let mut first = [0isize; GROUP];
    let mut rows = [[input.as_ptr(); MAX_TAPS]; GROUP];
    let mut inside = [[0 as __mmask16; MAX_TAPS]; GROUP];
    for u in 0..GROUP {
        first[u] = (g.stride_w * units[u].ox0) as isize - g.pad_left as isize;
        for ky in 0..kh {
            let iy = (units[u].oy * g.stride_h + ky * g.dilation_h) as isize - g.pad_top as isize;
            if units[u].lanes > 0 && (0..ih).contains(&iy) {
                rows[u][ky] = input[iy as usize * g.in_w..].as_ptr();
                inside[u][ky] = 0xffff;
            }
        }
    }
    let mut acc = [_mm512_set1_ps(bias); GROUP];
    for ky in 0..kh {
        for kx in 0..kw {
            let w = weights[ky * kw + kx];
            for u in 0..GROUP {
                let (mask_a, mask_b) = masks[units[u].v][kx];
                let (row, row_in) = (rows[u][ky], inside[u][ky]);
                let base = first[u] + kx as isize;
                // SAFETY: `row` starts an input row of `in_w` values when `row_in` is
                // set, and the masks keep every lane read inside it; with `row_in`
                // clear nothing is read. Masked lanes fault nothing, so the address may
                // point before or past the row.
                let x = unsafe {
                    let a = _mm512_maskz_loadu_ps(mask_a & row_in, row.wrapping_offset(base));
                    let b = _mm512_maskz_loadu_ps(mask_b & row_in, row.wrapping_offset(base + 16));
                    _mm512_permutex2var_ps(a, evens, b)
                };
                acc[u] = _mm512_fmadd_ps(x, w, acc[u]);
            }
        }
    }
    let (lo, hi) = clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
    let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
    for (u, &unit) in units.iter().enumerate() {
        if unit.lanes == 0 {
            continue;
        }
        let mut sum = acc[u];
        if clamp.is_some() {
            // Operand order keeps NaN and a signed zero equal to a bound (see
            // `output_clamp`).
            sum = _mm512_min_ps(hi, _mm512_max_ps(lo, sum));
        }
        let mask = if unit.lanes == 16 {
            0xffff
        } else {
            ((1u32 << unit.lanes) - 1) as __mmask16
        };
        let at = unit.oy * g.out_w + unit.ox0;
        // SAFETY: the unit's `lanes` outputs from `at` lie inside the output plane.
        unsafe { _mm512_mask_storeu_ps(output[at..].as_mut_ptr(), mask, sum) };
    }
}
