//! The depthwise plane convolution of a 3x3 filter, stride 2, one pixel of padding
//! above and left, over planes of even height and width whose output rows are 31 to
//! [`MAX_OUT_W`] pixels (MobileNetV2's 112x112 -> 56x56 layer), or a band of such a
//! plane's rows (as threads split it), with AVX-512.
//!
//! The strided kernel for square filters (`depthwise_square`) de-interleaves two loads
//! with two-source permutes for every tap row of every output vector, and permutes
//! share the floating-point pipes with the fused multiply-adds. Here each input row is
//! de-interleaved once, into its even and odd columns (`ee[y][x] = in[2y][2x]`,
//! `eo[y][x] = in[2y][2x + 1]`, `oe[y][x] = in[2y + 1][2x]`, `oo[y][x] = in[2y + 1][2x
//! + 1]`), two output rows ahead of the one that first reads it, into a ring of rows per
//! phase (a few KiB, so it stays in L1). Then every tap is one aligned load (a tap a
//! column back shifted a lane in registers, or on rows of more than six vectors one
//! load across a cache line): output
//! pixel `(y, x)` reads `oo[y - 1][x - 1]`, `oe[y - 1][x]`, `oo[y - 1][x]` (kernel row
//! 0), `eo[y][x - 1]`, `ee[y][x]`, `eo[y][x]` (row 1), `oo[y][x - 1]`, `oe[y][x]`,
//! `oo[y][x]` (row 2). Each phase row sits after a vector of zeros (column `-1`), and
//! the odd rows' ring starts with a row of zeros (row `-1`): the padding.
//!
//! Each output is the bias plus its taps in `(ky, kx)` order with fused multiply-adds,
//! a tap in the padding adding `0 * w`, as in the polyphase kernel; only the sign of a
//! zero sum can differ.

use std::arch::x86_64::*;

use super::{DirectPlane, is_3x3_rows, lanes_inside};
use crate::CpuSupport;
use crate::conv::ConvGeometry;

/// Widest output row the kernel handles.
pub(super) const MAX_OUT_W: usize = 128;

/// Narrowest output row it handles (narrower ones go to `depthwise_phases`).
pub(super) const MIN_OUT_W: usize = 31;

/// Floats of one phase row in the ring: a vector of zeros (column `-1` is its last
/// lane), then the row, rounded up to whole vectors.
const PITCH: usize = 16 + MAX_OUT_W;

/// Most vectors in an output row for which a tap a column back is shifted in registers
/// rather than loaded across a cache line: 64 to 96 pixel rows ran 6-15% faster so,
/// 112 and 128 pixel rows 25-30% slower (AMD EPYC, one thread).
const SHIFT_IN_REGISTERS_MAX_VECTORS: usize = 6;

/// Output rows split ahead of the one being swept, so that its loads do not wait for
/// the stores of its own split.
const AHEAD: usize = 2;

/// Rows of each phase in the ring: the row swept, the odd rows' row before it, and the
/// rows split ahead.
const SLOTS: usize = AHEAD + 2;

/// The ring: for each phase (`ee`, `eo`, `oe`, `oo`) [`SLOTS`] rows, output row `y` in
/// slot `y % SLOTS`.
#[repr(C, align(64))]
struct Ring([[[f32; PITCH]; SLOTS]; 4]);

/// The kernel prepared for one geometry.
pub(super) struct PhaseRows {
    cpu: CpuSupport,
    /// Output rows and columns (the input's columns are twice as many).
    out: (usize, usize),
    /// Rows of padding above the input (1 for a whole plane; 0 for a band of rows
    /// below the first, `ConvGeometry::row_band`, whose row above is input row 0).
    pad_top: usize,
}

