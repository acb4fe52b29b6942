//! A convolution of one group over NCHW planes with the output channels in the vector
//! lanes, reading the input planes in place (or a zero-padded copy of them, which the
//! caller makes): no im2col matrix, no packing.
//!
//! The GEMM behind a convolution puts pixels in the lanes and packs its im2col panels on
//! every call: a 7x7 plane is 49 pixels, four AVX-512 vectors of which the last holds one
//! pixel, and a 3x3 convolution copies each input value nine times into its panels.
//! XNNPACK, on NHWC data, has the channels in the lanes. Here a tile is `R` output
//! pixels by `NV` vectors of output channels: per filter row `k` (input channel `ci`,
//! tap `t`) it loads `NV` vectors of the filter's row (the filter stored input-channel
//! major, `[c_in, kh, kw, c_out]`, made so at load) and broadcasts the `R` input values
//! that tap reads for the tile's pixels, `R * NV` fused multiply-adds. An output pixel
//! `p` reads at `pixel(p) + ci * plane + tap` of the input ([`Window`]).
//!
//! With more than one tap, the depth is taken in blocks of whole input channels (about
//! [`BLOCK_ROWS`] filter rows), each block over a band of tiles, so that the block's filter rows stay in L1
//! while the band's tiles read them; the tiles' sums wait in the caller's scratch between
//! blocks. The finished tile is written transposed: each output channel's `R` pixels are
//! consecutive in its output plane (with AVX-512 an 8x16 transpose in registers and one
//! masked store per channel).
//!
//! Each output is the sum of its products in filter-row order with fused multiply-adds
//! from 0, then the bias added, then the clamp, as the GEMM's finish does.

use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
use std::ops::Range;

use etch_memory::ColumnBlock;

use crate::CpuSupport;
use crate::simd_x86::{Narrow, Vector, Wide};

/// Vectors of output channels in a tile, at most.
const MAX_VECTORS: usize = 3;

/// Filter rows ahead of the one being multiplied that a tile asks the cache for (a
/// block's first band reads them from L2 or L3): the prefetch made MobileNetV2's 7x7
/// pointwise layers 5-25% faster with the filter out of the core's caches.
const PREFETCH_ROWS: usize = 8;

/// Pixels of a tile with AVX-512 (32 registers: 21 sums, 3 filter vectors, 1
/// broadcast). Seven, so that a 7x7, 14x14, 28x28 or 56x56 row is whole tiles.
const WIDE_PIXELS: usize = 7;

/// Pixels of a tile with AVX2 (16 registers: 12 sums with two vectors, 2 filter
/// vectors, 1 broadcast).
const NARROW_PIXELS: usize = 6;

/// Vectors of output channels in a full tile with AVX2.
const NARROW_VECTORS: usize = 2;

/// Filter rows of one depth block, about: a three-vector panel's block is 24 KiB, half
/// of a 48 KiB L1.
const BLOCK_ROWS: usize = 128;

/// Tiles of one band: each block of filter rows is read from L1 by this many tiles.
const BAND_TILES: usize = 16;

/// Most taps (`kernel_h * kernel_w`) of a convolution this kernel runs.
pub(super) const MAX_TAPS: usize = 64;

/// Scratch (f32 values) of one task: the sums of a band's tiles between depth blocks.
pub(super) const TASK_SCRATCH: usize = BAND_TILES * WIDE_PIXELS * MAX_VECTORS * Wide::LANES;

/// Where an output pixel's inputs are: output pixel `p` (row-major in its plane, rows
/// of `out_w`), filter row `ci * taps.len() + t` reads input element
/// `(p / out_w) * row_pitch + (p % out_w) * col_step + ci * plane + taps[t]`.
#[derive(Clone, Copy)]
pub(super) struct Window {
    /// Elements from one input plane to the next.
    pub plane: usize,
    /// Offset of each tap within a plane, `taps_len` of them.
    pub taps: [usize; MAX_TAPS],
    pub taps_len: usize,
    /// Output pixels per row.
    pub out_w: usize,
    /// Input elements from one output row's first input to the next's.
    pub row_pitch: usize,
    /// Input elements from one output pixel's first input to its right neighbour's.
    pub col_step: usize,
}

