//! The depthwise plane convolution of a square `K x K` filter (K = 3 or 5) with stride
//! `S` (1 or 2) in both directions and no dilation, read straight from the input plane
//! with AVX-512 (16 outputs a vector) or AVX2 (8): no padded copy of the plane is made.
//! One kernel body serves both widths through [`Vector`].
//!
//! Each output row is swept one vector of outputs at a time. With stride 1, tap column
//! `kx` of a vector is one load of the input row shifted by `kx`; with stride 2 it is
//! the even or odd lanes of two loads (twice the vector's columns) shifted by
//! `kx & !1`. A vector whose loads all lie inside the row loads without a mask; the
//! first and last vectors of a row load only the lanes inside the row (masked lanes
//! read nothing and give 0), lane ranges worked out once per geometry. Rows whose kernel
//! rows are all inside the plane go four at a time (the last few two at a time), each
//! input row loaded (and de-interleaved) once for every output row it reaches; rows near
//! the top and bottom go one at a time with only their kernel rows inside the plane.
//!
//! Each output is the bias plus its taps in `(ky, kx)` order with fused multiply-adds, a
//! column tap outside the row adding `0 * w` as in the polyphase kernel; a kernel row
//! outside the plane is skipped rather than added as zeros, which leaves every sum's
//! value unchanged (only the sign of a zero sum can differ).

use std::ops::Range;

use super::{DirectPlane, lanes_inside};
use crate::CpuSupport;
use crate::conv::ConvGeometry;
use crate::simd_x86::{Narrow, Vector, Wide};

/// Widest output row the kernel handles.
const MAX_OUT_W: usize = 1024;

/// Most output vectors in a row (at the narrowest width, 8 lanes).
const MAX_VECTORS: usize = MAX_OUT_W / 8;

/// Widest filter the kernel handles.
const MAX_K: usize = 5;

/// Output rows summed together where every kernel row of each is inside the plane:
/// independent chains of fused multiply-adds, so that their latency overlaps, and each
/// input row loaded once for all of them. Fewer rows left inside go two at a time, then
/// one.
const ROWS: usize = 4;

/// Rows summed together with AVX-512 (32 registers hold their sums, the filter and the
/// input rows), where enough rows are inside the plane.
const WIDE_ROWS: usize = 8;

/// Per load of an output vector's row (load `j` at column offset `j` with stride 1, the
/// pair at `2 * j` and `2 * j + LANES` with stride 2), the lanes that lie inside the
/// input row, bit `l` for lane `l`.
type LoadLanes = [[u16; 2]; MAX_K];

/// [`Plane::rows`] compiled for one width in a function of its own (a body the size of
/// the whole plane loop spills more).
///
/// # Safety
/// As [`Vector`]: only on a CPU with the width's instructions.
trait PlaneRows: Vector {
    /// [`Plane::rows`] of this width.
    unsafe fn rows<const K: usize, const S: usize, const R: usize, const MASKED: bool>(
        plane: &Plane<'_, Self, K, S>,
        oy: usize,
        v: usize,
        lanes: &LoadLanes,
    );
}

/// Implements [`PlaneRows`] for `$width` compiled with `$features`.
macro_rules! rows_entry {
    ($width:ty, $features:literal) => {
        impl PlaneRows for $width {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn rows<const K: usize, const S: usize, const R: usize, const MASKED: bool>(
                plane: &Plane<'_, Self, K, S>,
                oy: usize,
                v: usize,
                lanes: &LoadLanes,
            ) {
                // SAFETY: the caller's promise (`Plane::rows`'s contract).
                unsafe { plane.rows::<R, MASKED>(oy, v, lanes) }
            }
        }
    };
}

rows_entry!(Wide, "avx512f,avx2,fma");
rows_entry!(Narrow, "avx2,fma");

/// The kernel prepared for one geometry and width.
pub(super) struct Square {
    cpu: CpuSupport,
    /// AVX-512 (16 lanes) rather than AVX2 (8).
    wide: bool,
    /// Per output vector of a row, the lanes of its loads inside the row; `None` for a
    /// vector whose every load is whole and inside the row and whose outputs all lie
    /// in the row.
    lanes: [Option<LoadLanes>; MAX_VECTORS],
}

