//! The depthwise plane convolution of a small plane with stride 1, swept as one flat
//! row: when the output is as wide as the input (`out_w == in_w`, "same" padding across
//! the rows), output pixel `o` of the flattened plane reads tap `(ky, kx)` at input
//! index `o + (ky - pad_top) * in_w + (kx - pad_left)`, the same offset for every
//! pixel. So each vector of 16 (AVX-512) or 8 (AVX2) consecutive output pixels, across
//! row ends, is one masked load and one fused multiply-add per tap. The masks drop the
//! lanes whose tap falls in the padding (a column past either edge of its row, a row
//! above or below the plane); they depend only on the vector and the tap, so they are
//! worked out once per geometry.
//!
//! The row kernel (`depthwise_square`) fills only `out_w` lanes of a vector per row and
//! pays its setup for every row and block of rows: on MobileNetV2's 7x7 planes (7 of 16
//! lanes) it took 65-80 us a layer on one thread where this kernel takes 36. Here a 7x7
//! plane is four vectors.
//!
//! Each output is the bias plus its taps in `(ky, kx)` order with fused multiply-adds, a
//! tap in the padding adding `0 * w`, exactly as in the polyphase kernel, so the two give
//! the same bits.

use super::DirectPlane;
use crate::CpuSupport;
use crate::conv::ConvGeometry;
use crate::simd_x86::{Narrow, Vector, Wide};

/// Most output pixels of a plane the kernel handles.
const MAX_PIXELS: usize = 256;

/// Most taps of a filter.
const MAX_TAPS: usize = 25;

/// Most vectors of a plane (at the narrowest width, 8 lanes).
const MAX_VECTORS: usize = MAX_PIXELS / 8;

/// Vectors summed together at most: independent chains of fused multiply-adds, so that
/// their latency overlaps.
const CHAIN: usize = 8;

/// The kernel prepared for one geometry and width.
pub(super) struct Flat {
    cpu: CpuSupport,
    /// AVX-512 (16 lanes) rather than AVX2 (8).
    wide: bool,
    /// Taps of the filter (`kernel_h * kernel_w`).
    taps: usize,
    /// Per tap, its input offset from the output pixel's index.
    offsets: [isize; MAX_TAPS],
    /// Per vector and tap, the lanes whose tap lies inside the input plane, bit `l` for
    /// lane `l` (none for a lane past the last output pixel).
    lanes: [[u16; MAX_TAPS]; MAX_VECTORS],
}

impl Flat {
    /// The kernel for `g`, or `None` when it does not handle it: stride 1 and dilation 1
    /// both ways, the output as wide as the input and at most half a vector wide, at
    /// most [`MAX_PIXELS`] output pixels and 25 taps. `cpu` proves AVX2 with FMA, and
    /// AVX-512 F too when `wide`. (On wider rows the row kernel wastes less and is
    /// faster: MobileNetV2's 14x14 layers took 20% longer here in a whole call, with
    /// AVX-512.)
    pub(super) fn new(cpu: CpuSupport, wide: bool, g: &ConvGeometry) -> Option<Flat> {
        let taps = g.kernel_h * g.kernel_w;
        let pixels = g.out_h * g.out_w;
        let n = if wide { Wide::LANES } else { Narrow::LANES };
        let handles = (g.stride_h, g.stride_w, g.dilation_h, g.dilation_w) == (1, 1, 1, 1)
            && g.out_w == g.in_w
            && (1..=n / 2).contains(&g.in_w)
            && (1..=MAX_PIXELS).contains(&pixels)
            && (1..=MAX_TAPS).contains(&taps)
            && g.pad_top < MAX_PIXELS
            && g.pad_left < MAX_PIXELS;
        if !handles {
            return None;
        }
        let (h, w) = (g.in_h as isize, g.in_w as isize);
        // Per tap, its (row, column) shift from the output pixel.
        let mut shifts = [(0isize, 0isize); MAX_TAPS];
        let mut offsets = [0isize; MAX_TAPS];
        for (t, (shift, offset)) in shifts.iter_mut().zip(&mut offsets).take(taps).enumerate() {
            let dy = (t / g.kernel_w) as isize - g.pad_top as isize;
            let dx = (t % g.kernel_w) as isize - g.pad_left as isize;
            (*shift, *offset) = ((dy, dx), dy * w + dx);
        }
        // Built once per convolution call: the pixels in order, their row and column
        // counted rather than divided out.
        let mut lanes = [[0u16; MAX_TAPS]; MAX_VECTORS];
        let (mut y, mut x) = (0isize, 0isize);
        for o in 0..pixels {
            let bit = 1u16 << (o % n);
            for (mask, &(dy, dx)) in lanes[o / n].iter_mut().zip(&shifts[..taps]) {
                if (0..h).contains(&(y + dy)) && (0..w).contains(&(x + dx)) {
                    *mask |= bit;
                }
            }
            x += 1;
            if x == w {
                (y, x) = (y + 1, 0);
            }
        }
        Some(Flat {
            cpu,
            wide,
            taps,
            offsets,
            lanes,
        })
    }