impl Window {
    /// The input offsets of the first taps in plane 0 of output pixels `p ..`, one per
    /// value of `offsets`, counted along the rows without a division per pixel.
    fn pixels_from(&self, p: usize, offsets: &mut [usize]) {
        let (mut y, mut x) = (p / self.out_w, p % self.out_w);
        for at in offsets {
            *at = y * self.row_pitch + x * self.col_step;
            x += 1;
            if x == self.out_w {
                (y, x) = (y + 1, 0);
            }
        }
    }
}

/// One call's operands, checked by the caller: every input offset the window names
/// for `pixels` output pixels and `c_in` channels lies inside `input`; `filter` holds
/// `c_in * taps_len` rows of `c_out`, `bias` (when given) `c_out` values.
pub(super) struct Operands<'a> {
    pub input: &'a [f32],
    pub window: Window,
    pub c_in: usize,
    pub filter: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub clamp: Option<(f32, f32)>,
    pub c_out: usize,
    /// Output pixels of a plane (the output planes' stride).
    pub pixels: usize,
}

/// Output channels a task's range is a multiple of (a vector's lanes).
pub(super) fn channel_step(wide: bool) -> usize {
    if wide { Wide::LANES } else { Narrow::LANES }
}

/// Writes output channels `channels` at pixels `pixels` into `out` (the block of the
/// output planes holding exactly those), with `scratch` ([`TASK_SCRATCH`] values) for
/// the sums between depth blocks. `cpu` proves AVX2 and FMA, and AVX-512 F too when
/// `wide`. Returns `false`, writing nothing, when `out` or `scratch` is smaller than
/// that; the caller checked the operands ([`Operands`]) and the ranges against
/// `c_out` and `pixels`.
pub(super) fn run(
    cpu: CpuSupport,
    wide: bool,
    op: &Operands<'_>,
    (channels, pixels): (Range<usize>, Range<usize>),
    out: &mut ColumnBlock<'_, f32>,
    scratch: &mut [f32],
) -> bool {
    if channels.is_empty() || pixels.is_empty() {
        return true;
    }
    let Some(dst) = out.window_ptr((0, 0), (channels.len(), pixels.len())) else {
        return false;
    };
    if scratch.len() < TASK_SCRATCH || out.ld() != op.pixels {
        return false;
    }
    let (lo, hi) = op.clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
    let taps = op.window.taps_len.clamp(1, MAX_TAPS);
    // Whole input channels per depth block, the blocks as even as they can be; a 1x1
    // convolution's depth in one block (blocks made MobileNetV2's 7x7 pointwise layers
    // 5-18% slower in a whole call, their filters coming from L3).
    let blocks = match taps {
        1 => 1,
        _ => (op.c_in * taps)
            .div_ceil(BLOCK_ROWS)
            .clamp(1, op.c_in.max(1)),
    };
    let raw = Raw {
        input: op.input.as_ptr(),
        window: op.window,
        c_in: op.c_in,
        block_channels: op.c_in.div_ceil(blocks).max(1),
        filter: op.filter.as_ptr(),
        bias: op.bias.map(<[f32]>::as_ptr),
        out: dst,
        ld: op.pixels,
        first: (channels.start, pixels.start),
        c_out: op.c_out,
        bounds: (lo, hi),
        sums: scratch.as_mut_ptr(),
    };
    // SAFETY: `cpu` proves AVX2 and FMA, and AVX-512 F when `wide`; the caller checked
    // the operands against the sizes `raw` carries and the ranges against them; `out`
    // holds the ranges' window at `dst` (checked above) and `scratch` TASK_SCRATCH values.
    unsafe {
        if wide {
            wide_channels(cpu, &raw, (channels.end, pixels.end))
        } else {
            narrow_channels(cpu, &raw, (channels.end, pixels.end))
        }
    }
    true
}

/// [`channels`] at 16 lanes.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; as [`channels`].
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn wide_channels(_: CpuSupport, raw: &Raw, end: (usize, usize)) {
    // SAFETY: the caller's promise.
    unsafe { channels::<Wide, WIDE_PIXELS, MAX_VECTORS>(raw, end) }
}

/// [`channels`] at 8 lanes.
///
/// # Safety
/// AVX2 and FMA; as [`channels`].
#[target_feature(enable = "avx2,fma")]
unsafe fn narrow_channels(_: CpuSupport, raw: &Raw, end: (usize, usize)) {
    // SAFETY: the caller's promise.
    unsafe { channels::<Narrow, NARROW_PIXELS, NARROW_VECTORS>(raw, end) }
}

