//! A 1x1 convolution (stride 1, no padding, one group) of NCHW planes with the output
//! channels in the vector lanes, for small planes; any other convolution of one group
//! is the same product over its im2col rows (which the caller writes).
//!
//! The GEMM behind a pointwise convolution puts pixels in the lanes: a 7x7 plane is 49
//! pixels, four AVX-512 vectors of which the last holds one pixel, so a quarter of its
//! multiply-adds are wasted (MobileNetV2's 7x7 layers ran at 1.4-1.9x XNNPACK's time).
//! XNNPACK, on NHWC data, has the channels in the lanes. Here a tile is `R` pixels by
//! `NV` vectors of output channels: per input channel `k` it loads `NV` vectors of the
//! filter's row `k` (the filter stored input-channel major, `[c_in, c_out]`, made so at
//! load) and broadcasts the tile's `R` pixels of input plane `k` (consecutive in
//! memory), `R * NV` fused multiply-adds. The finished tile is written transposed: each
//! output channel's `R` pixels are consecutive in its output plane (with AVX-512 an 8x16
//! transpose in registers and one masked store per channel).
//!
//! Each output is the sum of its products in input-channel order with fused
//! multiply-adds from 0, then the bias added, then the clamp, as the GEMM's finish does.

use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};

use crate::CpuSupport;
use crate::simd_x86::{Narrow, Vector, Wide};

/// Vectors of output channels in a tile, at most.
const MAX_VECTORS: usize = 3;

/// Filter rows ahead of the one being multiplied that a tile asks the cache for. Its
/// filter rows are `c_out` apart, and the filter, read once per call, comes from L3:
/// the prefetch made MobileNetV2's 7x7 layers 5-25% faster with the filter out of the
/// core's caches.
const PREFETCH_ROWS: usize = 8;

/// Pixels of a tile with AVX-512 (32 registers: 21 sums, 3 filter vectors, 1
/// broadcast). Seven, so that a 7x7 or 14x14 plane is whole tiles.
const WIDE_PIXELS: usize = 7;

/// Pixels of a tile with AVX2 (16 registers: 12 sums with two vectors, 2 filter
/// vectors, 1 broadcast).
const NARROW_PIXELS: usize = 6;

/// Vectors of output channels in a full tile with AVX2.
const NARROW_VECTORS: usize = 2;

/// One call's operands, checked by the caller: `input` holds `c_in` planes of `pixels`,
/// `filter` `c_in` rows of `c_out`, `bias` (when given) `c_out` values.
pub(super) struct Operands<'a> {
    pub input: &'a [f32],
    pub filter: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub clamp: Option<(f32, f32)>,
    pub c_in: usize,
    pub c_out: usize,
    pub pixels: usize,
}

/// Output channels a task's range is a multiple of (a vector's lanes).
pub(super) fn channel_step(wide: bool) -> usize {
    if wide { Wide::LANES } else { Narrow::LANES }
}

/// Writes output channels `channels` (their planes, `channels.len() * pixels` values
/// of `out`). `cpu` proves AVX2 and FMA, and AVX-512 F too when `wide`; the caller
/// checked the slices against the operands' sizes and `channels` against `c_out`.
pub(super) fn run(
    cpu: CpuSupport,
    wide: bool,
    op: &Operands<'_>,
    channels: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let (lo, hi) = op.clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
    let raw = Raw {
        input: op.input.as_ptr(),
        filter: op.filter.as_ptr(),
        bias: op.bias.map(<[f32]>::as_ptr),
        out: out.as_mut_ptr(),
        first: channels.start,
        c_in: op.c_in,
        c_out: op.c_out,
        pixels: op.pixels,
        bounds: (lo, hi),
    };
    let end = channels.end;
    // SAFETY: `cpu` proves AVX2 and FMA, and AVX-512 F when `wide`; the caller checked
    // every slice against the sizes `raw` carries and the channels against `c_out`.
    unsafe {
        if wide {
            wide_channels(cpu, &raw, end)
        } else {
            narrow_channels(cpu, &raw, end)
        }
    }
}

/// [`channels`] at 16 lanes.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; as [`channels`].
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn wide_channels(_: CpuSupport, raw: &Raw, end: usize) {
    // SAFETY: the caller's promise.
    unsafe { channels::<Wide, WIDE_PIXELS, MAX_VECTORS>(raw, end) }
}

/// [`channels`] at 8 lanes.
///
/// # Safety
/// AVX2 and FMA; as [`channels`].
#[target_feature(enable = "avx2,fma")]
unsafe fn narrow_channels(_: CpuSupport, raw: &Raw, end: usize) {
    // SAFETY: the caller's promise.
    unsafe { channels::<Narrow, NARROW_PIXELS, NARROW_VECTORS>(raw, end) }
}

