//! The inner loops of attention over f32 rows: dot products of a query with a tile of
//! key rows, exp of shifted scores with their sum, multiply-adds of value rows, row
//! maxima and scaling. Plain functions over slices with no knowledge of tensors.
//!
//! Each loop is written once, generic over how `a * b + c` is computed, and compiled
//! three ways: portable with a separate multiply and add (the scalar twin, for
//! [`Isa::Scalar`]), inside `#[target_feature(enable = "avx2,fma")]` entry points with
//! fused multiply-adds and AVX2 dot products (x86-64, for any [`Isa`] that includes
//! AVX2: AVX-512 CPUs run these loops), and with `f32::mul_add` on aarch64 (NEON
//! `fmla`). The other loops work on fixed groups of eight independent accumulators,
//! which the compiler turns into vector registers. Results depend on the [`Isa`] only
//! through fused versus separate multiply-adds; for one `Isa` they are deterministic.
//!
//! Two loops serve prefill's row sets of [`QUERY_ROWS`] or more queries and have their
//! own AVX-512 and AVX2 kernels: [`scores_transposed`] (scores from a key tile
//! transposed by [`transpose_keys`], four rows by [`KEY_COLUMNS`] keys per block) and
//! [`accumulate_rows`] (the value sums of four rows, with [`accumulate`]'s bits).

#[cfg(target_arch = "x86_64")]
use crate::CpuSupport;
use crate::Isa;

/// The body of an entry point over a loop `$with` generic over [`Arith`], each call
/// given the arguments `$arg`: on x86-64 the AVX2 entry point `$x86` (the CPU token
/// first) where `$isa` includes AVX2, on aarch64 `$with::<Fused>` where it has NEON,
/// and `$with::<Plain>` (the scalar twin) otherwise.
macro_rules! by_isa {
    ($isa:ident, $x86:path, $with:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = $isa.avx2() {
            return $x86(t, $($arg),*);
        }
        #[cfg(target_arch = "aarch64")]
        if $isa.neon().is_some() {
            return $with::<Fused>($($arg),*);
        }
        let _ = $isa;
        $with::<Plain>($($arg),*)
    }};
}

/// `out[j] = q · tile_row(j)` for `j < out.len()`, where row `j` of the tile starts at
/// `j * stride` and is `q.len()` long (rows past the tile's end read as empty: 0).
pub fn scores(isa: Isa, q: &[f32], tile: &[f32], stride: usize, out: &mut [f32]) {
    by_isa!(isa, x86::scores, scores_with(q, tile, stride, out))
}

/// `acc += Σ_j p[j] * tile_row(j)` for `j < p.len()`, rows `acc.len()` long at
/// `j * stride` (rows past the tile's end read as empty).
pub fn accumulate(isa: Isa, p: &[f32], tile: &[f32], stride: usize, acc: &mut [f32]) {
    by_isa!(isa, x86::accumulate, accumulate_with(p, tile, stride, acc))
}

/// `x[j] = exp(x[j] - m)` and returns `Σ x[j]`, for `m >= max(x)` finite (see
/// [`exp_nonpositive`] for the accuracy).
pub fn exp_shift_sum(isa: Isa, x: &mut [f32], m: f32) -> f32 {
    by_isa!(isa, x86::exp_shift_sum, exp_shift_sum_with(x, m))
}

/// `e^x` for `x <= 0` (larger `x` is clamped to 0), with a relative error of a few ulp;
/// `-inf` and anything below -87 give exactly 0. Fused multiply-adds where `isa`
/// has them (the same value [`exp_shift_sum`] computes for one element).
pub fn exp_nonpositive(isa: Isa, x: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2().is_some() {
        // `mul_add` is exact on any CPU: no AVX2 instruction is needed for one value.
        return exp_nonpositive_with::<Avx2Fma>(x);
    }
    #[cfg(target_arch = "aarch64")]
    if isa.neon().is_some() {
        return exp_nonpositive_with::<Fused>(x);
    }
    let _ = isa;
    exp_nonpositive_with::<Plain>(x)
}

/// Keys the blocked score kernel computes at once: the row stride of a transposed key
/// tile ([`transpose_keys`]) is a multiple of it.
pub const KEY_COLUMNS: usize = 32;

/// Query rows the blocked score kernel computes at once; row sets smaller than this are
/// better served by [`scores`].
pub const QUERY_ROWS: usize = 4;

/// Writes keys `j < n` (rows `j * stride` of `tile`, `d` components each) as columns of
/// `kt`: component `c` of key `j` at `kt[c * kt_stride + j]`, columns `n .. kt_stride`
/// zero. Returns false, writing nothing, unless `kt_stride` is a multiple of
/// [`KEY_COLUMNS`] at least `n`, `kt` holds `d * kt_stride` elements and the tile
/// holds every key.
pub fn transpose_keys(
    tile: &[f32],
    stride: usize,
    n: usize,
    d: usize,
    kt: &mut [f32],
    kt_stride: usize,
) -> bool {
    let tile_fits = n == 0
        || (n - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(d))
            .is_some_and(|end| end <= tile.len());
    let Some(kt) = d.checked_mul(kt_stride).and_then(|len| kt.get_mut(..len)) else {
        return false;
    };
    if !tile_fits || kt_stride < n || !kt_stride.is_multiple_of(KEY_COLUMNS) {
        return false;
    }
    if d == 0 {
        return true;
    }
    // Key by key: each row read once, contiguously; its components scattered down one
    // column of `kt` (which stays in L1).
    for j in 0..n {
        let key = &tile[j * stride..][..d];
        for (x, &v) in kt[j..].iter_mut().step_by(kt_stride).zip(key) {
            *x = v;
        }
    }
    for column in kt.chunks_exact_mut(kt_stride) {
        column[n..].fill(0.0);
    }
    true
}

