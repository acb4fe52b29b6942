//! The x86-64 GEMM kernels, written once over [`Vector`] and compiled for each width by
//! the entry points of `avx512` (16 lanes) and `avx2` (8 lanes).
//!
//! * The micro-kernel computes an `MR x 2*LANES` tile: two accumulators per row, the A
//!   values broadcast one at a time against the two B vectors of each step; a tile of
//!   at most `LANES` columns has its own kernel with one.
//! * The panel product streams one packed `2*LANES`-column panel against one row (the
//!   matrix-vector product over a packed B), four steps at a time into separate
//!   accumulators so that the FMA latency never stalls the weight stream.
//! * The dot-product rows read a vector of weights per load and run 4 rows at once
//!   with two accumulators each (or one row with four).

use super::kernels::{TilePost, WeightElem, dot_scalar};
use crate::simd_x86::Vector;

/// Defines `$name`, a micro-kernel entry point compiled with `$features`: the body
/// `x86::$body::<$width, $mr>` ([`kernel`] or [`kernel_one_vector`]) behind the
/// [`super::kernels::SimdKernel`] signature.
macro_rules! tile_entry {
    ($(#[$doc:meta])* $name:ident = $body:ident::<$width:ty, $mr:ident>, $features:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        #[doc = concat!("Needs `", $features, "`; the operands as the body says.")]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(
            kc: usize,
            a: (*const f32, usize),
            b: (*const f32, usize),
            c: (*mut f32, usize, usize),
            accumulate: bool,
            post: Option<&TilePost>,
        ) {
            // SAFETY: the caller's promise, the instructions enabled here.
            unsafe { super::x86::$body::<$width, $mr>(kc, a, b, c, accumulate, post) }
        }
    };
}
pub(super) use tile_entry;

/// Defines `axpy_rows`, [`super::axpy_rows_body`] with fused multiply-adds compiled
/// with `$features` (`$what` in its doc), behind the `CpuSupport` token of an [`crate::Isa`]
/// that has them.
macro_rules! axpy_rows_entry {
    ($features:literal, $what:literal) => {
        #[doc = concat!("[`super::axpy_rows_body`] compiled with ", $what, ".")]
        pub(super) fn axpy_rows(
            _: crate::CpuSupport,
            xs: &[f32],
            b: &[f32],
            start: usize,
            ld: usize,
            acc: &mut [f32],
        ) {
            #[target_feature(enable = $features)]
            unsafe fn run(xs: &[f32], b: &[f32], start: usize, ld: usize, acc: &mut [f32]) {
                super::axpy_rows_body::<true>(xs, b, start, ld, acc)
            }
            // SAFETY: the `CpuSupport` token the caller passes (`Isa::avx2` or
            // `Isa::avx512`, matching the width that invokes this) proves these features
            // were detected on this CPU.
            unsafe { run(xs, b, start, ld, acc) }
        }
    };
}
pub(super) use axpy_rows_entry;