impl Square {
    /// The kernel for `g`, or `None` when it does not handle it: a 3x3 or 5x5 filter,
    /// stride 1 or 2 (the same both ways), dilation 1, padding narrower than the filter,
    /// a plane at least as large as the filter, rows of at most 1024 outputs. `cpu`
    /// proves AVX2 with FMA, and AVX-512 F too when `wide`.
    pub(super) fn new(cpu: CpuSupport, wide: bool, g: &ConvGeometry) -> Option<Square> {
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
            && g.out_w <= MAX_OUT_W
            && g.in_h.checked_mul(g.in_w).is_some_and(|n| n < (1 << 31));
        if !handles {
            return None;
        }
        let n = if wide { Wide::LANES } else { Narrow::LANES };
        let (w, out_w) = (g.in_w as isize, g.out_w as isize);
        // Lanes `l` of a load at column `at` with `at + l` inside the row.
        let inside = |at: isize| lanes_inside(at, w, n);
        let mut lanes = [None; MAX_VECTORS];
        for (v, m) in lanes.iter_mut().enumerate().take(g.out_w.div_ceil(n)) {
            let first = (s * n * v) as isize - g.pad_left as isize;
            // Columns loaded: `first ..= first + last` (the last load's last lane).
            let last = if s == 1 {
                k - 1
            } else {
                2 * (k.div_ceil(2) - 1) + n
            } + n
                - 1;
            let whole =
                first >= 0 && first + (last as isize) < w && (n * (v + 1)) as isize <= out_w;
            if whole {
                continue;
            }
            *m = Some(std::array::from_fn(|j| {
                let at = first + (s * j) as isize;
                [inside(at), inside(at + n as isize)]
            }));
        }
        Some(Square { cpu, wide, lanes })
    }

    /// Convolves one plane into `output` (`out_h x out_w`); `g` is the geometry the
    /// kernel was prepared for.
    pub(super) fn plane(&self, g: &ConvGeometry, p: DirectPlane<'_>, output: &mut [f32]) {
        let (input, filter, bias, bounds) = (p.input, p.filter, p.bias, p.bounds);
        let output = &mut output[..g.out_h * g.out_w];
        let call = (g, (input, filter, (bias, bounds), &self.lanes), output);
        // SAFETY: `self.cpu` proves AVX2 and FMA were detected, and AVX-512 F too when
        // `self.wide` (`new`'s contract); the geometry is one `new` accepted, the lanes
        // were worked out for it at this width, and the slices hold its planes.
        unsafe {
            if self.wide {
                wide(self.cpu, call)
            } else {
                narrow(self.cpu, call)
            }
        }
    }
}

/// Input plane, filter, (bias, clamp bounds) and load lanes of one plane.
type Operands<'a> = (
    &'a [f32],
    &'a [f32],
    (f32, (f32, f32)),
    &'a [Option<LoadLanes>; MAX_VECTORS],
);