/// `s[r * s_stride + j] = q_r · key_j` for query rows `r < rows` (`q[r * d ..][..d]`)
/// and keys `j < n` of a tile transposed by [`transpose_keys`] (row stride
/// `kt_stride`). Each score is one chain of multiply-adds over the components in order
/// (fused where `isa` has FMA), computed [`QUERY_ROWS`] rows by [`KEY_COLUMNS`] keys
/// at a time with no horizontal sums. Returns false, writing nothing, when an operand
/// is too short.
#[allow(clippy::too_many_arguments)]
pub fn scores_transposed(
    isa: Isa,
    q: &[f32],
    d: usize,
    rows: usize,
    kt: &[f32],
    kt_stride: usize,
    n: usize,
    s: &mut [f32],
    s_stride: usize,
) -> bool {
    let fits = kt_stride.is_multiple_of(KEY_COLUMNS)
        && n <= kt_stride
        && n <= s_stride
        && rows.checked_mul(d).is_some_and(|len| len <= q.len())
        && d.checked_mul(kt_stride).is_some_and(|len| len <= kt.len())
        && (rows == 0
            || (rows - 1)
                .checked_mul(s_stride)
                .and_then(|x| x.checked_add(n))
                .is_some_and(|end| end <= s.len()));
    if !fits {
        return false;
    }
    if rows == 0 || n == 0 {
        return true;
    }
    let b = Blocked {
        q,
        d,
        rows,
        kt,
        kt_stride,
        n,
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = isa.avx512() {
        x86::scores_transposed_avx512(t, &b, s, s_stride);
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = isa.avx2() {
        x86::scores_transposed_avx2(t, &b, s, s_stride);
        return true;
    }
    #[cfg(target_arch = "aarch64")]
    if isa.neon().is_some() {
        scores_transposed_with::<Fused, 16>(&b, s, s_stride);
        return true;
    }
    let _ = isa;
    scores_transposed_with::<Plain, KEY_COLUMNS>(&b, s, s_stride);
    true
}

/// [`accumulate`] for [`QUERY_ROWS`] rows at once: `acc_r += Σ_{j<n} p_r[j] *
/// tile_row(j)` for `r < QUERY_ROWS`, with `p_r = p[r * p_stride ..][..n]`, `acc_r =
/// acc[r * d ..][..d]` and tile rows `d` long at `j * stride`. Every element is the same
/// chain of multiply-adds in `j` order as [`accumulate`] computes (the same bits);
/// each value row is loaded once for all the rows. Returns false, writing nothing,
/// when an operand is too short.
#[allow(clippy::too_many_arguments)]
pub fn accumulate_rows(
    isa: Isa,
    p: &[f32],
    p_stride: usize,
    n: usize,
    tile: &[f32],
    stride: usize,
    acc: &mut [f32],
    d: usize,
) -> bool {
    let within = |len: usize, last: usize, step: usize, width: usize| {
        last.checked_mul(step)
            .and_then(|x| x.checked_add(width))
            .is_some_and(|end| end <= len)
    };
    let fits = n <= p_stride
        && within(p.len(), QUERY_ROWS - 1, p_stride, n)
        && (n == 0 || within(tile.len(), n - 1, stride, d))
        && within(acc.len(), QUERY_ROWS - 1, d, d);
    if !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let rows = Rows4 {
            p,
            p_stride,
            n,
            tile,
            stride,
            d,
        };
        if let Some(t) = isa.avx512() {
            x86::accumulate_rows_avx512(t, &rows, acc);
            return true;
        }
        if let Some(t) = isa.avx2() {
            x86::accumulate_rows_avx2(t, &rows, acc);
            return true;
        }
    }
    for (r, a) in acc.chunks_exact_mut(d.max(1)).take(QUERY_ROWS).enumerate() {
        accumulate(isa, &p[r * p_stride..][..n], tile, stride, a);
    }
    true
}

/// The operands of [`accumulate_rows`], checked (read by the x86 kernels).
#[cfg(target_arch = "x86_64")]
struct Rows4<'a> {
    p: &'a [f32],
    p_stride: usize,
    n: usize,
    tile: &'a [f32],
    stride: usize,
    d: usize,
}

/// Whether [`scores_transposed`] has a vector kernel for `isa` (AVX2 or AVX-512);
/// elsewhere the one-row [`scores`] is as fast.
pub fn scores_transposed_is_fast(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2().is_some() {
        return true;
    }
    let _ = isa;
    false
}

/// The operands of [`scores_transposed`], checked.
struct Blocked<'a> {
    q: &'a [f32],
    d: usize,
    rows: usize,
    kt: &'a [f32],
    kt_stride: usize,
    n: usize,
}