/// Defines, in the module that invokes it, the entry points of one vector width
/// `$width` with `$mr`-row tiles: the kernels compiled with `$features` behind the
/// signatures of [`super::kernels`] (`kernel`: [`kernel`], `kernel_one_vector`:
/// [`kernel_one_vector`], `kernel_row`: [`kernel_row`], `panel_dot`: [`panel_dot`]),
/// and `dot_rows`, the dot-product rows ([`dot4`], [`dot1`]) compiled with
/// `$dot_features` (which convert half-precision weights).
macro_rules! entry_points {
    ($width:ty, $mr:ident, $features:literal, $dot_features:literal) => {
        use super::kernels::{TilePost, WeightElem, by_four_rows};
        use crate::CpuSupport;

        super::x86::tile_entry!(
            /// The micro-kernel ([`super::x86::kernel`]) of a full-width tile.
            kernel = kernel::<$width, $mr>, $features
        );
        super::x86::tile_entry!(
            /// The micro-kernel of a tile of at most one vector of columns
            /// ([`super::x86::kernel_one_vector`]).
            kernel_one_vector = kernel_one_vector::<$width, $mr>, $features
        );

        /// The micro-kernel over a row of whole tiles ([`super::x86::kernel_row`]).
        ///
        /// # Safety
        #[doc = concat!("Needs `", $features, "`; the operands as the body says.")]
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn kernel_row(
            kc: usize,
            a: (*const f32, usize),
            b: (*const f32, usize, usize),
            c: (*mut f32, usize),
            panels: usize,
            accumulate: bool,
            post: Option<&TilePost>,
        ) {
            // SAFETY: the caller's promise, the instructions enabled here.
            unsafe { super::x86::kernel_row::<$width, $mr>(kc, a, b, c, panels, accumulate, post) }
        }

        /// The panel product ([`super::x86::panel_dot`]) of a `2*LANES`-column panel.
        ///
        /// # Safety
        #[doc = concat!("Needs `", $features, "`. `x` must hold `k` floats, `b` `k` ")]
        /// steps of the panel and `out` the panel's width.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn panel_dot(k: usize, x: *const f32, b: *const f32, out: *mut f32) {
            // SAFETY: the caller's promise, the instructions enabled here.
            unsafe { super::x86::panel_dot::<$width>(k, x, b, out) }
        }

        /// [`super::x86::dot4`] at this width.
        ///
        /// # Safety
        #[doc = concat!("Needs `", $dot_features, "`; each `w[r]` must point at ")]
        /// `x.len()` elements.
        #[target_feature(enable = $dot_features)]
        unsafe fn dot4<W: WeightElem>(x: &[f32], w: [*const W; 4]) -> [f32; 4] {
            // SAFETY: the caller's promise, the instructions enabled here.
            unsafe { super::x86::dot4::<$width, W>(x, w) }
        }

        /// [`super::x86::dot1`] at this width.
        ///
        /// # Safety
        #[doc = concat!("Needs `", $dot_features, "`; `w` must point at `x.len()` ")]
        /// elements.
        #[target_feature(enable = $dot_features)]
        unsafe fn dot1<W: WeightElem>(x: &[f32], w: *const W) -> f32 {
            // SAFETY: the caller's promise, the instructions enabled here.
            unsafe { super::x86::dot1::<$width, W>(x, w) }
        }

        /// `out[j] = dot(x, w[j*ldw..][..k])`, 4 rows at a time.
        pub(super) fn dot_rows<W: WeightElem>(
            _proof: CpuSupport,
            x: &[f32],
            w: &[W],
            ldw: usize,
            out: &mut [f32],
        ) {
            by_four_rows(
                x.len(),
                w,
                ldw,
                out,
                // SAFETY: the CpuSupport proof says the instructions were detected;
                // each row slice holds x.len() elements.
                |r| unsafe { dot4(x, r.map(<[W]>::as_ptr)) },
                // SAFETY: as above, for one row.
                |r| unsafe { dot1(x, r.as_ptr()) },
            )
        }
    };
}
pub(super) use entry_points;

/// [`kernel`] over `panels` whole `MR x 2*LANES` tiles side by side, the same A panel
/// against each: tile `q` reads B from `b + q*b_step` (steps `ldb` apart) and writes
/// columns `q*2*LANES..` of the rows at `c`. One call for a row of tiles, so that a
/// short product (a pointwise convolution's few input channels) pays the call, the
/// bounds checks and the finish's setup once per row rather than once per tile.
///
/// # Safety
/// As [`kernel`] for each tile: `a` as there, `b` `(panels-1)*b_step + (kc-1)*ldb +
/// 2*LANES` floats, `c` `MR` rows of `panels*2*LANES` floats at row stride `ldc`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn kernel_row<V: Vector, const MR: usize>(
    kc: usize,
    a: (*const f32, usize),
    (b, ldb, b_step): (*const f32, usize, usize),
    (c, ldc): (*mut f32, usize),
    panels: usize,
    accumulate: bool,
    post: Option<&TilePost>,
) {
    let width = 2 * V::LANES;
    for q in 0..panels {
        // SAFETY: tile q's B steps and output columns lie inside the caller's ranges.
        unsafe {
            let bq = (b.add(q * b_step), ldb);
            let cq = (c.add(q * width), ldc, width);
            kernel::<V, MR>(kc, a, bq, cq, accumulate, post);
        }
    }
}