impl PhaseRows {
    /// The kernel for `g`, or `None` when it does not handle it: a 3x3 filter, stride 2
    /// and dilation 1 both ways, one pixel of padding left and one or none above, an
    /// input twice as wide as the output with every row the output reads inside it (no
    /// padding below), output rows of [`MIN_OUT_W`] to [`MAX_OUT_W`] pixels: a whole
    /// even-sized plane, or a band of its rows. `cpu` proves AVX-512 F (with AVX2 and
    /// FMA).
    pub(super) fn new(cpu: CpuSupport, g: &ConvGeometry) -> Option<PhaseRows> {
        let handles = is_3x3_rows(g, 2, MIN_OUT_W..=MAX_OUT_W)
            && g.in_w == 2 * g.out_w
            && g.in_h + g.pad_top > 2 * g.out_h;
        handles.then_some(PhaseRows {
            cpu,
            out: (g.out_h, g.out_w),
            pad_top: g.pad_top,
        })
    }

    /// Convolves one plane into `output`; `p` holds the geometry's input plane and taps.
    pub(super) fn plane(&self, p: DirectPlane<'_>, output: &mut [f32]) {
        let (h, w) = self.out;
        // Input rows read: up to 2h + 1 - pad_top.
        let rows = 2 * h + 1 - self.pad_top;
        if p.input.len() < rows * 2 * w || output.len() < h * w || p.filter.len() < 9 {
            return;
        }
        // SAFETY: `self.cpu` proves AVX-512 F, AVX2 and FMA (`new`'s contract); the
        // slices hold the planes' pixels and the filter's taps (checked above).
        unsafe { by_row_vectors!(w, sweep(self.cpu, (self.out, self.pad_top), &p, output)) }
    }
}

/// The plane (or band), row by row: input rows `2y + 1 - pad_top` and the one after split
/// into the ring two output rows ahead, then output row `y` from it.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; `p.input` holds the `2h + 1 - pad_top` input rows of `2w`
/// values the plane reads, `output` the `h x w` output plane, `p.filter` 9 taps;
/// `V == w.div_ceil(16)` and `w <= MAX_OUT_W`.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn sweep<const V: usize>(
    _: CpuSupport,
    ((h, w), pad_top): ((usize, usize), usize),
    p: &DirectPlane<'_>,
    output: &mut [f32],
) {
    let in_w = 2 * w;
    // Zeros everywhere that is never written: the column before each row, the lanes
    // past its end, and the odd rows' row -1 (the last slot, for a whole plane).
    let mut ring = Ring([[[0.0; PITCH]; SLOTS]; 4]);
    // SAFETY (the block): AVX-512 F (the caller's promise). Input loads are masked to
    // the `in_w` values of rows `0` (a band's row above) and `2y + 1 - pad_top` and the
    // one after, below `2h + 1 - pad_top` (the plane's rows); ring stores write lanes
    // `16 + x` for `x < w <= MAX_OUT_W`, inside a row of `PITCH`; ring loads read
    // lanes `0 ..= 31 + 16v` for `v < V`, inside the row; output stores
    // are masked to the `w` pixels of row `y < h`.
    unsafe {
        let wide = p.wide_taps_3x3();
        let (weights, bias) = (wide.weights, wide.bias);
        let input = p.input.as_ptr();
        let out = output.as_mut_ptr();
        let ring: *mut f32 = ring.0.as_mut_ptr().cast();
        // Output row y's middle kernel row reads input row 2y + 1 - pad_top (its even
        // phases), the one below it the row after (its odd phases, which output row
        // y + 1 reads as its row above).
        let middle = |y: usize| input.wrapping_add((2 * y + 1 - pad_top) * in_w);
        if pad_top == 0 {
            // A band below the plane's first row: its row above is input row 0, the odd
            // phases of row -1 (the zeros of the last slot otherwise).
            let [_, _, oe, oo] = phase_rows(ring, SLOTS - 1);
            split_row(input, in_w, (oe, oo));
        }
        for y in 0..h.min(AHEAD) {
            split_rows(middle(y), in_w, phase_rows(ring, y));
        }
        for y in 0..h {
            if y + AHEAD < h {
                let z = y + AHEAD;
                split_rows(middle(z), in_w, phase_rows(ring, z));
            }
            let [ee, eo, oe, oo] = phase_rows(ring, y);
            // Row y - 1 (row -1 is the zeros of the last slot).
            let [_, _, oe_up, oo_up] = phase_rows(ring, y + SLOTS - 1);
            // Every vector of the row at once: independent chains of fused multiply-adds
            // whose latencies overlap.
            let mut acc = [bias; V];
            // Each tap's phase row, and whether it reads a column back (x - 1): that
            // vector is made in registers from the aligned vector and the one before
            // (`valignd`), since a load across a cache line costs twice one inside it.
            let taps: [(*const f32, bool); 9] = [
                (oo_up, true),
                (oe_up, false),
                (oo_up, false),
                (eo, true),
                (ee, false),
                (eo, false),
                (oo, true),
                (oe, false),
                (oo, false),
            ];
            for (t, &(row, back)) in taps.iter().enumerate() {
                // Lanes 0..16 of the ring row: zeros, then column 0 at lane 16.
                let mut before = _mm512_castps_si512(_mm512_load_ps(row));
                for (v, acc) in acc.iter_mut().enumerate() {
                    let x = if V > SHIFT_IN_REGISTERS_MAX_VECTORS {
                        _mm512_loadu_ps(row.add(16 + 16 * v - usize::from(back)))
                    } else {
                        let this = _mm512_castps_si512(_mm512_load_ps(row.add(16 + 16 * v)));
                        let x = if back {
                            _mm512_alignr_epi32::<15>(this, before)
                        } else {
                            this
                        };
                        before = this;
                        _mm512_castsi512_ps(x)
                    };
                    *acc = _mm512_fmadd_ps(x, weights[t], *acc);
                }
            }
            wide.store_row(&acc, out.add(y * w), w);
        }
    }
}

