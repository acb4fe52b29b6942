//! A convolution with few input channels and a short depth (a network's stem: 3x3 or
//! 7x7 over 3 channels, stride 2) as GEMM tiles that read B straight from the phase
//! planes ([`super::Im2col::phase_split`]) instead of packing im2col panels from them.
//!
//! In phase planes, every im2col row `k` (input channel `ci`, tap `(ky, kx)`) of output
//! pixel `(oy, ox)` lies at `offset(k) + oy * pitch + ox`: a tile of 8 output channels
//! by 32 pixels of one output row reads, at each step `k`, two vectors at
//! `row_start + offset(k)`. The packed GEMM copies each of those vectors once into a
//! panel and reads it back; with a depth of 27 (MobileNetV2's stem) that copy costs a
//! third of the multiply. Here the tile loads it in place and the filter's rows are
//! read in place too, so nothing is packed.
//!
//! Each output is the sum of its products in `k` order with fused multiply-adds from 0,
//! then the bias added, then the clamp: what the GEMM's micro-kernel computes for a
//! depth of at most one block, so the two agree to the bit.

use crate::conv::ConvGeometry;
use crate::simd_x86::{Vector, Wide, first_lanes};

/// Rows (output channels) of a tile.
pub(super) const TILE_ROWS: usize = 8;

/// Most steps (`group_in * kernel_h * kernel_w`) of a convolution run here: the GEMM's
/// depth block, so that the sums are the GEMM's.
pub(super) const MAX_DEPTH: usize = 256;

/// The operands of one band of output rows: the filter (`[group_out, depth]` row
/// major), the bias (one per output channel, or none), the clamp's bounds (infinite for
/// none), and the phase planes with each step's offset in them.
pub(super) struct Band<'a> {
    pub(super) filter: &'a [f32],
    pub(super) bias: Option<&'a [f32]>,
    pub(super) bounds: (f32, f32),
    pub(super) planes: &'a [f32],
    pub(super) offsets: &'a [usize],
    pub(super) pitch: usize,
}

/// Output rows `rows` of every output channel of `g`, into `out` (its element
/// `(channel, p)` at `out[channel * ld + p - rows.start * out_w]`, the band's pixels of
/// each channel's plane).
///
/// A tile's two vectors are two runs of 16 pixels, each inside one output row: with
/// rows a whole number of vectors wide (112 pixels: 7) the band's pixels are taken in
/// order, two vectors at a time across row ends; otherwise each row is tiled on its own,
/// its last tile masked.
///
/// # Safety
/// The CPU has AVX-512 F. `band.filter` holds `group_out * depth` values with
/// `group_out` a multiple of [`TILE_ROWS`], `band.bias` (if any) `group_out`, and
/// `band.offsets` `depth` offsets with `offset + (out_h - 1) * pitch + out_w <=
/// planes.len()` for each. `out` points at `group_out` rows of `rows.len() * out_w`
/// writable values, `ld` apart.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn band(
    g: &ConvGeometry,
    band: &Band<'_>,
    rows: std::ops::Range<usize>,
    (out, ld): (*mut f32, usize),
) {
    let lanes = Wide::LANES;
    // The `v`-th run of `lanes` pixels of the band: its B base (row `oy`, column `ox`
    // of the phase planes), its output offset, and its width.
    let run = |oy: usize, ox: usize, cols: usize| Run {
        b: band.planes.as_ptr().wrapping_add(oy * band.pitch + ox),
        c: (oy - rows.start) * g.out_w + ox,
        cols,
    };
    let tiles = |first: Run, second: Run| {
        for p in (0..g.group_out).step_by(TILE_ROWS) {
            // SAFETY: the caller's promises: each run's B vectors lie inside the planes
            // (the largest offset plus the last row's end fits) for its `cols` lanes, the
            // tile's filter rows inside the filter, its outputs inside the band's rows.
            unsafe {
                tile(
                    band.filter.as_ptr().add(p * band.offsets.len()),
                    band.offsets,
                    (first, second),
                    (band.bias.map(|b| b.as_ptr().add(p)), band.bounds),
                    (out.add(p * ld), ld),
                )
            };
        }
    };
    let none = Run {
        b: band.planes.as_ptr(),
        c: 0,
        cols: 0,
    };
    if g.out_w.is_multiple_of(lanes) {
        let per_row = g.out_w / lanes;
        let runs = rows.len() * per_row;
        let at = |v: usize| run(rows.start + v / per_row, (v % per_row) * lanes, lanes);
        for v in (0..runs).step_by(2) {
            tiles(at(v), if v + 1 < runs { at(v + 1) } else { none });
        }
        return;
    }
    for oy in rows.clone() {
        let mut ox = 0;
        while ox < g.out_w {
            let cols = (2 * lanes).min(g.out_w - ox);
            let second = match cols > lanes {
                true => run(oy, ox + lanes, cols - lanes),
                false => none,
            };
            tiles(run(oy, ox, cols.min(lanes)), second);
            ox += cols;
        }
    }
}