/// The `MR x 2*LANES` micro-kernel: `tile (+)= A · B` over `kc` steps, then `post`,
/// stored to the first `cols` (1 to `2*LANES`) columns of the tile.
///
/// A is a packed panel (`lda == 0`: step `k`, row `r` at `a[k*MR + r]`) or `MR` rows of
/// a row-major matrix read in place (row `r`, step `k` at `a[r*lda + k]`). B's step `k`
/// is the `2*LANES` values at `b + k*ldb` (`ldb == 2*LANES`: a packed panel; more:
/// columns of a row-major matrix read in place).
///
/// # Safety
/// As [`Vector`]'s methods. `a` must hold `kc*MR` floats (packed) or `(MR-1)*lda + kc`
/// (rows), `b` `(kc-1)*ldb + 2*LANES`, and `c` `MR` rows of `cols` floats at row
/// stride `ldc`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn kernel<V: Vector, const MR: usize>(
    kc: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc, cols): (*mut f32, usize, usize),
    accumulate: bool,
    post: Option<&TilePost>,
) {
    let lanes = V::LANES;
    // Columns stored from each of the row's two vectors.
    let (cols0, cols1) = (cols.min(lanes), cols.saturating_sub(lanes).min(lanes));
    let whole = cols0 + cols1 == 2 * lanes;
    // SAFETY (every block below): the CPU has V's instructions (the caller's promise).
    let mut acc = [[unsafe { V::splat(0.0) }; 2]; MR];
    // The steps, with `$at(k, r)` the address of A's value for row r at step k.
    macro_rules! steps {
        ($at:expr) => {
            for k in 0..kc {
                // SAFETY: k < kc, so both B vectors of step k (at k*ldb) are inside b.
                let (b0, b1) = unsafe {
                    let bk = b.add(k * ldb);
                    (V::load(bk), V::load(bk.add(lanes)))
                };
                for (r, row) in acc.iter_mut().enumerate() {
                    // SAFETY: r < MR and k < kc: inside A (see the function's contract).
                    unsafe {
                        let av = V::splat(*$at(k, r));
                        row[0] = av.fmadd(b0, row[0]);
                        row[1] = av.fmadd(b1, row[1]);
                    }
                }
            }
        };
    }
    if lda == 0 {
        steps!(|k: usize, r: usize| a.wrapping_add(k * MR + r));
    } else {
        steps!(|k: usize, r: usize| a.wrapping_add(r * lda + k));
    }
    for (r, row) in acc.iter().enumerate() {
        // SAFETY: the tile has MR rows of `cols` floats at stride ldc, and only those
        // are read and written (the lanes past them masked off).
        unsafe {
            let cr = c.add(r * ldc);
            let (mut v0, mut v1) = (row[0], row[1]);
            if accumulate && whole {
                v0 = v0.add(V::load(cr));
                v1 = v1.add(V::load(cr.add(lanes)));
            } else if accumulate {
                v0 = v0.add(V::load_first(cr, cols0));
                v1 = v1.add(V::load_first(cr.add(lanes), cols1));
            }
            if let Some(post) = post {
                // (v + row value) + column value, then max(lo, ·) and min(hi, ·): the
                // second operand is returned for NaN and for equal values, so this is
                // exactly `output_clamp` (NaN and signed zeros kept).
                let row_add = V::splat(post.row_add[r]);
                let col = post.col_add.as_ptr();
                let (lo, hi) = (V::splat(post.lo), V::splat(post.hi));
                v0 = v0.add(row_add).add(V::load(col)).clamp(lo, hi);
                v1 = v1.add(row_add).add(V::load(col.add(lanes))).clamp(lo, hi);
            }
            if whole {
                v0.store(cr);
                v1.store(cr.add(lanes));
            } else {
                v0.store_first(cr, cols0);
                v1.store_first(cr.add(lanes), cols1);
            }
        }
    }
}