/// The output channels `raw.first.0 .. end.0` at pixels `raw.first.1 .. end.1`, in
/// panels of at most `NV` vectors, as even as they can be (64 channels are two panels
/// of two AVX-512 vectors, not three and one: a one-vector tile loads as much as it
/// multiplies).
///
/// # Safety
/// The CPU has `V`'s instructions; the pointers hold what [`Raw`] says, and the ends
/// are at most `c_out` and the plane's pixels.
#[inline(always)]
unsafe fn channels<V: Vector, const R: usize, const NV: usize>(raw: &Raw, end: (usize, usize)) {
    let mut co = raw.first.0;
    let vectors = end.0.saturating_sub(co).div_ceil(V::LANES);
    let panels = vectors.div_ceil(NV);
    // SAFETY (every call): the caller's promise; each panel's channels lie below the end.
    unsafe {
        for i in 0..panels {
            let width = vectors / panels + usize::from(i < vectors % panels);
            let cols = (end.0 - co).min(width * V::LANES);
            match width {
                3 => raw.panel::<V, R, 3>(co, cols, end.1),
                2 => raw.panel::<V, R, 2>(co, cols, end.1),
                _ => raw.panel::<V, R, 1>(co, cols, end.1),
            }
            co += cols;
        }
    }
}

/// One task's operands as pointers.
struct Raw {
    /// The input (planes `window.plane` apart).
    input: *const f32,
    window: Window,
    c_in: usize,
    /// Input channels of a depth block (the last may have fewer).
    block_channels: usize,
    /// `c_in * taps` rows of `c_out`.
    filter: *const f32,
    bias: Option<*const f32>,
    /// Output channel `first.0`'s pixel `first.1`; planes `ld` apart.
    out: *mut f32,
    ld: usize,
    /// The task's first output channel and pixel.
    first: (usize, usize),
    c_out: usize,
    /// The clamp's (lower, upper) bound.
    bounds: (f32, f32),
    /// [`TASK_SCRATCH`] values for the sums of a band's tiles.
    sums: *mut f32,
}

/// Where a tile stands in its depth blocks: its sums start from 0 (`first`) or from
/// its slot of the band's sums, and are finished and stored (`last`) or put back.
#[derive(Clone, Copy)]
struct Depth {
    channels: (usize, usize),
    first: bool,
    last: bool,
}

impl Raw {
    /// Output channels `co .. co + cols` (`cols` at most `NV` vectors, more than
    /// `NV - 1`) at pixels `first.1 .. end`, band by band: per depth block, whole tiles
    /// of `R` pixels, then the rest.
    ///
    /// # Safety
    /// As [`channels`]; `co + cols <= c_out`.
    #[inline(always)]
    unsafe fn panel<V: Vector, const R: usize, const NV: usize>(
        &self,
        co: usize,
        cols: usize,
        end: usize,
    ) {
        let tail = cols - (NV - 1) * V::LANES;
        // SAFETY: the CPU has V's instructions.
        let last = unsafe { V::mask(((1u32 << tail) - 1) as u16) };
        let panel = (co, cols, last);
        let mut band = self.first.1;
        while band < end {
            let band_end = (band + BAND_TILES * R).min(end);
            // Each pixel's first input, once per band rather than per tile and block.
            let mut inputs = [0usize; BAND_TILES * WIDE_PIXELS];
            let inputs = &mut inputs[..band_end - band];
            self.window.pixels_from(band, inputs);
            // At least one block, so that a convolution without input channels still
            // writes its bias.
            let mut c0 = 0;
            loop {
                let c1 = (c0 + self.block_channels).min(self.c_in);
                let depth = Depth {
                    channels: (c0, c1),
                    first: c0 == 0,
                    last: c1 == self.c_in,
                };
                let mut p = band;
                let mut slot = self.sums;
                let at = |p: usize| &inputs[p - band..];
                // SAFETY (every call): the caller's promise; each tile's pixels lie
                // inside the task's, and a band has at most BAND_TILES tiles, each slot
                // R * NV vectors of the task's scratch.
                unsafe {
                    while p + R <= band_end {
                        self.tile::<V, R, NV>(panel, (p, at(p)), depth, slot);
                        p += R;
                        slot = slot.add(R * NV * V::LANES);
                    }
                    match band_end - p {
                        0 => {}
                        1 => self.tile::<V, 1, NV>(panel, (p, at(p)), depth, slot),
                        2 => self.tile::<V, 2, NV>(panel, (p, at(p)), depth, slot),
                        3 => self.tile::<V, 3, NV>(panel, (p, at(p)), depth, slot),
                        4 => self.tile::<V, 4, NV>(panel, (p, at(p)), depth, slot),
                        5 => self.tile::<V, 5, NV>(panel, (p, at(p)), depth, slot),
                        _ => self.tile::<V, 6, NV>(panel, (p, at(p)), depth, slot),
                    }
                }
                c0 = c1;
                if c0 >= self.c_in {
                    break;
                }
            }
            band = band_end;
        }
    }