/// One vector's run of pixels of a tile: step `k` of its B values at `b + offsets[k]`,
/// its outputs at `c` (plus the channel's row), `cols` (0 to 16) of them.
#[derive(Clone, Copy)]
struct Run {
    b: *const f32,
    c: usize,
    cols: usize,
}

/// One tile: `TILE_ROWS` output channels (filter rows from `a`, `offsets.len()` apart)
/// by two runs of pixels, finished (bias, clamp) and stored to `c` (rows `ldc` apart,
/// each run at its offset).
///
/// # Safety
/// AVX-512 F; `a` holds `TILE_ROWS` filter rows, each run's `b + offsets[k]` its `cols`
/// values, `bias` (if any) `TILE_ROWS`, and each row of `c` each run's `cols` outputs.
#[inline(always)]
unsafe fn tile(
    a: *const f32,
    offsets: &[usize],
    (first, second): (Run, Run),
    (bias, (lo, hi)): (Option<*const f32>, (f32, f32)),
    (c, ldc): (*mut f32, usize),
) {
    let depth = offsets.len();
    // SAFETY (every block below): AVX-512 F (the caller's promise).
    let (m0, m1) = unsafe {
        (
            Wide::mask(first_lanes(first.cols)),
            Wide::mask(first_lanes(second.cols)),
        )
    };
    let mut acc = [[unsafe { Wide::splat(0.0) }; 2]; TILE_ROWS];
    for (k, &offset) in offsets.iter().enumerate() {
        // SAFETY: each run's step-k values lie at its b + offset (the caller's
        // promise); the masks load only those (none of a run of no columns).
        let (b0, b1) = unsafe {
            (
                Wide::load_masked(first.b.wrapping_add(offset), m0),
                Wide::load_masked(second.b.wrapping_add(offset), m1),
            )
        };
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: r < TILE_ROWS and k < depth: inside the tile's filter rows.
            unsafe {
                let av = Wide::splat(*a.add(r * depth + k));
                row[0] = av.fmadd(b0, row[0]);
                row[1] = av.fmadd(b1, row[1]);
            }
        }
    }
    // SAFETY: AVX-512 F.
    let (lo, hi) = unsafe { (Wide::splat(lo), Wide::splat(hi)) };
    for (r, row) in acc.iter().enumerate() {
        // SAFETY: row r of the tile holds each run's `cols` outputs at c + r*ldc + its
        // offset; the stores are masked to them (a run of no columns stores nothing);
        // bias, when given, holds TILE_ROWS values.
        unsafe {
            let add = Wide::splat(bias.map_or(-0.0, |b| *b.add(r)));
            let cr = c.wrapping_add(r * ldc);
            row[0]
                .add(add)
                .clamp(lo, hi)
                .store_first(cr.wrapping_add(first.c), first.cols);
            row[1]
                .add(add)
                .clamp(lo, hi)
                .store_first(cr.wrapping_add(second.c), second.cols);
        }
    }
}
