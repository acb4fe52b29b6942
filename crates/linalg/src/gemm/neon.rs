//! NEON versions of the GEMM micro-kernel and the dot-product rows.

use std::any::TypeId;
use std::arch::aarch64::*;

use half::bf16;

use super::kernels::{TilePost, WeightElem, by_four_rows, dot_scalar};
use crate::CpuSupport;

/// Rows of the tile.
const MR: usize = 6;
/// Columns of the tile.
const NR: usize = 16;

/// NEON 6x16 micro-kernel: 24 accumulator registers (4 per row), four B vectors,
/// the A values broadcast from one load per step.
///
/// A is a packed panel (`lda == 0`: step `k`, row `r` at `a[k*MR + r]`) or `MR` rows
/// of a row-major matrix read in place (row `r`, step `k` at `a[r*lda + k]`).
///
/// B's step `k` is the `NR` values at `b + k*ldb` (`ldb == NR`: a packed panel;
/// more: `NR` columns of a row-major matrix read in place).
///
/// The first `cols` (1 to `NR`) columns of the tile are stored.
///
/// # Safety
/// Needs NEON. `a` must hold `kc*MR` floats (packed) or `(MR-1)*lda + kc` (rows), `b`
/// `(kc-1)*ldb + NR`, and `c` `MR` rows of `cols` floats at row stride `ldc`.
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel_6x16(
    kc: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc, cols): (*mut f32, usize, usize),
    accumulate: bool,
    post: Option<&TilePost>,
) {
    let mut acc = [[vdupq_n_f32(0.0); 4]; MR];
    // The steps, with `$at(k, r)` the address of A's value for row r at step k.
    macro_rules! steps {
        ($at:expr) => {
            for k in 0..kc {
                // SAFETY: k < kc, so the 16 B values of step k (at k*ldb) are inside b.
                let bv = unsafe {
                    let bk = b.add(k * ldb);
                    [
                        vld1q_f32(bk),
                        vld1q_f32(bk.add(4)),
                        vld1q_f32(bk.add(8)),
                        vld1q_f32(bk.add(12)),
                    ]
                };
                for (r, row) in acc.iter_mut().enumerate() {
                    // SAFETY: r < MR and k < kc: inside A (see the function's contract).
                    let av = unsafe { *$at(k, r) };
                    for (reg, &bq) in row.iter_mut().zip(&bv) {
                        *reg = vfmaq_n_f32(*reg, bq, av);
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
        for (q, &v) in row.iter().enumerate() {
            // Columns of this vector inside the tile's `cols`.
            let n = cols.saturating_sub(4 * q).min(4);
            if n == 0 {
                break;
            }
            // SAFETY: the tile has MR rows of `cols` floats at stride ldc; a vector
            // with fewer than 4 of them goes through `part`, of which only the first
            // n values are read from and written back to the tile.
            unsafe {
                let out = c.add(r * ldc + 4 * q);
                let mut part = [0f32; 4];
                let p = if n == 4 {
                    out
                } else {
                    std::ptr::copy_nonoverlapping(out, part.as_mut_ptr(), n);
                    part.as_mut_ptr()
                };
                let mut v = if accumulate {
                    vaddq_f32(v, vld1q_f32(p))
                } else {
                    v
                };
                if let Some(post) = post {
                    // Compare and select (NEON's max and min would turn -0.0 into +0.0
                    // against a 0.0 bound): exactly `output_clamp`.
                    let col = vld1q_f32(post.col_add.as_ptr().add(4 * q));
                    v = vaddq_f32(vaddq_f32(v, vdupq_n_f32(post.row_add[r])), col);
                    let (lo, hi) = (vdupq_n_f32(post.lo), vdupq_n_f32(post.hi));
                    v = vbslq_f32(vcltq_f32(v, lo), lo, v);
                    v = vbslq_f32(vcgtq_f32(v, hi), hi, v);
                }
                vst1q_f32(p, v);
                if n < 4 {
                    std::ptr::copy_nonoverlapping(part.as_ptr(), out, n);
                }
            }
        }
    }
}

/// One row of A against one packed 16-column panel: `out[c] = Σ_k x[k] · b[k*16 + c]`,
/// two steps per iteration into separate accumulators (8 registers).
///
/// # Safety
/// Needs NEON. `x` must hold `k` floats, `b` `k*16` and `out` 16.
#[target_feature(enable = "neon")]
pub(super) unsafe fn panel_dot_16(k: usize, x: *const f32, b: *const f32, out: *mut f32) {
    let mut acc = [[vdupq_n_f32(0.0); 4]; 2];
    let mut kk = 0;
    while kk < k {
        let u = kk % 2;
        // SAFETY: kk < k: x[kk] and the 16 weights of step kk are inside.
        unsafe {
            let xv = *x.add(kk);
            let bk = b.add(kk * NR);
            for (q, reg) in acc[u].iter_mut().enumerate() {
                *reg = vfmaq_n_f32(*reg, vld1q_f32(bk.add(4 * q)), xv);
            }
        }
        kk += 1;
    }
    for (q, (&even, &odd)) in acc[0].iter().zip(&acc[1]).enumerate() {
        // SAFETY: out holds 16 floats; 4*q + 4 <= 16.
        unsafe { vst1q_f32(out.add(4 * q), vaddq_f32(even, odd)) };
    }
}

/// Loads 4 weights as f32 (f32 directly, bf16 by widening shifts, others lane by
/// lane).
///
/// # Safety
/// Needs NEON; `p` must point at 4 readable elements of `W`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load4<W: WeightElem>(p: *const W) -> float32x4_t {
    // SAFETY: p points at 4 elements (caller); the type checks pick the layout.
    unsafe {
        if TypeId::of::<W>() == TypeId::of::<f32>() {
            vld1q_f32(p as *const f32)
        } else if TypeId::of::<W>() == TypeId::of::<bf16>() {
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p as *const u16)))
        } else {
            let v = [
                (*p).to_f32(),
                (*p.add(1)).to_f32(),
                (*p.add(2)).to_f32(),
                (*p.add(3)).to_f32(),
            ];
            vld1q_f32(v.as_ptr())
        }
    }
}