    /// `acc[v][r] += x[r][ci * plane + tap] * filter[ci * taps + t][co + v * LANES ..]`
    /// for the input channels `c0 .. c1` and every tap, in filter-row order. The sums
    /// stay in registers through the loops as long as nothing indexes `acc` by a
    /// variable (see the finish in [`Raw::tile`]).
    ///
    /// Where the tile's pixels lie one or two values apart in the input (a tile inside
    /// one output row, stride 1 or 2), every pixel is read from the first one's
    /// pointer at a fixed distance: one pointer instead of `R` (which the compiler
    /// advanced one by one, with its other registers spilled, at each step).
    ///
    /// # Safety
    /// The CPU has V's instructions; filter row `ci * taps + t` holds channels `co .. co +
    /// cols` (the last vector's other lanes masked off by `last`), and every offset `ci *
    /// plane + tap` from each `x[r]` is inside the input, for `ci < c_in`.
    #[inline(always)]
    unsafe fn multiply<V: Vector, const R: usize, const NV: usize>(
        &self,
        acc: &mut [[V; R]; NV],
        x: &[*const f32; R],
        (co, last): (usize, V::Mask),
        depth: (usize, usize),
    ) {
        let step = self.window.col_step;
        let x0 = x[0];
        let uniform = x
            .iter()
            .enumerate()
            .all(|(r, &x)| x == x0.wrapping_add(r * step));
        let panel = (co, last);
        // SAFETY (each closure, called only by `rows` with offsets `at` the caller's
        // promise keeps inside the input for every pixel `r`): `x0 + at + r * step` is
        // `x[r] + at` when the pixels are uniform.
        unsafe {
            match (uniform, step) {
                (true, 1) => self.rows::<V, R, NV>(acc, panel, depth, |at, r| *x0.add(at + r)),
                (true, 2) => self.rows::<V, R, NV>(acc, panel, depth, |at, r| *x0.add(at + 2 * r)),
                _ => self.rows::<V, R, NV>(acc, panel, depth, |at, r| *x[r].add(at)),
            }
        }
    }

    /// [`Raw::multiply`]'s loops, pixel `r`'s input at offset `at` being `input(at, r)`.
    ///
    /// # Safety
    /// As [`Raw::multiply`]; `input` reads inside the input for every offset the window
    /// names.
    #[inline(always)]
    unsafe fn rows<V: Vector, const R: usize, const NV: usize>(
        &self,
        acc: &mut [[V; R]; NV],
        (co, last): (usize, V::Mask),
        (c0, c1): (usize, usize),
        input: impl Fn(usize, usize) -> f32,
    ) {
        let w = &self.window;
        let taps = &w.taps[..w.taps_len];
        let mut w_row = self.filter.wrapping_add(c0 * taps.len() * self.c_out + co);
        // SAFETY (both loops): the caller's promise; `w_row` is filter row `ci * taps +
        // t` at each step.
        unsafe {
            if let [tap] = taps {
                // One tap (a 1x1 kernel): one loop, one plane per step (nested loops cost
                // a fifth of a 7x7 pointwise layer's time).
                let mut at = c0 * w.plane + tap;
                for _ in c0..c1 {
                    self.row::<V, R, NV>(acc, (w_row, last), |r| input(at, r));
                    at += w.plane;
                    w_row = w_row.add(self.c_out);
                }
                return;
            }
            for ci in c0..c1 {
                let channel = ci * w.plane;
                for &tap in taps {
                    self.row::<V, R, NV>(acc, (w_row, last), |r| input(channel + tap, r));
                    w_row = w_row.add(self.c_out);
                }
            }
        }
    }