/// One plane's call: geometry, operands, output.
type Call<'a, 'b> = (&'a ConvGeometry, Operands<'a>, &'b mut [f32]);

/// [`by_filter`] at 16 lanes.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; as [`run`].
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn wide(_: CpuSupport, call: Call<'_, '_>) {
    // SAFETY: the caller's promise.
    unsafe { by_filter::<Wide>(call) }
}

/// [`by_filter`] at 8 lanes.
///
/// # Safety
/// AVX2 and FMA; as [`run`].
#[target_feature(enable = "avx2,fma")]
unsafe fn narrow(_: CpuSupport, call: Call<'_, '_>) {
    // SAFETY: the caller's promise.
    unsafe { by_filter::<Narrow>(call) }
}

/// [`run`] for the geometry's filter size and stride.
///
/// # Safety
/// As [`run`], for the geometry's `K` and `S`.
#[inline(always)]
unsafe fn by_filter<V: PlaneRows>((g, operands, output): Call<'_, '_>) {
    // SAFETY: the caller's promise, with K and S the geometry's own.
    unsafe {
        match (g.kernel_h, g.stride_h) {
            (3, 1) => run::<V, 3, 1>(g, operands, output),
            (3, _) => run::<V, 3, 2>(g, operands, output),
            (_, 1) => run::<V, 5, 1>(g, operands, output),
            _ => run::<V, 5, 2>(g, operands, output),
        }
    }
}

/// The plane: blocks of [`ROWS`] rows where their kernel rows are all inside the plane,
/// single rows elsewhere.
///
/// # Safety
/// The CPU has `V`'s instructions; `g` is accepted by [`Square::new`] with
/// `kernel_h == K` and `stride_h == S`, the lanes were worked out for it at `V`'s
/// width; `input` holds `in_h * in_w` values, `output` `out_h * out_w` and `filter`
/// `K * K`.
#[inline(always)]
unsafe fn run<V: PlaneRows, const K: usize, const S: usize>(
    g: &ConvGeometry,
    (input, filter, (bias, (lo, hi)), lanes): Operands<'_>,
    output: &mut [f32],
) {
    // SAFETY (the whole body): the CPU has V's instructions (the caller's promise);
    // every load and store is justified where its address is formed.
    unsafe {
        let mut weights = [[V::splat(0.0); K]; K];
        for (ky, row) in weights.iter_mut().enumerate() {
            for (kx, wv) in row.iter_mut().enumerate() {
                *wv = V::splat(filter[ky * K + kx]);
            }
        }
        let plane = Plane::<V, K, S> {
            input: input.as_ptr(),
            output: output.as_mut_ptr(),
            g,
            weights: &weights,
            bias: V::splat(bias),
            bounds: (V::splat(lo), V::splat(hi)),
        };
        let full = [[u16::MAX; 2]; MAX_K];
        let vectors = lanes.iter().enumerate().take(g.out_w.div_ceil(V::LANES));
        let (h, pad_top) = (g.in_h, g.pad_top);
        // Rows whose kernel rows are all inside the plane: `S * oy >= pad_top` and
        // `S * oy - pad_top + K <= h`.
        let inside = pad_top.div_ceil(S)..((h + pad_top - K) / S + 1).min(g.out_h);
        let mut oy = 0;
        while oy < g.out_h {
            // Blocks of ROWS rows, then of 2 for what is left of the inside.
            let block = match inside.end.saturating_sub(oy) {
                _ if !inside.contains(&oy) => 1,
                left if left >= WIDE_ROWS && V::LANES == 16 => WIDE_ROWS,
                left if left >= ROWS => ROWS,
                left => left.min(2),
            };
            for (v, lane) in vectors.clone() {
                // The rows summed are inside the plane (all kernel rows for rows in
                // `inside`, the rows `kernel_rows` gives otherwise), and the vector's
                // lanes were worked out for this geometry.
                match (block, lane) {
                    (WIDE_ROWS, None) => V::rows::<K, S, WIDE_ROWS, false>(&plane, oy, v, &full),
                    (WIDE_ROWS, Some(m)) => V::rows::<K, S, WIDE_ROWS, true>(&plane, oy, v, m),
                    (ROWS, None) => V::rows::<K, S, ROWS, false>(&plane, oy, v, &full),
                    (ROWS, Some(m)) => V::rows::<K, S, ROWS, true>(&plane, oy, v, m),
                    (2, None) => V::rows::<K, S, 2, false>(&plane, oy, v, &full),
                    (2, Some(m)) => V::rows::<K, S, 2, true>(&plane, oy, v, m),
                    (_, _) if inside.contains(&oy) => match lane {
                        None => V::rows::<K, S, 1, false>(&plane, oy, v, &full),
                        Some(m) => V::rows::<K, S, 1, true>(&plane, oy, v, m),
                    },
                    (_, _) => plane.edge_row(oy, v, plane.kernel_rows(oy), lane.as_ref()),
                }
            }
            oy += block;
        }
    }
}

/// One plane's operands, shared by its rows.
struct Plane<'a, V: Vector, const K: usize, const S: usize> {
    input: *const f32,
    output: *mut f32,
    g: &'a ConvGeometry,
    weights: &'a [[V; K]; K],
    bias: V,
    /// The clamp's (lower, upper) bound in every lane.
    bounds: (V, V),
}