/// [`kernel`] for a tile of at most `LANES` columns (the last of a row whose width is not
/// a multiple of `2*LANES`): only B's first vector of each step is multiplied, half the
/// work of the two-vector tile for the same values.
///
/// # Safety
/// As [`kernel`], with `cols <= LANES`.
#[inline(always)]
pub(super) unsafe fn kernel_one_vector<V: Vector, const MR: usize>(
    kc: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc, cols): (*mut f32, usize, usize),
    accumulate: bool,
    post: Option<&TilePost>,
) {
    let cols = cols.min(V::LANES);
    // SAFETY (every block below): the CPU has V's instructions (the caller's promise).
    let mut acc = [unsafe { V::splat(0.0) }; MR];
    // The steps, with `$at(k, r)` the address of A's value for row r at step k.
    macro_rules! steps {
        ($at:expr) => {
            for k in 0..kc {
                // SAFETY: k < kc, so B's first vector of step k (at k*ldb) is inside b.
                let bv = unsafe { V::load(b.add(k * ldb)) };
                for (r, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: r < MR and k < kc: inside A (see the function's contract).
                    unsafe { *acc = V::splat(*$at(k, r)).fmadd(bv, *acc) };
                }
            }
        };
    }
    if lda == 0 {
        steps!(|k: usize, r: usize| a.wrapping_add(k * MR + r));
    } else {
        steps!(|k: usize, r: usize| a.wrapping_add(r * lda + k));
    }
    for (r, &v) in acc.iter().enumerate() {
        // SAFETY: the tile has MR rows of `cols` floats at stride ldc, and only those
        // are read and written (the lanes past them masked off).
        unsafe {
            let cr = c.add(r * ldc);
            let mut v = v;
            if accumulate {
                v = v.add(V::load_first(cr, cols));
            }
            if let Some(post) = post {
                // As in `kernel`: exactly `output_clamp`.
                let row_add = V::splat(post.row_add[r]);
                let (lo, hi) = (V::splat(post.lo), V::splat(post.hi));
                v = v
                    .add(row_add)
                    .add(V::load(post.col_add.as_ptr()))
                    .clamp(lo, hi);
            }
            v.store_first(cr, cols);
        }
    }
}

/// One row of A against one packed panel of `2*LANES` columns:
/// `out[c] = Σ_k x[k] · b[k*2*LANES + c]`.
///
/// # Safety
/// As [`Vector`]'s methods. `x` must hold `k` floats, `b` `k*2*LANES` and `out`
/// `2*LANES`.
#[inline(always)]
pub(super) unsafe fn panel_dot<V: Vector>(k: usize, x: *const f32, b: *const f32, out: *mut f32) {
    let (lanes, nr) = (V::LANES, 2 * V::LANES);
    // SAFETY (every block below): the CPU has V's instructions (the caller's promise).
    let mut acc = [[unsafe { V::splat(0.0) }; 2]; 4];
    let mut kk = 0;
    while kk + 4 <= k {
        for (u, pair) in acc.iter_mut().enumerate() {
            // SAFETY: kk + u < k: x[kk+u] and the weights of that step are inside.
            unsafe {
                let xv = V::splat(*x.add(kk + u));
                let bk = b.add((kk + u) * nr);
                pair[0] = xv.fmadd(V::load(bk), pair[0]);
                pair[1] = xv.fmadd(V::load(bk.add(lanes)), pair[1]);
            }
        }
        kk += 4;
    }
    while kk < k {
        // SAFETY: kk < k, as above.
        unsafe {
            let xv = V::splat(*x.add(kk));
            let bk = b.add(kk * nr);
            acc[0][0] = xv.fmadd(V::load(bk), acc[0][0]);
            acc[0][1] = xv.fmadd(V::load(bk.add(lanes)), acc[0][1]);
        }
        kk += 1;
    }
    // SAFETY: out holds 2*LANES floats.
    unsafe {
        let sum = |h: usize| acc[0][h].add(acc[1][h]).add(acc[2][h].add(acc[3][h]));
        sum(0).store(out);
        sum(1).store(out.add(lanes));
    }
}

/// Dot products of `x` with 4 rows at once (shared loads of `x`, 8 accumulators).
///
/// # Safety
/// As [`Vector`]'s methods (with F16C for f16 weights at 8 lanes); each `w[r]` must
/// point at `x.len()` elements.
#[inline(always)]
pub(super) unsafe fn dot4<V: Vector, W: WeightElem>(x: &[f32], w: [*const W; 4]) -> [f32; 4] {
    let (k, lanes) = (x.len(), V::LANES);
    let xp = x.as_ptr();
    // SAFETY (every block below): the CPU has V's instructions (the caller's promise).
    let mut acc0 = [unsafe { V::splat(0.0) }; 4];
    let mut acc1 = acc0;
    let mut i = 0;
    while i + 2 * lanes <= k {
        // SAFETY: i + 2*LANES <= k, inside x and every row.
        unsafe {
            let x0 = V::load(xp.add(i));
            let x1 = V::load(xp.add(i + lanes));
            for r in 0..4 {
                acc0[r] = V::load_weights(w[r].add(i)).fmadd(x0, acc0[r]);
                acc1[r] = V::load_weights(w[r].add(i + lanes)).fmadd(x1, acc1[r]);
            }
        }
        i += 2 * lanes;
    }
    if i + lanes <= k {
        // SAFETY: i + LANES <= k.
        unsafe {
            let x0 = V::load(xp.add(i));
            for r in 0..4 {
                acc0[r] = V::load_weights(w[r].add(i)).fmadd(x0, acc0[r]);
            }
        }
        i += lanes;
    }
    std::array::from_fn(|r| {
        // SAFETY: the tail indices i..k are below k, inside row r.
        unsafe {
            let tail = std::slice::from_raw_parts(w[r].add(i), k - i);
            acc0[r].add(acc1[r]).reduce_add() + dot_scalar(&x[i..], tail)
        }
    })
}

/// The dot product of `x` with one row (four accumulators).
///
/// # Safety
/// As [`dot4`], for one row.
#[inline(always)]
pub(super) unsafe fn dot1<V: Vector, W: WeightElem>(x: &[f32], w: *const W) -> f32 {
    let (k, lanes) = (x.len(), V::LANES);
    let xp = x.as_ptr();
    // SAFETY (every block below): the CPU has V's instructions (the caller's promise).
    let mut acc = [unsafe { V::splat(0.0) }; 4];
    let mut i = 0;
    while i + 4 * lanes <= k {
        for (l, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 4*LANES <= k.
            unsafe {
                let at = i + lanes * l;
                *a = V::load_weights(w.add(at)).fmadd(V::load(xp.add(at)), *a);
            }
        }
        i += 4 * lanes;
    }
    while i + lanes <= k {
        // SAFETY: i + LANES <= k.
        unsafe {
            acc[0] = V::load_weights(w.add(i)).fmadd(V::load(xp.add(i)), acc[0]);
        }
        i += lanes;
    }
    // SAFETY: the tail indices are below k.
    unsafe {
        let s = acc[0].add(acc[1]).add(acc[2].add(acc[3])).reduce_add();
        let tail = std::slice::from_raw_parts(w.add(i), k - i);
        s + dot_scalar(&x[i..], tail)
    }
}