/// The output channels `raw.first .. end`, in panels of at most `NV` vectors, as even
/// as they can be (64 channels are two panels of two AVX-512 vectors, not three and
/// one: a one-vector tile loads as much as it multiplies), each over all pixels.
///
/// # Safety
/// The CPU has `V`'s instructions; the pointers hold what [`Operands`] says, `out` the
/// planes of the channels from `raw.first`, and `end <= c_out`.
#[inline(always)]
unsafe fn channels<V: Vector, const R: usize, const NV: usize>(raw: &Raw, end: usize) {
    let mut co = raw.first;
    let vectors = end.saturating_sub(co).div_ceil(V::LANES);
    let panels = vectors.div_ceil(NV);
    // SAFETY (every call): the caller's promise; each panel's channels lie below `end`.
    unsafe {
        for i in 0..panels {
            let width = vectors / panels + usize::from(i < vectors % panels);
            let cols = (end - co).min(width * V::LANES);
            match width {
                3 => raw.panel::<V, R, 3>(co, cols),
                2 => raw.panel::<V, R, 2>(co, cols),
                _ => raw.panel::<V, R, 1>(co, cols),
            }
            co += cols;
        }
    }
}

/// One task's operands as pointers.
struct Raw {
    /// `c_in` planes of `pixels`.
    input: *const f32,
    /// `c_in` rows of `c_out`.
    filter: *const f32,
    bias: Option<*const f32>,
    /// The output plane of channel `first`.
    out: *mut f32,
    first: usize,
    c_in: usize,
    c_out: usize,
    pixels: usize,
    /// The clamp's (lower, upper) bound.
    bounds: (f32, f32),
}

impl Raw {
    /// Output channels `co .. co + cols` (`cols` at most `NV` vectors, more than
    /// `NV - 1`), over all pixels: whole tiles of `R` pixels, then the rest.
    ///
    /// # Safety
    /// As [`channels`]; `co + cols <= c_out`.
    #[inline(always)]
    unsafe fn panel<V: Vector, const R: usize, const NV: usize>(&self, co: usize, cols: usize) {
        let tail = cols - (NV - 1) * V::LANES;
        // SAFETY: the CPU has V's instructions.
        let last = unsafe { V::mask(((1u32 << tail) - 1) as u16) };
        let mut p = 0;
        // SAFETY (every call): the caller's promise; each tile's pixels lie inside the
        // plane.
        unsafe {
            while p + R <= self.pixels {
                self.tile::<V, R, NV>((co, cols, last), p);
                p += R;
            }
            match self.pixels - p {
                0 => {}
                1 => self.tile::<V, 1, NV>((co, cols, last), p),
                2 => self.tile::<V, 2, NV>((co, cols, last), p),
                3 => self.tile::<V, 3, NV>((co, cols, last), p),
                4 => self.tile::<V, 4, NV>((co, cols, last), p),
                5 => self.tile::<V, 5, NV>((co, cols, last), p),
                _ => self.tile::<V, 6, NV>((co, cols, last), p),
            }
        }
    }

    /// The `R x cols` tile at pixel `p` and output channel `co`; `last` masks the
    /// channels of the last vector.
    ///
    /// # Safety
    /// As [`Raw::panel`]; `p + R <= pixels`, `R <= 7`.
    #[inline(always)]
    unsafe fn tile<V: Vector, const R: usize, const NV: usize>(
        &self,
        (co, cols, last): (usize, usize, V::Mask),
        p: usize,
    ) {
        // Per vector of channels, per pixel.
        // SAFETY: the CPU has V's instructions.
        let mut acc = unsafe { [[V::splat(0.0); R]; NV] };
        // SAFETY: the CPU has V's instructions; filter row `k` holds channels `co .. co +
        // cols` (the last vector's other lanes masked off), input plane `k` pixels `p ..
        // p + R`, for every `k < c_in`.
        unsafe {
            let mut w_row = self.filter.add(co);
            let mut x_row = self.input.add(p);
            for _ in 0..self.c_in {
                let mut w = [V::splat(0.0); NV];
                for (v, w) in w.iter_mut().enumerate() {
                    *w = if v + 1 < NV {
                        V::load(w_row.add(v * V::LANES))
                    } else {
                        V::load_masked(w_row.add(v * V::LANES), last)
                    };
                }
                for r in 0..R {
                    let x = V::splat(*x_row.add(r));
                    for (acc, &w) in acc.iter_mut().zip(&w) {
                        acc[r] = x.fmadd(w, acc[r]);
                    }
                }
                // A hint: an address past the filter faults nothing.
                let ahead = w_row.wrapping_add(PREFETCH_ROWS * self.c_out).cast::<i8>();
                for line in (0..NV * V::LANES * 4).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line));
                }
                w_row = w_row.add(self.c_out);
                x_row = x_row.add(self.pixels);
            }
        }
        // Finished (bias, clamp) and stored transposed: channel `c`'s `R` pixels are
        // consecutive in its plane.
        // SAFETY: the CPU has V's instructions; the bias holds channels `co .. co +
        // cols` (the rest masked off); the planes of those channels are the task's, and
        // each holds pixels `p .. p + R`.
        unsafe {
            let (lo, hi) = (V::splat(self.bounds.0), V::splat(self.bounds.1));
            let plane = self.out.add((co - self.first) * self.pixels + p);
            for (v, acc) in acc.iter().enumerate() {
                let bias = match self.bias {
                    Some(b) => {
                        let m = if v + 1 < NV { V::mask(u16::MAX) } else { last };
                        V::load_masked(b.add(co + v * V::LANES), m)
                    }
                    None => V::splat(0.0),
                };
                let rows: [V; R] = std::array::from_fn(|r| acc[r].add(bias).clamp(lo, hi));
                let dst = plane.add(v * V::LANES * self.pixels);
                V::store_transposed(&rows, dst, self.pixels, cols - v * V::LANES);
            }
        }
    }
}