impl<V: Vector, const K: usize, const S: usize> Plane<'_, V, K, S> {
    /// The kernel rows of output row `oy` that lie inside the plane (none for a row
    /// whose kernel lies wholly in the padding below it).
    fn kernel_rows(&self, oy: usize) -> Range<usize> {
        let top = S * oy;
        let g = self.g;
        g.pad_top.saturating_sub(top)..(g.in_h + g.pad_top).saturating_sub(top).min(K)
    }

    /// Where tap `(0, 0)` of vector `v` of output row `oy` reads (it may lie outside
    /// the plane): kernel row `ky` is `ky * in_w` further.
    #[inline(always)]
    fn first_tap(&self, oy: usize, v: usize) -> *const f32 {
        let g = self.g;
        let offset = (S * oy * g.in_w + S * V::LANES * v) as isize
            - (g.pad_top * g.in_w + g.pad_left) as isize;
        self.input.wrapping_offset(offset)
    }

    /// The `K` tap vectors of one input row for one output vector: tap column `kx` in
    /// lane `l` is the row's value at `S * l + kx` from `row`.
    ///
    /// # Safety
    /// The CPU has `V`'s instructions; without `MASKED` every load is inside the row,
    /// with it `lanes` keep the lanes read inside it.
    #[inline(always)]
    unsafe fn taps<const MASKED: bool>(&self, row: *const f32, lanes: &LoadLanes) -> [V; K] {
        // SAFETY (every load): the caller's promise; masked-off lanes read nothing.
        let load = |at: usize, l: u16| unsafe {
            if MASKED {
                V::load_masked(row.wrapping_add(at), V::mask(l))
            } else {
                V::load(row.wrapping_add(at))
            }
        };
        // SAFETY: the CPU has V's instructions.
        let mut x = [unsafe { V::splat(0.0) }; K];
        if S == 1 {
            for (kx, x) in x.iter_mut().enumerate() {
                *x = load(kx, lanes[kx][0]);
            }
        } else {
            for j in 0..K.div_ceil(2) {
                let (a, b) = (
                    load(2 * j, lanes[j][0]),
                    load(2 * j + V::LANES, lanes[j][1]),
                );
                // SAFETY: the CPU has V's instructions.
                unsafe {
                    x[2 * j] = V::evens(a, b);
                    if 2 * j + 1 < K {
                        x[2 * j + 1] = V::odds(a, b);
                    }
                }
            }
        }
        x
    }

    /// Clamps `sum` and stores the lanes of vector `v` of output row `oy` inside it.
    ///
    /// # Safety
    /// The CPU has `V`'s instructions; row `oy` is a row of the output plane and `v`
    /// one of its vectors.
    #[inline(always)]
    unsafe fn store(&self, oy: usize, v: usize, sum: V) {
        let out_w = self.g.out_w;
        let lanes = (out_w - V::LANES * v).min(V::LANES);
        // SAFETY: the vector's `lanes` outputs lie inside output row `oy`.
        unsafe {
            let at = self.output.add(oy * out_w + V::LANES * v);
            sum.clamp(self.bounds.0, self.bounds.1)
                .store_first(at, lanes);
        }
    }

    /// Vector `v` of output rows `oy..oy + R`, every kernel row of each inside the
    /// plane: each input row they read loaded once and added to every output row it
    /// reaches, each output's taps in `(ky, kx)` order.
    ///
    /// # Safety
    /// The CPU has `V`'s instructions; the rows' kernel rows are inside the plane;
    /// without `MASKED` every load of vector `v` is inside its row, with it `lanes`
    /// keep them inside.
    #[inline(always)]
    unsafe fn rows<const R: usize, const MASKED: bool>(
        &self,
        oy: usize,
        v: usize,
        lanes: &LoadLanes,
    ) {
        let at = self.first_tap(oy, v);
        let mut acc = [self.bias; R];
        for i in 0..S * (R - 1) + K {
            // SAFETY: input row `S * oy - pad_top + i` is inside the plane.
            let x = unsafe { self.taps::<MASKED>(at.wrapping_add(i * self.g.in_w), lanes) };
            for (r, a) in acc.iter_mut().enumerate() {
                // Input row i is kernel row i - S * r of output row oy + r.
                if let Some(wr) = i.checked_sub(S * r).and_then(|ky| self.weights.get(ky)) {
                    for (&x, &wv) in x.iter().zip(wr) {
                        // SAFETY: the CPU has V's instructions.
                        *a = unsafe { x.fmadd(wv, *a) };
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
    /// plane), masked when `lanes` is given.
    ///
    /// # Safety
    /// The CPU has `V`'s instructions; `rows` are the row's kernel rows inside the
    /// plane; without `lanes` every load of vector `v` is inside its row, with them the
    /// loads stay inside.
    #[inline(always)]
    unsafe fn edge_row(&self, oy: usize, v: usize, rows: Range<usize>, lanes: Option<&LoadLanes>) {
        let at = self.first_tap(oy, v);
        let mut acc = self.bias;
        for ky in rows {
            let row = at.wrapping_add(ky * self.g.in_w);
            // SAFETY: kernel row ky of row oy is inside the plane, and the loads stay
            // inside its row; the CPU has V's instructions.
            unsafe {
                let x = match lanes {
                    None => self.taps::<false>(row, &[[u16::MAX; 2]; MAX_K]),
                    Some(m) => self.taps::<true>(row, m),
                };
                for (&x, &wv) in x.iter().zip(&self.weights[ky]) {
                    acc = x.fmadd(wv, acc);
                }
            }
        }
        // SAFETY: row oy is an output row.
        unsafe { self.store(oy, v, acc) };
    }
}
