//! AVX2 + FMA (+ F16C) versions of the GEMM micro-kernel and the dot-product rows.

use std::any::TypeId;
use std::arch::x86_64::*;

use half::{bf16, f16};

use super::kernels::{TilePost, WeightElem, by_four_rows, dot_scalar};
use crate::CpuSupport;

/// Rows of the tile.
const MR: usize = 6;
/// Columns of the tile.
const NR: usize = 16;

/// AVX2+FMA 6x16 micro-kernel: 12 accumulators, two B vectors, one A broadcast.
///
/// A is a packed panel (`lda == 0`: step `k`, row `r` at `a[k*MR + r]`) or `MR` rows
/// of a row-major matrix read in place (row `r`, step `k` at `a[r*lda + k]`).
///
/// B's step `k` is the `NR` values at `b + k*ldb` (`ldb == NR`: a packed panel;
/// more: `NR` columns of a row-major matrix read in place).
///
/// # Safety
/// Needs AVX2 and FMA. `a` must hold `kc*MR` floats (packed) or `(MR-1)*lda + kc`
/// (rows), `b` `(kc-1)*ldb + NR`, and `c` a full `MR x NR` tile with row stride `ldc`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn kernel_6x16(
    kc: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    post: Option<&TilePost>,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    // The steps, with `$at(k, r)` the address of A's value for row r at step k.
    macro_rules! steps {
        ($at:expr) => {
            for k in 0..kc {
                // SAFETY: k < kc, so both B reads (at k*ldb) stay inside b.
                let (b0, b1) = unsafe {
                    let bk = b.add(k * ldb);
                    (_mm256_loadu_ps(bk), _mm256_loadu_ps(bk.add(8)))
                };
                for (r, row) in acc.iter_mut().enumerate() {
                    // SAFETY: r < MR and k < kc: inside A (see the function's contract).
                    let av = unsafe { _mm256_broadcast_ss(&*$at(k, r)) };
                    row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(av, b1, row[1]);
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
        // SAFETY: the tile has MR rows of NR floats at stride ldc.
        unsafe {
            let cr = c.add(r * ldc);
            let (mut v0, mut v1) = (row[0], row[1]);
            if accumulate {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(cr));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(cr.add(8)));
            }
            if let Some(post) = post {
                // As the AVX-512 kernel: exactly `output_clamp` after the additions.
                let row_add = _mm256_set1_ps(post.row_add[r]);
                let col = post.col_add.as_ptr();
                let (lo, hi) = (_mm256_set1_ps(post.lo), _mm256_set1_ps(post.hi));
                v0 = _mm256_add_ps(_mm256_add_ps(v0, row_add), _mm256_loadu_ps(col));
                v1 = _mm256_add_ps(_mm256_add_ps(v1, row_add), _mm256_loadu_ps(col.add(8)));
                v0 = _mm256_min_ps(hi, _mm256_max_ps(lo, v0));
                v1 = _mm256_min_ps(hi, _mm256_max_ps(lo, v1));
            }
            _mm256_storeu_ps(cr, v0);
            _mm256_storeu_ps(cr.add(8), v1);
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// One row of A against one packed 16-column panel: `out[c] = Σ_k x[k] · b[k*16 + c]`,
/// four steps per iteration into separate accumulators (8 registers).
///
/// # Safety
/// Needs AVX2 and FMA. `x` must hold `k` floats, `b` `k*16` and `out` 16.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn panel_dot_16(k: usize, x: *const f32, b: *const f32, out: *mut f32) {
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut kk = 0;
    while kk + 4 <= k {
        for (u, pair) in acc.iter_mut().enumerate() {
            // SAFETY: kk + u < k: x[kk+u] and the 16 weights of that step are inside.
            unsafe {
                let xv = _mm256_set1_ps(*x.add(kk + u));
                let bk = b.add((kk + u) * NR);
                pair[0] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(bk), pair[0]);
                pair[1] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(bk.add(8)), pair[1]);
            }
        }
        kk += 4;
    }
    while kk < k {
        // SAFETY: kk < k, as above.
        unsafe {
            let xv = _mm256_set1_ps(*x.add(kk));
            let bk = b.add(kk * NR);
            acc[0][0] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(bk), acc[0][0]);
            acc[0][1] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(bk.add(8)), acc[0][1]);
        }
        kk += 1;
    }
    let sum = |h: usize| {
        _mm256_add_ps(
            _mm256_add_ps(acc[0][h], acc[1][h]),
            _mm256_add_ps(acc[2][h], acc[3][h]),
        )
    };
    // SAFETY: out holds 16 floats.
    unsafe {
        _mm256_storeu_ps(out, sum(0));
        _mm256_storeu_ps(out.add(8), sum(1));
    }
}