/// [`scores_transposed`]'s portable loop (the scalar twin of the x86 kernels): `W`
/// keys (a divisor of [`KEY_COLUMNS`]) by [`QUERY_ROWS`] rows per block. The last row
/// block repeats its last row to fill up and stores only the real rows.
#[inline(always)]
fn scores_transposed_with<A: Arith, const W: usize>(
    b: &Blocked<'_>,
    s: &mut [f32],
    s_stride: usize,
) {
    let d = b.d;
    let row = |r: usize| b.q.get(r * d..(r + 1) * d).unwrap_or(&[]);
    let mut r0 = 0;
    while r0 < b.rows {
        let real = (b.rows - r0).min(QUERY_ROWS);
        let qr: [&[f32]; QUERY_ROWS] = std::array::from_fn(|i| row(r0 + i.min(real - 1)));
        if qr.iter().any(|r| r.len() != d) {
            return;
        }
        let mut j0 = 0;
        while j0 < b.n {
            let mut acc = [[0f32; W]; QUERY_ROWS];
            for c in 0..d {
                let Some(k) =
                    b.kt.get(c * b.kt_stride + j0..)
                        .and_then(|x| x.first_chunk::<W>())
                else {
                    return;
                };
                for (a, qrow) in acc.iter_mut().zip(&qr) {
                    let x = qrow[c];
                    for (lane, kv) in a.iter_mut().zip(k) {
                        *lane = A::fma(x, *kv, *lane);
                    }
                }
            }
            let cols = (b.n - j0).min(W);
            for (i, a) in acc.iter().enumerate().take(real) {
                let at = (r0 + i) * s_stride + j0;
                if let Some(dst) = s.get_mut(at..at + cols) {
                    dst.copy_from_slice(&a[..cols]);
                }
            }
            j0 += W;
        }
        r0 += QUERY_ROWS;
    }
}

