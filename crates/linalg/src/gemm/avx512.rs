//! AVX-512 F versions of the GEMM micro-kernel and the dot-product rows.
//!
//! The micro-kernel computes an `AVX512_MR x 32` tile: two 16-lane accumulators per
//! row, the A values broadcast one at a time. The dot-product rows read 16 weights per
//! load and run 4 rows at once with two accumulators each. The panel product streams one
//! packed 32-column panel against one row (the matrix-vector product over a packed B).

use std::any::TypeId;
use std::arch::x86_64::*;

use half::{bf16, f16};

use super::kernels::{AVX512_MR, TilePost, WeightElem, by_four_rows, dot_scalar};
use crate::CpuSupport;

/// Rows of the tile.
const MR: usize = AVX512_MR;
/// Columns of the tile: two registers.
const NR: usize = 32;

/// AVX-512 `MR x 32` micro-kernel: `2 * MR` accumulators, two B vectors per step.
///
/// A is a packed panel (`lda == 0`: step `k`, row `r` at `a[k*MR + r]`) or `MR` rows
/// of a row-major matrix read in place (row `r`, step `k` at `a[r*lda + k]`).
///
/// B's step `k` is the `NR` values at `b + k*ldb` (`ldb == NR`: a packed panel;
/// more: `NR` columns of a row-major matrix read in place).
///
/// # Safety
/// Needs AVX-512 F. `a` must hold `kc*MR` floats (packed) or `(MR-1)*lda + kc` (rows),
/// `b` `(kc-1)*ldb + NR`, and `c` a full `MR x NR` tile with row stride `ldc`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn kernel_mrx32(
    kc: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    post: Option<&TilePost>,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    // The steps, with `$at(k, r)` the address of A's value for row r at step k.
    macro_rules! steps {
        ($at:expr) => {
            for k in 0..kc {
                // SAFETY: k < kc, so the 32 B values of step k (at k*ldb) are inside b.
                let (b0, b1) = unsafe {
                    let bk = b.add(k * ldb);
                    (_mm512_loadu_ps(bk), _mm512_loadu_ps(bk.add(16)))
                };
                for (r, row) in acc.iter_mut().enumerate() {
                    // SAFETY: r < MR and k < kc: inside A (see the function's contract).
                    let av = _mm512_set1_ps(unsafe { *$at(k, r) });
                    row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                    row[1] = _mm512_fmadd_ps(av, b1, row[1]);
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
                v0 = _mm512_add_ps(v0, _mm512_loadu_ps(cr));
                v1 = _mm512_add_ps(v1, _mm512_loadu_ps(cr.add(16)));
            }
            if let Some(post) = post {
                // (v + row value) + column value, then max(lo, ·) and min(hi, ·): the
                // second operand is returned for NaN and for equal values, so this is
                // exactly `output_clamp` (NaN and signed zeros kept).
                let row_add = _mm512_set1_ps(post.row_add[r]);
                let col = post.col_add.as_ptr();
                let (lo, hi) = (_mm512_set1_ps(post.lo), _mm512_set1_ps(post.hi));
                v0 = _mm512_add_ps(_mm512_add_ps(v0, row_add), _mm512_loadu_ps(col));
                v1 = _mm512_add_ps(_mm512_add_ps(v1, row_add), _mm512_loadu_ps(col.add(16)));
                v0 = _mm512_min_ps(hi, _mm512_max_ps(lo, v0));
                v1 = _mm512_min_ps(hi, _mm512_max_ps(lo, v1));
            }
            _mm512_storeu_ps(cr, v0);
            _mm512_storeu_ps(cr.add(16), v1);
        }
    }
}

/// One row of A against one packed 32-column panel: `out[c] = Σ_k x[k] · b[k*32 + c]`.
/// Four steps per iteration into separate accumulators (8 registers), so the FMA
/// latency never stalls the weight stream.
///
/// # Safety
/// Needs AVX-512 F. `x` must hold `k` floats, `b` `k*32` and `out` 32.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn panel_dot_32(k: usize, x: *const f32, b: *const f32, out: *mut f32) {
    let mut acc = [[_mm512_setzero_ps(); 2]; 4];
    let mut kk = 0;
    while kk + 4 <= k {
        for (u, pair) in acc.iter_mut().enumerate() {
            // SAFETY: kk + u < k: x[kk+u] and the 32 weights of that step are inside.
            unsafe {
                let xv = _mm512_set1_ps(*x.add(kk + u));
                let bk = b.add((kk + u) * NR);
                pair[0] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(bk), pair[0]);
                pair[1] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(bk.add(16)), pair[1]);
            }
        }
        kk += 4;
    }
    while kk < k {
        // SAFETY: kk < k, as above.
        unsafe {
            let xv = _mm512_set1_ps(*x.add(kk));
            let bk = b.add(kk * NR);
            acc[0][0] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(bk), acc[0][0]);
            acc[0][1] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(bk.add(16)), acc[0][1]);
        }
        kk += 1;
    }
    let sum = |h: usize| {
        _mm512_add_ps(
            _mm512_add_ps(acc[0][h], acc[1][h]),
            _mm512_add_ps(acc[2][h], acc[3][h]),
        )
    };
    // SAFETY: out holds 32 floats.
    unsafe {
        _mm512_storeu_ps(out, sum(0));
        _mm512_storeu_ps(out.add(16), sum(1));
    }
}