/// Loads 8 weights as f32.
///
/// # Safety
/// Needs AVX2, FMA and F16C; `p` must point at 8 readable elements of `W`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<W: WeightElem>(p: *const W) -> __m256 {
    // SAFETY: p points at 8 elements (caller); the type checks pick the layout.
    unsafe {
        if TypeId::of::<W>() == TypeId::of::<f32>() {
            _mm256_loadu_ps(p as *const f32)
        } else if TypeId::of::<W>() == TypeId::of::<f16>() {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        } else if TypeId::of::<W>() == TypeId::of::<bf16>() {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        } else {
            let mut v = [0f32; 8];
            for (l, o) in v.iter_mut().enumerate() {
                *o = (*p.add(l)).to_f32();
            }
            _mm256_loadu_ps(v.as_ptr())
        }
    }
}

/// Dot products of `x` with 4 rows at once (shared loads of `x`, 8 accumulators).
///
/// # Safety
/// Needs AVX2, FMA and F16C; each `w[r]` must point at `x.len()` elements.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot4<W: WeightElem>(x: &[f32], w: [*const W; 4]) -> [f32; 4] {
    let k = x.len();
    let xp = x.as_ptr();
    let mut acc0 = [_mm256_setzero_ps(); 4];
    let mut acc1 = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 16 <= k {
        // SAFETY: i + 16 <= k, inside x and every row.
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(i));
            let x1 = _mm256_loadu_ps(xp.add(i + 8));
            for r in 0..4 {
                acc0[r] = _mm256_fmadd_ps(load8(w[r].add(i)), x0, acc0[r]);
                acc1[r] = _mm256_fmadd_ps(load8(w[r].add(i + 8)), x1, acc1[r]);
            }
        }
        i += 16;
    }
    if i + 8 <= k {
        // SAFETY: i + 8 <= k.
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(i));
            for r in 0..4 {
                acc0[r] = _mm256_fmadd_ps(load8(w[r].add(i)), x0, acc0[r]);
            }
        }
        i += 8;
    }
    let mut out = [0f32; 4];
    for r in 0..4 {
        let mut s = hsum(_mm256_add_ps(acc0[r], acc1[r]));
        for (j, &xv) in x.iter().enumerate().skip(i) {
            // SAFETY: j < k = x.len(), inside row r.
            s += xv * unsafe { *w[r].add(j) }.to_f32();
        }
        out[r] = s;
    }
    out
}

/// One row.
///
/// # Safety
/// Needs AVX2, FMA and F16C; `w` must point at `x.len()` elements.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot1<W: WeightElem>(x: &[f32], w: *const W) -> f32 {
    let k = x.len();
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= k {
        for (l, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32 <= k.
            unsafe {
                *a = _mm256_fmadd_ps(
                    load8(w.add(i + 8 * l)),
                    _mm256_loadu_ps(xp.add(i + 8 * l)),
                    *a,
                );
            }
        }
        i += 32;
    }
    while i + 8 <= k {
        // SAFETY: i + 8 <= k.
        unsafe {
            acc[0] = _mm256_fmadd_ps(load8(w.add(i)), _mm256_loadu_ps(xp.add(i)), acc[0]);
        }
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(s);
    // SAFETY: the tail indices are below k.
    let tail = unsafe { std::slice::from_raw_parts(w.add(i), k - i) };
    s += dot_scalar(&x[i..], tail);
    s
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
        // SAFETY: the CpuSupport proof says AVX2/FMA/F16C were detected; each row
        // slice holds x.len() elements.
        |r| unsafe { dot4(x, r.map(<[W]>::as_ptr)) },
        // SAFETY: as above, for one row.
        |r| unsafe { dot1(x, r.as_ptr()) },
    )
}