/// The AVX2 + FMA entry points: the generic loops compiled with the features enabled.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m256, __m512, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_storeu_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
        _mm512_storeu_ps,
    };

    use super::{Avx2Fma, CpuSupport, QUERY_ROWS};

    /// [`super::scores`] with AVX2 and FMA.
    pub(super) fn scores(_: CpuSupport, q: &[f32], tile: &[f32], stride: usize, out: &mut [f32]) {
        // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
        unsafe { scores_avx2(q, tile, stride, out) }
    }

    /// [`super::accumulate`] with AVX2 and FMA.
    pub(super) fn accumulate(
        _: CpuSupport,
        p: &[f32],
        tile: &[f32],
        stride: usize,
        acc: &mut [f32],
    ) {
        // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
        unsafe { accumulate_avx2(p, tile, stride, acc) }
    }

    /// [`super::exp_shift_sum`] with AVX2 and FMA.
    pub(super) fn exp_shift_sum(_: CpuSupport, x: &mut [f32], m: f32) -> f32 {
        // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
        unsafe { exp_shift_sum_avx2(x, m) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn scores_avx2(q: &[f32], tile: &[f32], stride: usize, out: &mut [f32]) {
        super::scores_with::<Avx2Fma>(q, tile, stride, out)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn accumulate_avx2(p: &[f32], tile: &[f32], stride: usize, acc: &mut [f32]) {
        <Avx2Fma as super::Arith>::accumulate(p, tile, stride, acc)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_shift_sum_avx2(x: &mut [f32], m: f32) -> f32 {
        super::exp_shift_sum_with::<Avx2Fma>(x, m)
    }

    /// [`super::scores_transposed`] with AVX2 and FMA: 16 keys (two registers) by four
    /// rows.
    pub(super) fn scores_transposed_avx2(
        _: CpuSupport,
        b: &super::Blocked<'_>,
        s: &mut [f32],
        s_stride: usize,
    ) {
        // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
        unsafe { blocked_avx2(b, s, s_stride) }
    }

    /// [`super::scores_transposed`] with AVX-512 F: 32 keys (two registers) by four
    /// rows.
    pub(super) fn scores_transposed_avx512(
        _: CpuSupport,
        b: &super::Blocked<'_>,
        s: &mut [f32],
        s_stride: usize,
    ) {
        // SAFETY: the token comes from `Isa::avx512`, which proves AVX-512 F (and
        // AVX2 and FMA) were detected on this CPU.
        unsafe { blocked_avx512(b, s, s_stride) }
    }

    /// Generates a blocked score kernel: `2 * $v` keys in two registers of `$v` lanes by
    /// [`QUERY_ROWS`] rows; every score is one chain of fused multiply-adds over the
    /// components in order, as in the scalar twin.
    macro_rules! blocked {
        ($name:ident, $feat:literal, $reg:ty, $v:literal, $zero:ident, $load:ident, $set1:ident, $fma:ident, $store:ident) => {
            #[target_feature(enable = $feat)]
            unsafe fn $name(b: &super::Blocked<'_>, s: &mut [f32], s_stride: usize) {
                const W: usize = 2 * $v;
                let d = b.d;
                let mut r0 = 0;
                while r0 < b.rows {
                    let real = (b.rows - r0).min(QUERY_ROWS);
                    // The last block repeats its last row; only real rows are stored.
                    let qp: [*const f32; QUERY_ROWS] = std::array::from_fn(|i| {
                        // SAFETY: row r0 + min(i, real - 1) < rows, and `b.q` holds
                        // rows * d elements (checked by `scores_transposed`).
                        unsafe { b.q.as_ptr().add((r0 + i.min(real - 1)) * d) }
                    });
                    let mut j0 = 0;
                    while j0 < b.n {
                        let mut acc: [$reg; 2 * QUERY_ROWS] = [$zero(); 2 * QUERY_ROWS];
                        for c in 0..d {
                            // SAFETY: c < d and j0 + W <= kt_stride (a multiple of W, at
                            // least n > j0), and kt holds d * kt_stride elements; each
                            // query pointer reads component c < d of its row.
                            unsafe {
                                let kp = b.kt.as_ptr().add(c * b.kt_stride + j0);
                                let (k0, k1) = ($load(kp), $load(kp.add($v)));
                                for i in 0..QUERY_ROWS {
                                    let x = $set1(*qp[i].add(c));
                                    acc[2 * i] = $fma(x, k0, acc[2 * i]);
                                    acc[2 * i + 1] = $fma(x, k1, acc[2 * i + 1]);
                                }
                            }
                        }
                        let cols = (b.n - j0).min(W);
                        for i in 0..real {
                            let mut row = [0f32; W];
                            // SAFETY: `row` holds W = 2 * $v elements.
                            unsafe {
                                $store(row.as_mut_ptr(), acc[2 * i]);
                                $store(row.as_mut_ptr().add($v), acc[2 * i + 1]);
                            }
                            let at = (r0 + i) * s_stride + j0;
                            if let Some(dst) = s.get_mut(at..at + cols) {
                                dst.copy_from_slice(&row[..cols]);
                            }
                        }
                        j0 += W;
                    }
                    r0 += QUERY_ROWS;
                }
            }
        };
    }

    /// [`super::accumulate_rows`] with AVX2 and FMA.
    pub(super) fn accumulate_rows_avx2(_: CpuSupport, r: &super::Rows4<'_>, acc: &mut [f32]) {
        // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
        unsafe { rows_avx2(r, acc) }
    }

    /// [`super::accumulate_rows`] with AVX-512 F.
    pub(super) fn accumulate_rows_avx512(_: CpuSupport, r: &super::Rows4<'_>, acc: &mut [f32]) {
        // SAFETY: the token comes from `Isa::avx512`, which proves AVX-512 F (and
        // AVX2 and FMA) were detected on this CPU.
        unsafe { rows_avx512(r, acc) }
    }

    /// Generates a four-row value accumulation: columns in blocks of `$regs` registers
    /// of `$v` lanes (then one register, then one element), four rows of accumulators
    /// held across every key, each key's value row loaded once per block.
    macro_rules! rows {
        ($name:ident, $feat:literal, $reg:ty, $v:literal, $regs:literal, $load:ident, $set1:ident, $fma:ident, $store:ident) => {
            #[target_feature(enable = $feat)]
            unsafe fn $name(r: &super::Rows4<'_>, acc: &mut [f32]) {
                let (d, n) = (r.d, r.n);
                let ap = acc.as_mut_ptr();
                let pp = r.p.as_ptr();
                let tp = r.tile.as_ptr();
                let mut c = 0;
                // SAFETY (all blocks below): `accumulate_rows` checked that rows
                // 0..QUERY_ROWS of acc (d apart, d long) and of p (p_stride apart, n
                // long) and tile rows j < n (stride apart, d long) are in bounds; every
                // access is at a column below d or a key below n.
                while c + $regs * $v <= d {
                    unsafe {
                        let mut a: [[$reg; $regs]; QUERY_ROWS] = std::array::from_fn(|i| {
                            std::array::from_fn(|k| $load(ap.add(i * d + c + k * $v)))
                        });
                        for j in 0..n {
                            let vp = tp.add(j * r.stride + c);
                            let v: [$reg; $regs] = std::array::from_fn(|k| $load(vp.add(k * $v)));
                            for (i, row) in a.iter_mut().enumerate() {
                                let w = $set1(*pp.add(i * r.p_stride + j));
                                for (x, vk) in row.iter_mut().zip(&v) {
                                    *x = $fma(w, *vk, *x);
                                }
                            }
                        }
                        for (i, row) in a.iter().enumerate() {
                            for (k, x) in row.iter().enumerate() {
                                $store(ap.add(i * d + c + k * $v), *x);
                            }
                        }
                    }
                    c += $regs * $v;
                }
                while c + $v <= d {
                    unsafe {
                        let mut a: [$reg; QUERY_ROWS] =
                            std::array::from_fn(|i| $load(ap.add(i * d + c)));
                        for j in 0..n {
                            let v = $load(tp.add(j * r.stride + c));
                            for (i, x) in a.iter_mut().enumerate() {
                                *x = $fma($set1(*pp.add(i * r.p_stride + j)), v, *x);
                            }
                        }
                        for (i, x) in a.iter().enumerate() {
                            $store(ap.add(i * d + c), *x);
                        }
                    }
                    c += $v;
                }
                for i in 0..QUERY_ROWS {
                    for x in c..d {
                        let a = &mut acc[i * d + x];
                        for j in 0..n {
                            *a = r.p[i * r.p_stride + j].mul_add(r.tile[j * r.stride + x], *a);
                        }
                    }
                }
            }
        };
    }

    rows!(
        rows_avx2,
        "avx2,fma",
        __m256,
        8,
        2,
        _mm256_loadu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps
    );
    rows!(
        rows_avx512,
        "avx512f,avx2,fma",
        __m512,
        16,
        4,
        _mm512_loadu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps
    );

    blocked!(
        blocked_avx2,
        "avx2,fma",
        __m256,
        8,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps
    );
    blocked!(
        blocked_avx512,
        "avx512f,avx2,fma",
        __m512,
        16,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps
    );
}

/// How a multiply-add (and the hottest loop, four dot products) is computed.
trait Arith: Copy + Send + Sync + 'static {
    /// `a * b + c`.
    fn fma(a: f32, b: f32, c: f32) -> f32;

    /// Four dot products of `q` with `k[0..4]` (see [`dot4`]).
    #[inline(always)]
    fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        dot4_with::<Self>(q, k)
    }

    /// `acc += Σ_j p[j] * tile_row(j)` (see [`accumulate`]).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86 kernels only
    fn accumulate(p: &[f32], tile: &[f32], stride: usize, acc: &mut [f32]) {
        accumulate_with::<Self>(p, tile, stride, acc)
    }
}

/// A multiply then an add (two roundings); vectorises on every target.
#[derive(Clone, Copy, Debug)]
struct Plain;

impl Arith for Plain {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// Fused multiply-adds through `f32::mul_add`, for targets where FMA is part of the
/// base instruction set (aarch64: NEON `fmla`). The compiler vectorises the lane loops
/// of every function here with it, so no intrinsics are needed.
#[cfg(target_arch = "aarch64")]
#[derive(Clone, Copy, Debug)]
struct Fused;

#[cfg(target_arch = "aarch64")]
impl Arith for Fused {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Fused multiply-adds and AVX2 dot products.
///
/// Only the `#[target_feature(enable = "avx2,fma")]` entry points of [`x86`], reached
/// with an AVX2 [`CpuSupport`], may use this type: its [`Arith::dot4`] executes
/// AVX2/FMA instructions.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
struct Avx2Fma;

#[cfg(target_arch = "x86_64")]
impl Arith for Avx2Fma {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }

    #[inline(always)]
    fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        // SAFETY: `Avx2Fma` is only used by the AVX2 entry points of `x86`, which run only
        // with an AVX2 `CpuSupport` token (AVX2 and FMA detected on this CPU).
        unsafe { avx2::dot4(q, k) }
    }

    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86 kernels only
    fn accumulate(p: &[f32], tile: &[f32], stride: usize, acc: &mut [f32]) {
        // SAFETY: as for `dot4`: only reached after AVX2 and FMA were detected.
        unsafe { avx2::accumulate(p, tile, stride, acc) }
    }
}

/// AVX2 + FMA versions of the loops the compiler does not vectorise well by itself.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256, _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_movehl_ps, _mm_shuffle_ps,
        _mm256_castps256_ps128, _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps,
        _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };

    /// Registers of accumulator held across the keys (8 x 8 = 64 columns).
    const REGS: usize = 8;

    /// `acc += Σ_j p[j] * tile[j * stride ..][..acc.len()]`, keeping 64 columns of `acc`
    /// in registers across all keys (no accumulator loads and stores per key).
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn accumulate(p: &[f32], tile: &[f32], stride: usize, acc: &mut [f32]) {
        let (n, d) = (p.len(), acc.len());
        let fits = n == 0
            || (n - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(d))
                .is_some_and(|end| end <= tile.len());
        if !fits {
            return super::accumulate_with::<super::Plain>(p, tile, stride, acc);
        }
        let mut c = 0;
        while c + 8 * REGS <= d {
            // SAFETY: every load reads tile[j * stride + c + 8 r .. + 8] with
            // j < n, c + 8 r + 8 <= d, inside the tile (checked above); the loads and
            // stores of acc cover acc[c .. c + 64] with c + 64 <= d.
            unsafe {
                let mut r = [_mm256_setzero_ps(); REGS];
                for (i, reg) in r.iter_mut().enumerate() {
                    *reg = _mm256_loadu_ps(acc.as_ptr().add(c + 8 * i));
                }
                for (j, &pj) in p.iter().enumerate() {
                    let w = _mm256_set1_ps(pj);
                    let row = tile.as_ptr().add(j * stride + c);
                    for (i, reg) in r.iter_mut().enumerate() {
                        *reg = _mm256_fmadd_ps(w, _mm256_loadu_ps(row.add(8 * i)), *reg);
                    }
                }
                for (i, reg) in r.iter().enumerate() {
                    _mm256_storeu_ps(acc.as_mut_ptr().add(c + 8 * i), *reg);
                }
            }
            c += 8 * REGS;
        }
        while c + 8 <= d {
            // SAFETY: as above, for the 8 columns c .. c + 8 <= d.
            unsafe {
                let mut r = _mm256_loadu_ps(acc.as_ptr().add(c));
                for (j, &pj) in p.iter().enumerate() {
                    let v = _mm256_loadu_ps(tile.as_ptr().add(j * stride + c));
                    r = _mm256_fmadd_ps(_mm256_set1_ps(pj), v, r);
                }
                _mm256_storeu_ps(acc.as_mut_ptr().add(c), r);
            }
            c += 8;
        }
        for (x, a) in acc.iter_mut().enumerate().skip(c) {
            for (j, &pj) in p.iter().enumerate() {
                *a = pj.mul_add(tile[j * stride + x], *a);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    }

    /// Four dot products of `q` with `k[0..4]`, eight lanes per multiply-add.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        let d = q.len();
        if k.iter().any(|r| r.len() < d) {
            return k.map(|r| super::dot_with::<super::Plain>(q, r));
        }
        let full = d - d % 8;
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= d, and q and every k row hold at least d
            // elements (checked above), so each unaligned 8-lane load is in bounds.
            unsafe {
                let x = _mm256_loadu_ps(q.as_ptr().add(i));
                a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[0].as_ptr().add(i)), a0);
                a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[1].as_ptr().add(i)), a1);
                a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[2].as_ptr().add(i)), a2);
                a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[3].as_ptr().add(i)), a3);
            }
            i += 8;
        }
        let mut s = [hsum(a0), hsum(a1), hsum(a2), hsum(a3)];
        for i in full..d {
            for (acc, row) in s.iter_mut().zip(k) {
                *acc = q[i].mul_add(row[i], *acc);
            }
        }
        s
    }
}