/// Dot products of `x` with 4 rows at once (shared loads of `x`, 8 accumulators).
///
/// # Safety
/// Needs NEON; each `w[r]` must point at `x.len()` elements.
#[target_feature(enable = "neon")]
unsafe fn dot4<W: WeightElem>(x: &[f32], w: [*const W; 4]) -> [f32; 4] {
    let k = x.len();
    let xp = x.as_ptr();
    let mut acc0 = [vdupq_n_f32(0.0); 4];
    let mut acc1 = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 8 <= k {
        // SAFETY: i + 8 <= k, inside x and every row.
        unsafe {
            let x0 = vld1q_f32(xp.add(i));
            let x1 = vld1q_f32(xp.add(i + 4));
            for r in 0..4 {
                acc0[r] = vfmaq_f32(acc0[r], load4(w[r].add(i)), x0);
                acc1[r] = vfmaq_f32(acc1[r], load4(w[r].add(i + 4)), x1);
            }
        }
        i += 8;
    }
    let mut out = [0f32; 4];
    for r in 0..4 {
        let mut s = vaddvq_f32(vaddq_f32(acc0[r], acc1[r]));
        for (j, &xv) in x.iter().enumerate().skip(i) {
            // SAFETY: j < k = x.len(), inside row r.
            s += xv * unsafe { *w[r].add(j) }.to_f32();
        }
        out[r] = s;
    }
    out
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
        // SAFETY: the CpuSupport proof says NEON was detected; each row slice holds
        // x.len() elements.
        |r| unsafe { dot4(x, r.map(<[W]>::as_ptr)) },
        |r| dot_scalar(x, r),
    )
}