    /// One filter row: `acc[v][r] += input(r) * w_row[v * LANES ..]`, and a prefetch
    /// of the row [`PREFETCH_ROWS`] ahead.
    ///
    /// # Safety
    /// The CPU has V's instructions; `w_row` holds `NV` vectors (the last one's lanes
    /// outside `last` masked off).
    #[inline(always)]
    unsafe fn row<V: Vector, const R: usize, const NV: usize>(
        &self,
        acc: &mut [[V; R]; NV],
        (w_row, last): (*const f32, V::Mask),
        input: impl Fn(usize) -> f32,
    ) {
        // SAFETY: the caller's promise.
        unsafe {
            let mut wv = [V::splat(0.0); NV];
            for (v, wv) in wv.iter_mut().enumerate() {
                *wv = if v + 1 < NV {
                    V::load(w_row.add(v * V::LANES))
                } else {
                    V::load_masked(w_row.add(v * V::LANES), last)
                };
            }
            for r in 0..R {
                let x = V::splat(input(r));
                for (acc, &wv) in acc.iter_mut().zip(&wv) {
                    acc[r] = x.fmadd(wv, acc[r]);
                }
            }
            // A hint: an address past the filter faults nothing.
            let ahead = w_row.wrapping_add(PREFETCH_ROWS * self.c_out).cast::<i8>();
            for line in (0..NV * V::LANES * 4).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line));
            }
        }
    }

    /// The `R x cols` tile at pixel `p` (whose pixels' first inputs are the first `R`
    /// of `inputs`) and output channel `co` over the input channels of `depth`; `last`
    /// masks the channels of the last vector; `slot` holds the tile's sums between
    /// depth blocks.
    ///
    /// # Safety
    /// As [`Raw::panel`]; pixels `p .. p + R` are the task's, `R <= 7`, and `slot`
    /// holds `R * NV * LANES` values of the task's scratch.
    #[inline(always)]
    unsafe fn tile<V: Vector, const R: usize, const NV: usize>(
        &self,
        (co, cols, last): (usize, usize, V::Mask),
        (p, inputs): (usize, &[usize]),
        depth: Depth,
        slot: *mut f32,
    ) {
        // Per vector of channels, per pixel.
        // SAFETY: the CPU has V's instructions; a later block reads the sums an earlier
        // one stored in the tile's slot.
        let mut acc = unsafe { [[V::splat(0.0); R]; NV] };
        if !depth.first {
            for (v, acc) in acc.iter_mut().enumerate() {
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: as above; the slot holds R * NV vectors.
                    *a = unsafe { V::load(slot.add((v * R + r) * V::LANES)) };
                }
            }
        }
        // Each pixel's first input in plane 0.
        let mut x = [self.input; R];
        for (x, &at) in x.iter_mut().zip(inputs) {
            *x = self.input.wrapping_add(at);
        }
        // SAFETY: the caller's promise, as `multiply` needs it.
        unsafe { self.multiply::<V, R, NV>(&mut acc, &x, (co, last), depth.channels) };
        if !depth.last {
            // SAFETY: the slot holds R * NV vectors.
            unsafe {
                for (v, acc) in acc.iter().enumerate() {
                    for (r, a) in acc.iter().enumerate() {
                        a.store(slot.add((v * R + r) * V::LANES));
                    }
                }
            }
            return;
        }
        // Finished (bias, clamp) and stored transposed: channel `c`'s `R` pixels are
        // consecutive in its plane.
        // SAFETY: the CPU has V's instructions; the bias holds channels `co .. co +
        // cols` (the rest masked off); the task's block holds those channels' pixels
        // `p .. p + R`.
        unsafe {
            let (lo, hi) = (V::splat(self.bounds.0), V::splat(self.bounds.1));
            let plane = self
                .out
                .add((co - self.first.0) * self.ld + (p - self.first.1));
            // Finished into a second array first: the store loop below is not unrolled,
            // and an array it indexes by a variable stays in memory, so `acc` itself
            // would be stored at every step of the tile.
            let mut done = [[V::splat(0.0); R]; NV];
            for (v, (done, acc)) in done.iter_mut().zip(&acc).enumerate() {
                let bias = match self.bias {
                    Some(b) => {
                        let m = if v + 1 < NV { V::mask(u16::MAX) } else { last };
                        V::load_masked(b.add(co + v * V::LANES), m)
                    }
                    None => V::splat(0.0),
                };
                for (d, a) in done.iter_mut().zip(acc) {
                    *d = a.add(bias).clamp(lo, hi);
                }
            }
            for (v, rows) in done.iter().enumerate() {
                let dst = plane.add(v * V::LANES * self.ld);
                V::store_transposed(rows, dst, self.ld, cols - v * V::LANES);
            }
        }
    }
}