/// Independent accumulators per reduction (one AVX register of f32).
const LANES: usize = 8;

#[inline(always)]
fn hsum(a: &[f32; LANES]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// `acc[l] += x[l] * y[l]` for the [`LANES`] lanes.
#[inline(always)]
fn lanes_fma<A: Arith>(acc: &mut [f32; LANES], x: &[f32], y: &[f32]) {
    if let (Some(x), Some(y)) = (x.first_chunk::<LANES>(), y.first_chunk::<LANES>()) {
        for l in 0..LANES {
            acc[l] = A::fma(x[l], y[l], acc[l]);
        }
    }
}

/// `Σ a[i] * b[i]` over the shorter length.
#[inline(always)]
fn dot_with<A: Arith>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        lanes_fma::<A>(&mut acc, x, y);
    }
    let mut s = hsum(&acc);
    for (x, y) in ra.iter().zip(rb) {
        s = A::fma(*x, *y, s);
    }
    s
}

/// Four dot products of `q` with `k[0..4]` (each at least `q.len()` long), sharing the
/// loads of `q` and running four independent accumulator chains.
#[inline(always)]
fn dot4_with<A: Arith>(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
    let d = q.len();
    if k.iter().any(|r| r.len() < d) {
        return k.map(|r| dot_with::<A>(q, r));
    }
    let (k0, k1, k2, k3) = (&k[0][..d], &k[1][..d], &k[2][..d], &k[3][..d]);
    let mut a0 = [0f32; LANES];
    let mut a1 = [0f32; LANES];
    let mut a2 = [0f32; LANES];
    let mut a3 = [0f32; LANES];
    let chunks = q
        .chunks_exact(LANES)
        .zip(k0.chunks_exact(LANES))
        .zip(k1.chunks_exact(LANES))
        .zip(k2.chunks_exact(LANES))
        .zip(k3.chunks_exact(LANES));
    for ((((x, y0), y1), y2), y3) in chunks {
        // One loop per accumulator, so that the lanes (not the four keys) become the
        // vector: each loop is one vector multiply-add.
        lanes_fma::<A>(&mut a0, x, y0);
        lanes_fma::<A>(&mut a1, x, y1);
        lanes_fma::<A>(&mut a2, x, y2);
        lanes_fma::<A>(&mut a3, x, y3);
    }
    let mut s = [hsum(&a0), hsum(&a1), hsum(&a2), hsum(&a3)];
    let tail = d - d % LANES;
    for i in tail..d {
        let x = q[i];
        s[0] = A::fma(x, k0[i], s[0]);
        s[1] = A::fma(x, k1[i], s[1]);
        s[2] = A::fma(x, k2[i], s[2]);
        s[3] = A::fma(x, k3[i], s[3]);
    }
    s
}