/// Loads 16 weights as f32.
///
/// # Safety
/// Needs AVX-512 F; `p` must point at 16 readable elements of `W`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load16<W: WeightElem>(p: *const W) -> __m512 {
    // SAFETY: p points at 16 elements (caller); the type checks pick the layout.
    unsafe {
        if TypeId::of::<W>() == TypeId::of::<f32>() {
            _mm512_loadu_ps(p as *const f32)
        } else if TypeId::of::<W>() == TypeId::of::<f16>() {
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
        } else if TypeId::of::<W>() == TypeId::of::<bf16>() {
            let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
        } else {
            let mut v = [0f32; 16];
            for (l, o) in v.iter_mut().enumerate() {
                *o = (*p.add(l)).to_f32();
            }
            _mm512_loadu_ps(v.as_ptr())
        }
    }
}

/// Dot products of `x` with 4 rows at once (shared loads of `x`, 8 accumulators).
///
/// # Safety
/// Needs AVX-512 F; each `w[r]` must point at `x.len()` elements.
#[target_feature(enable = "avx512f")]
unsafe fn dot4<W: WeightElem>(x: &[f32], w: [*const W; 4]) -> [f32; 4] {
    let k = x.len();
    let xp = x.as_ptr();
    let mut acc0 = [_mm512_setzero_ps(); 4];
    let mut acc1 = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= k {
        // SAFETY: i + 32 <= k, inside x and every row.
        unsafe {
            let x0 = _mm512_loadu_ps(xp.add(i));
            let x1 = _mm512_loadu_ps(xp.add(i + 16));
            for r in 0..4 {
                acc0[r] = _mm512_fmadd_ps(load16(w[r].add(i)), x0, acc0[r]);
                acc1[r] = _mm512_fmadd_ps(load16(w[r].add(i + 16)), x1, acc1[r]);
            }
        }
        i += 32;
    }
    if i + 16 <= k {
        // SAFETY: i + 16 <= k.
        unsafe {
            let x0 = _mm512_loadu_ps(xp.add(i));
            for r in 0..4 {
                acc0[r] = _mm512_fmadd_ps(load16(w[r].add(i)), x0, acc0[r]);
            }
        }
        i += 16;
    }
    let mut out = [0f32; 4];
    for r in 0..4 {
        let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
        // SAFETY: the tail indices i..k are below k, inside row r.
        let tail = unsafe { std::slice::from_raw_parts(w[r].add(i), k - i) };
        s += dot_scalar(&x[i..], tail);
        out[r] = s;
    }
    out
}

/// One row.
///
/// # Safety
/// Needs AVX-512 F; `w` must point at `x.len()` elements.
#[target_feature(enable = "avx512f")]
unsafe fn dot1<W: WeightElem>(x: &[f32], w: *const W) -> f32 {
    let k = x.len();
    let xp = x.as_ptr();
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= k {
        for (l, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 64 <= k.
            unsafe {
                *a = _mm512_fmadd_ps(
                    load16(w.add(i + 16 * l)),
                    _mm512_loadu_ps(xp.add(i + 16 * l)),
                    *a,
                );
            }
        }
        i += 64;
    }
    while i + 16 <= k {
        // SAFETY: i + 16 <= k.
        unsafe {
            acc[0] = _mm512_fmadd_ps(load16(w.add(i)), _mm512_loadu_ps(xp.add(i)), acc[0]);
        }
        i += 16;
    }
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    let mut s = _mm512_reduce_add_ps(s);
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
        // SAFETY: the CpuSupport proof says AVX-512 F was detected; each row slice
        // holds x.len() elements.
        |r| unsafe { dot4(x, r.map(<[W]>::as_ptr)) },
        // SAFETY: as above, for one row.
        |r| unsafe { dot1(x, r.as_ptr()) },
    )
}