/// The ring rows of output row `y` (slot `y % SLOTS`) of `ee`, `eo`, `oe` and `oo`.
#[inline(always)]
fn phase_rows(ring: *mut f32, y: usize) -> [*mut f32; 4] {
    let slot = y % SLOTS;
    [0, 1, 2, 3].map(|phase| ring.wrapping_add((phase * SLOTS + slot) * PITCH))
}

/// Input rows `2y + 1 - pad_top` (at `src`) and the one after (`in_w` further), split
/// into the even and odd columns of `rows` (`ee`, `eo`, `oe` and `oo`): [`split_row`]
/// of each.
///
/// # Safety
/// As [`split_row`], for both rows.
#[inline(always)]
unsafe fn split_rows(src: *const f32, in_w: usize, rows: [*mut f32; 4]) {
    // SAFETY: the caller's promise.
    unsafe {
        split_row(src, in_w, (rows[0], rows[1]));
        split_row(src.add(in_w), in_w, (rows[2], rows[3]));
    }
}

/// The input row at `src` split into its even and odd columns, each written from lane
/// 16 of its ring row. Lanes past the row's end get zeros (masked loads).
///
/// # Safety
/// AVX-512 F; `src` holds a row of `in_w` values; each ring row has room for
/// `16 + in_w / 2` values rounded up to whole vectors.
#[inline(always)]
unsafe fn split_row(src: *const f32, in_w: usize, (even_cols, odd_cols): (*mut f32, *mut f32)) {
    // SAFETY: the caller's promise; loads are masked to the row's values.
    unsafe {
        let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
        let w = in_w as isize;
        let mut c = 0;
        while c < in_w {
            let (a, b) = if c + 32 <= in_w {
                (
                    _mm512_loadu_ps(src.add(c)),
                    _mm512_loadu_ps(src.add(c + 16)),
                )
            } else {
                (
                    _mm512_maskz_loadu_ps(lanes_inside(c as isize, w, 16), src.add(c)),
                    _mm512_maskz_loadu_ps(lanes_inside((c + 16) as isize, w, 16), src.add(c + 16)),
                )
            };
            let at = 16 + c / 2;
            _mm512_storeu_ps(even_cols.add(at), _mm512_permutex2var_ps(a, evens, b));
            _mm512_storeu_ps(odd_cols.add(at), _mm512_permutex2var_ps(a, odds, b));
            c += 32;
        }
    }
}