/// `out[j] = q · tile_row(j)` for `j < out.len()`, where row `j` of the tile starts at
/// `j * stride` and is `q.len()` long.
#[inline(always)]
fn scores_with<A: Arith>(q: &[f32], tile: &[f32], stride: usize, out: &mut [f32]) {
    let d = q.len();
    let row = |j: usize| tile.get(j * stride..j * stride + d).unwrap_or(&[]);
    let mut j = 0;
    let n = out.len();
    while j + 4 <= n {
        let s = A::dot4(q, [row(j), row(j + 1), row(j + 2), row(j + 3)]);
        out[j..j + 4].copy_from_slice(&s);
        j += 4;
    }
    while j < n {
        out[j] = dot_with::<A>(q, row(j));
        j += 1;
    }
}

/// `acc += Σ_j p[j] * tile_row(j)` for `j < p.len()`, rows `acc.len()` long at `j * stride`.
#[inline(always)]
fn accumulate_with<A: Arith>(p: &[f32], tile: &[f32], stride: usize, acc: &mut [f32]) {
    let d = acc.len();
    let row = |j: usize| tile.get(j * stride..j * stride + d).unwrap_or(&[]);
    let n = p.len();
    let mut j = 0;
    while j + 4 <= n {
        let (p0, p1, p2, p3) = (p[j], p[j + 1], p[j + 2], p[j + 3]);
        let (v0, v1, v2, v3) = (row(j), row(j + 1), row(j + 2), row(j + 3));
        for ((((a, x0), x1), x2), x3) in acc.iter_mut().zip(v0).zip(v1).zip(v2).zip(v3) {
            *a = A::fma(
                p3,
                *x3,
                A::fma(p2, *x2, A::fma(p1, *x1, A::fma(p0, *x0, *a))),
            );
        }
        j += 4;
    }
    while j < n {
        let pj = p[j];
        for (a, x) in acc.iter_mut().zip(row(j)) {
            *a = A::fma(pj, *x, *a);
        }
        j += 1;
    }
}