/// [`super::finish_tiles`] compiled with AVX2 and FMA.
pub(super) fn finish_tiles<O: super::OutElem>(
    _: CpuSupport,
    g: &super::Gemm<'_>,
    t: &super::TileRows<'_>,
    first: usize,
    chunk: &mut [O],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run<O: super::OutElem>(
        g: &super::Gemm<'_>,
        t: &super::TileRows<'_>,
        first: usize,
        chunk: &mut [O],
    ) {
        super::finish_tiles_body(g, t, first, chunk)
    }
    // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
    unsafe { run(g, t, first, chunk) }
}

/// [`super::pack_a_panel_elems`] compiled with AVX2 and FMA.
pub(super) fn pack_a_panel(
    _: CpuSupport,
    mr: usize,
    a: &super::MatRef<'_>,
    row0: usize,
    rows: usize,
    panel: &mut [f32],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(mr: usize, a: &super::MatRef<'_>, row0: usize, rows: usize, panel: &mut [f32]) {
        super::pack_a_panel_elems(mr, a, row0, rows, panel)
    }
    // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
    unsafe { run(mr, a, row0, rows, panel) }
}

/// [`super::pack_b_elems`] compiled with AVX2 and FMA.
pub(super) fn pack_b(
    _: CpuSupport,
    nr: usize,
    b: &super::MatRef<'_>,
    ks: (usize, usize),
    cs: (usize, usize),
    dst: &mut [f32],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(
        nr: usize,
        b: &super::MatRef<'_>,
        ks: (usize, usize),
        cs: (usize, usize),
        dst: &mut [f32],
    ) {
        super::pack_b_elems(nr, b, ks, cs, dst)
    }
    // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
    unsafe { run(nr, b, ks, cs, dst) }
}

/// Packs eight rows of A (`k` elements each) into one 8-row panel: step `kk`, row `r`
/// at `panel[kk * 8 + r]`, transposing 8x8 blocks in registers and the last `k % 8`
/// steps element by element.
pub(super) fn pack_a_8_rows(_: CpuSupport, rows: [&[f32]; 8], panel: &mut [f32]) {
    let k = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    let panel = &mut panel[..8 * k];
    let blocks = k / 8;
    // SAFETY: the `CpuSupport` token proves AVX2 was detected on this CPU; every load
    // reads `rows[r][8 * b..8 * b + 8]` with `b < k / 8` (each row holds `k`), every
    // store writes `panel[64 * b + 8 * j..][..8]` inside `panel`'s `8 * k` elements.
    unsafe { transpose_blocks(&rows, blocks, panel.as_mut_ptr()) };
    for kk in blocks * 8..k {
        for (r, row) in rows.iter().enumerate() {
            panel[kk * 8 + r] = row[kk];
        }
    }
}

/// The 8x8 blocks of [`pack_a_8_rows`].
#[target_feature(enable = "avx2")]
unsafe fn transpose_blocks(rows: &[&[f32]; 8], blocks: usize, out: *mut f32) {
    for b in 0..blocks {
        // SAFETY: see `pack_a_8_rows`.
        unsafe {
            let v: [__m256; 8] =
                std::array::from_fn(|r| _mm256_loadu_ps(rows[r].as_ptr().add(8 * b)));
            // Interleave pairs of rows, then pairs of pairs, then the 128-bit halves.
            let t0 = _mm256_unpacklo_ps(v[0], v[1]);
            let t1 = _mm256_unpackhi_ps(v[0], v[1]);
            let t2 = _mm256_unpacklo_ps(v[2], v[3]);
            let t3 = _mm256_unpackhi_ps(v[2], v[3]);
            let t4 = _mm256_unpacklo_ps(v[4], v[5]);
            let t5 = _mm256_unpackhi_ps(v[4], v[5]);
            let t6 = _mm256_unpacklo_ps(v[6], v[7]);
            let t7 = _mm256_unpackhi_ps(v[6], v[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let cols = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (j, c) in cols.iter().enumerate() {
                _mm256_storeu_ps(out.add(64 * b + 8 * j), *c);
            }
        }
    }
}

/// [`super::axpy_rows_body`] compiled with AVX2 and FMA.
pub(super) fn axpy_rows(
    _: CpuSupport,
    xs: &[f32],
    b: &[f32],
    start: usize,
    ld: usize,
    acc: &mut [f32],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(xs: &[f32], b: &[f32], start: usize, ld: usize, acc: &mut [f32]) {
        super::axpy_rows_body::<true>(xs, b, start, ld, acc)
    }
    // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
    unsafe { run(xs, b, start, ld, acc) }
}
