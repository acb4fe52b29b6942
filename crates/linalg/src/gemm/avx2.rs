//! AVX2 + FMA (+ F16C) versions of the GEMM micro-kernel and the dot-product rows.

use std::any::TypeId;
use std::arch::x86_64::*;

use half::{bf16, f16};

use super::kernels::{WeightElem, by_four_rows, dot_scalar};
use crate::CpuSupport;

/// Rows of the tile.
const MR: usize = 6;
/// Columns of the tile.
const NR: usize = 16;

/// AVX2+FMA 6x16 micro-kernel: 12 accumulators, two B vectors, one A broadcast.
///
/// # Safety
/// Needs AVX2 and FMA. `a` must hold `kc*MR` floats, `b` `kc*NR`, and `c` a full
/// `MR x NR` tile with row stride `ldc`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn kernel_6x16(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for k in 0..kc {
        // SAFETY: k < kc, so both reads stay inside the panels.
        let (b0, b1, ak) = unsafe {
            let bk = b.add(k * NR);
            (
                _mm256_loadu_ps(bk),
                _mm256_loadu_ps(bk.add(8)),
                a.add(k * MR),
            )
        };
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: r < MR, inside this step's A group.
            let av = unsafe { _mm256_broadcast_ss(&*ak.add(r)) };
            row[0] = _mm256_fmadd_ps(av, b0, row[0]);
            row[1] = _mm256_fmadd_ps(av, b1, row[1]);
        }
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