/// `x *= s` elementwise.
#[inline]
pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// The largest element (`-inf` for an empty slice; NaNs are skipped).
#[inline]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let c = x.chunks_exact(LANES);
    let r = c.remainder();
    for v in c {
        for l in 0..LANES {
            acc[l] = if v[l] > acc[l] { v[l] } else { acc[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for v in acc.iter().chain(r) {
        m = if *v > m { *v } else { m };
    }
    m
}

/// `x[j] = exp(x[j] - m)` and returns `Σ x[j]`, for `m >= max(x)` finite.
#[inline(always)]
fn exp_shift_sum_with<A: Arith>(x: &mut [f32], m: f32) -> f32 {
    for v in x.iter_mut() {
        *v = exp_nonpositive_with::<A>(*v - m);
    }
    let mut acc = [0f32; LANES];
    let c = x.chunks_exact(LANES);
    let r = c.remainder();
    for v in c {
        for l in 0..LANES {
            acc[l] += v[l];
        }
    }
    let mut s = hsum(&acc);
    for v in r {
        s += *v;
    }
    s
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `1.5 * 2^23`: adding and subtracting it rounds to the nearest integer.
const ROUND: f32 = 12_582_912.0;
/// ln 2 split in a part exact in few bits and a correction (Cody-Waite).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this `exp` is flushed to 0 (`e^-87` is near the smallest normal f32).
const EXP_MIN: f32 = -87.0;

/// `e^x` for `x <= 0` (larger `x` is clamped to 0), with a relative error of a few ulp;
/// `-inf` and anything below -87 give exactly 0.
///
/// Branch-free (selects only), so a loop over it vectorises: `x = n ln2 + r` with
/// `|r| <= ln2 / 2`, `e^r` by a degree-7 polynomial (the classic Cephes `expf`
/// coefficients), and `2^n` assembled in the exponent bits.
#[inline(always)]
fn exp_nonpositive_with<A: Arith>(x: f32) -> f32 {
    let xc = if x < EXP_MIN { EXP_MIN } else { x };
    let xc = if xc > 0.0 { 0.0 } else { xc };
    // Round x * log2(e) to the nearest integer n, keeping n's bits in the mantissa.
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = A::fma(n, -LN2_HI, xc);
    let r = A::fma(n, -LN2_LO, r);
    let mut p = 1.987_569_2e-4f32;
    p = A::fma(p, r, 1.398_199_9e-3);
    p = A::fma(p, r, 8.333_452e-3);
    p = A::fma(p, r, 4.166_579_6e-2);
    p = A::fma(p, r, 1.666_666_5e-1);
    p = A::fma(p, r, 0.5);
    let y = A::fma(p, r * r, r) + 1.0;
    // shifted's low mantissa bits hold n (two's complement) above 0x4B40_0000.
    let bits = shifted
        .to_bits()
        .wrapping_sub(0x4B40_0000)
        .wrapping_add(127)
        << 23;
    let v = y * f32::from_bits(bits);
    if x < EXP_MIN { 0.0 } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exp_is_accurate() {
        for &isa in Isa::available() {
            let mut worst = 0f64;
            let mut x = -87.0f32;
            while x <= 0.0 {
                let want = (x as f64).exp();
                let a = exp_nonpositive(isa, x) as f64;
                worst = worst.max(((a - want) / want).abs());
                x += 0.000_7;
            }
            assert!(worst < 4e-7, "{}: relative error {worst}", isa.name());
            assert_eq!(exp_nonpositive(isa, 0.0), 1.0);
            assert_eq!(exp_nonpositive(isa, f32::NEG_INFINITY), 0.0);
            assert_eq!(exp_nonpositive(isa, -100.0), 0.0);
        }
    }

    #[test]
    fn dots_and_sums_match_naive() {
        for &isa in Isa::available() {
            for d in [0usize, 1, 7, 8, 9, 33, 64, 72, 130, 200] {
                let q: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
                let rows: Vec<Vec<f32>> = (0..5)
                    .map(|r| {
                        (0..d)
                            .map(|i| ((i + 3 * (r % 4)) as f32 * 0.11).cos())
                            .collect()
                    })
                    .collect();
                let tile: Vec<f32> = rows.iter().flatten().copied().collect();
                let naive = |r: &[f32]| {
                    q.iter()
                        .zip(r)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                };
                let mut s = [0f32; 5];
                scores(isa, &q, &tile, d, &mut s);
                for r in 0..5 {
                    assert!(
                        (s[r] as f64 - naive(&rows[r])).abs() < 1e-4,
                        "{}",
                        isa.name()
                    );
                }
                let mut acc = vec![0.5f32; d];
                let p = [0.1f32, -0.2, 0.3, 0.4, 0.5];
                accumulate(isa, &p, &tile, d, &mut acc);
                for i in 0..d {
                    let want = 0.5 + (0..5).map(|j| p[j] * rows[j][i]).sum::<f32>();
                    assert!((acc[i] - want).abs() < 1e-5, "{}", isa.name());
                }
            }
            let mut y = [0.0f32, -1.0, -2.0];
            let s = exp_shift_sum(isa, &mut y, 0.0);
            assert!((s - (1.0 + (-1f32).exp() + (-2f32).exp())).abs() < 1e-6);
        }
        let x = [1.0f32, -3.0, 7.5, f32::NAN, 2.0, 0.0, 1.0, 1.0, 1.0, 7.6];
        assert_eq!(max(&x), 7.6);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn transposed_scores_match_the_scalar_twin_and_naive() {
        for (d, n, rows) in [
            (64usize, 128usize, 48usize),
            (1, 1, 1),
            (7, 33, 5),
            (64, 100, 3),
            (130, 31, 9),
        ] {
            let stride = d + 3;
            let q: Vec<f32> = (0..rows * d).map(|i| (i as f32 * 0.37).sin()).collect();
            let tile: Vec<f32> = (0..n * stride).map(|i| (i as f32 * 0.11).cos()).collect();
            let kt_stride = n.next_multiple_of(KEY_COLUMNS);
            let mut kt = vec![f32::NAN; d * kt_stride];
            assert!(transpose_keys(&tile, stride, n, d, &mut kt, kt_stride));
            let s_stride = n + 5;
            let mut want = vec![0f32; rows * s_stride];
            assert!(scores_transposed(
                Isa::Scalar,
                &q,
                d,
                rows,
                &kt,
                kt_stride,
                n,
                &mut want,
                s_stride
            ));
            for &isa in Isa::available() {
                let mut got = vec![-7f32; rows * s_stride];
                assert!(scores_transposed(
                    isa, &q, d, rows, &kt, kt_stride, n, &mut got, s_stride
                ));
                for r in 0..rows {
                    for j in 0..n {
                        let naive: f64 = (0..d)
                            .map(|c| q[r * d + c] as f64 * tile[j * stride + c] as f64)
                            .sum();
                        let (g, w) = (got[r * s_stride + j], want[r * s_stride + j]);
                        assert!((g as f64 - naive).abs() < 1e-4, "{} ({r}, {j})", isa.name());
                        assert!((g - w).abs() <= 1e-5 * (1.0 + d as f32), "{}", isa.name());
                    }
                    // Columns past the keys are left alone.
                    assert!(
                        got[r * s_stride + n..(r + 1) * s_stride]
                            .iter()
                            .all(|&x| x == -7.0)
                    );
                }
            }
        }
        // Operands too short: nothing is written.
        let mut s = vec![9f32; 4];
        assert!(!accumulate_rows(
            Isa::Scalar,
            &[1.0; 7],
            2,
            2,
            &[1.0; 8],
            4,
            &mut s,
            1
        ));
        assert!(s.iter().all(|&x| x == 9.0));
        let mut kt = vec![0f32; 64];
        assert!(!transpose_keys(&[1.0; 8], 4, 3, 4, &mut kt, 32));
        assert!(!transpose_keys(&[1.0; 16], 4, 3, 4, &mut kt, 16));
        let mut s = vec![9f32; 4];
        assert!(!scores_transposed(
            Isa::Scalar,
            &[1.0; 4],
            4,
            2,
            &kt,
            32,
            2,
            &mut s,
            2
        ));
        assert!(s.iter().all(|&x| x == 9.0));
    }

    #[test]
    fn four_row_accumulation_gives_the_one_row_bits() {
        for (d, n) in [
            (64usize, 128usize),
            (1, 1),
            (7, 5),
            (72, 33),
            (130, 17),
            (16, 0),
        ] {
            let stride = d + 2;
            let p_stride = n + 3;
            let p: Vec<f32> = (0..QUERY_ROWS * p_stride)
                .map(|i| (i as f32 * 0.29).sin())
                .collect();
            let tile: Vec<f32> = (0..n * stride).map(|i| (i as f32 * 0.13).cos()).collect();
            let start: Vec<f32> = (0..QUERY_ROWS * d).map(|i| i as f32 * 0.01).collect();
            for &isa in Isa::available() {
                let mut want = start.clone();
                for (r, a) in want.chunks_exact_mut(d).enumerate() {
                    accumulate(isa, &p[r * p_stride..][..n], &tile, stride, a);
                }
                let mut got = start.clone();
                assert!(accumulate_rows(
                    isa, &p, p_stride, n, &tile, stride, &mut got, d
                ));
                assert_eq!(got, want, "{} d {d} n {n}", isa.name());
            }
        }
    }

    /// A query, a tile of `n` rows of stride `d + pad`, and `n` weights.
    fn case() -> impl Strategy<Value = (Vec<f32>, Vec<f32>, usize, Vec<f32>)> {
        (0usize..100, 0usize..12, 0usize..3).prop_flat_map(|(d, n, pad)| {
            let stride = d + pad;
            (
                prop::collection::vec(-2f32..2.0, d),
                prop::collection::vec(-2f32..2.0, n * stride),
                Just(stride),
                prop::collection::vec(-1f32..1.0, n),
            )
        })
    }

    proptest! {
        #[test]
        fn fast_loops_match_the_scalar_twin((q, tile, stride, p) in case()) {
            let n = p.len();
            let d = q.len();
            let bound = |j: usize| 1e-5 * (1.0 + (0..d).map(|i| (q[i] * tile[j * stride + i]).abs()).sum::<f32>());
            let mut want = vec![0f32; n];
            scores(Isa::Scalar, &q, &tile, stride, &mut want);
            let mut want_acc = vec![0.25f32; d];
            accumulate(Isa::Scalar, &p, &tile, stride, &mut want_acc);
            let mut want_exp: Vec<f32> = want.iter().map(|v| v.min(0.0) * 10.0).collect();
            let want_sum = exp_shift_sum(Isa::Scalar, &mut want_exp, 0.0);
            for &isa in Isa::available() {
                let mut got = vec![0f32; n];
                scores(isa, &q, &tile, stride, &mut got);
                for j in 0..n {
                    prop_assert!((got[j] - want[j]).abs() <= bound(j), "{} scores", isa.name());
                }
                let mut acc = vec![0.25f32; d];
                accumulate(isa, &p, &tile, stride, &mut acc);
                for i in 0..d {
                    prop_assert!((acc[i] - want_acc[i]).abs() <= 1e-5 * (1.0 + 2.0 * n as f32), "{} accumulate", isa.name());
                }
                let mut e: Vec<f32> = want.iter().map(|v| v.min(0.0) * 10.0).collect();
                let sum = exp_shift_sum(isa, &mut e, 0.0);
                prop_assert!((sum - want_sum).abs() <= 1e-5 * (1.0 + want_sum), "{} exp sum", isa.name());
                for (a, b) in e.iter().zip(&want_exp) {
                    prop_assert!((a - b).abs() <= 1e-6, "{} exp", isa.name());
                }
            }
        }
    }
}