    /// Convolves one plane into `output` (`out_h x out_w`); `g` is the geometry the
    /// kernel was prepared for.
    pub(super) fn plane(&self, g: &ConvGeometry, p: DirectPlane<'_>, output: &mut [f32]) {
        let (input, filter, bias) = (p.input, p.filter, p.bias);
        let output = &mut output[..g.out_h * g.out_w];
        let sums = Sums {
            flat: self,
            input: input.as_ptr(),
            filter: filter.as_ptr(),
            output: output.as_mut_ptr(),
            pixels: output.len(),
            bias,
            bounds: p.bounds,
        };
        // SAFETY: `self.cpu` proves AVX2 and FMA were detected, and AVX-512 F too when
        // `self.wide` (`new`'s contract); the offsets and lanes were worked out for this
        // geometry at this width, and the pointers hold its planes and taps.
        unsafe {
            if self.wide {
                wide(self.cpu, &sums)
            } else {
                narrow(self.cpu, &sums)
            }
        }
    }
}

/// [`run`] at 16 lanes.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; as [`run`].
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn wide(_: CpuSupport, sums: &Sums<'_>) {
    // SAFETY: the caller's promise.
    unsafe { run::<Wide>(sums) }
}

/// [`run`] at 8 lanes.
///
/// # Safety
/// AVX2 and FMA; as [`run`].
#[target_feature(enable = "avx2,fma")]
unsafe fn narrow(_: CpuSupport, sums: &Sums<'_>) {
    // SAFETY: the caller's promise.
    unsafe { run::<Narrow>(sums) }
}

/// The plane's vectors, [`CHAIN`] at a time, then 4, 2 and 1 for the rest.
///
/// # Safety
/// The CPU has `V`'s instructions; the kernel's offsets and lanes were worked out at
/// `V`'s width for the geometry of the planes `sums` points to.
#[inline(always)]
unsafe fn run<V: Vector>(sums: &Sums<'_>) {
    let count = sums.pixels.div_ceil(V::LANES);
    let mut v = 0;
    // SAFETY (every call): the caller's promise; the vectors are the plane's.
    unsafe {
        while v < count {
            v += match count - v {
                left if left >= CHAIN => sums.vectors::<V, CHAIN>(v),
                left if left >= 4 => sums.vectors::<V, 4>(v),
                left if left >= 2 => sums.vectors::<V, 2>(v),
                _ => sums.vectors::<V, 1>(v),
            };
        }
    }
}

/// One plane's operands.
struct Sums<'a> {
    flat: &'a Flat,
    /// The input plane.
    input: *const f32,
    /// The filter's taps.
    filter: *const f32,
    /// The output plane.
    output: *mut f32,
    /// Output pixels of the plane.
    pixels: usize,
    bias: f32,
    /// The clamp's (lower, upper) bound.
    bounds: (f32, f32),
}

impl Sums<'_> {
    /// Sums, clamps and stores vectors `v .. v + N`; returns `N`.
    ///
    /// # Safety
    /// As [`run`]; the vectors are vectors of the plane.
    #[inline(always)]
    unsafe fn vectors<V: Vector, const N: usize>(&self, v: usize) -> usize {
        // SAFETY: the CPU has V's instructions.
        let mut acc = [unsafe { V::splat(self.bias) }; N];
        for t in 0..self.flat.taps {
            // SAFETY: the filter holds `taps` values; the CPU has V's instructions.
            let w = unsafe { V::splat(*self.filter.add(t)) };
            let offset = self.flat.offsets[t];
            for (j, acc) in acc.iter_mut().enumerate() {
                let first = ((v + j) * V::LANES) as isize + offset;
                // SAFETY: the lanes set for this vector and tap read input pixels
                // inside the plane (`Flat::new`); masked-off lanes read nothing and
                // fault nothing, so the address may lie outside it.
                unsafe {
                    let m = V::mask(self.flat.lanes[v + j][t]);
                    let x = V::load_masked(self.input.wrapping_offset(first), m);
                    *acc = x.fmadd(w, *acc);
                }
            }
        }
        // SAFETY: the CPU has V's instructions.
        let (lo, hi) = unsafe { (V::splat(self.bounds.0), V::splat(self.bounds.1)) };
        for (j, &acc) in acc.iter().enumerate() {
            let first = (v + j) * V::LANES;
            let lanes = (self.pixels - first).min(V::LANES);
            // SAFETY: the vector's `lanes` outputs from `first` lie inside the plane.
            unsafe { acc.clamp(lo, hi).store_first(self.output.add(first), lanes) };
        }
        N
    }
}
