//! The AVX-512 VNNI qs8 GEMM: `vpdpbusd` multiplies unsigned activations (`q + 128`,
//! as XNNPACK's `qs8-qc8w-gemm` VNNI kernels do) by the signed weights of a panel of
//! 16 output channels; the accumulators start at the bias folded with `-128 · Σ w`,
//! so the exact integer sums equal the scalar twin's. The epilogue is XNNPACK's fp32
//! requantization (`super::qs8::requantize`).

use std::arch::x86_64::*;

use super::qs8::{QS8_PANEL, Qs8Requant, Qs8Rows, Qs8Weights, requantize};
use crate::CpuSupport;

/// Rows per tile, and 16-channel panels per tile: 6 x 4 accumulators, the 4 panels'
/// weights and the broadcast row fill 30 of the 32 registers, so each broadcast of four
/// activation bytes feeds four `vpdpbusd` (one per panel).
const ROWS: usize = 6;
const PANELS: usize = 4;

/// What the kernels' unsafe loads rely on (`gemm_qs8_with` has checked it; asserted
/// again beside the `unsafe`): rows of `a` hold `k` values each, `out` the `n` columns
/// of each of its `m` rows, and every packed panel `k_padded` groups of 64 bytes.
fn assert_operands_fit(a: &Qs8Rows, w: &Qs8Weights, rq: &Qs8Requant, out: &[i8], ldc: usize) {
    let (m, n, k) = (a.m, w.n(), w.k());
    assert!(a.stride >= k && a.data.len() >= (m - 1) * a.stride + k);
    assert!(ldc >= n && out.len() >= (m - 1) * ldc + n);
    assert!(rq.scales.len() >= n);
    for p in 0..w.panels() {
        assert!(w.panel_data(p).len() >= QS8_PANEL * w.k_padded());
    }
}

/// The whole product on AVX-512 VNNI (operands validated by `gemm_qs8_with`).
pub(super) fn gemm_avx512_vnni(
    _proof: CpuSupport,
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    out: &mut [i8],
    ldc: usize,
) {
    assert_operands_fit(a, w, rq, out, ldc);
    let (m, panels) = (a.m, w.panels());
    let mut p = 0;
    while p < panels {
        let np = (panels - p).min(PANELS);
        let mut r = 0;
        while r < m {
            let rows = (m - r).min(ROWS);
            // SAFETY: the proof says the CPU has AVX-512 F/BW/VL and VNNI; the asserts
            // above show rows r..r+rows of `a` hold k values each, every panel holds
            // k_padded groups of 64 bytes, and `out` holds the `n` columns of each row.
            unsafe {
                match (rows, np) {
                    (6, 4) => tile::<6, 4>(a, w, rq, p, r, out, ldc),
                    (6, 3) => tile::<6, 3>(a, w, rq, p, r, out, ldc),
                    (6, 2) => tile::<6, 2>(a, w, rq, p, r, out, ldc),
                    (6, _) => tile::<6, 1>(a, w, rq, p, r, out, ldc),
                    (3..=5, 4) => tile::<3, 4>(a, w, rq, p, r, out, ldc),
                    (3..=5, 3) => tile::<3, 3>(a, w, rq, p, r, out, ldc),
                    (3..=5, 2) => tile::<3, 2>(a, w, rq, p, r, out, ldc),
                    (3..=5, _) => tile::<3, 1>(a, w, rq, p, r, out, ldc),
                    (_, 4) => tile::<1, 4>(a, w, rq, p, r, out, ldc),
                    (_, 3) => tile::<1, 3>(a, w, rq, p, r, out, ldc),
                    (_, 2) => tile::<1, 2>(a, w, rq, p, r, out, ldc),
                    (_, _) => tile::<1, 1>(a, w, rq, p, r, out, ldc),
                }
            }
            r += match rows {
                6 => 6,
                3..=5 => 3,
                _ => 1,
            };
        }
        p += np;
    }
}

/// Rows `r0..r0 + R` times panels `p0..p0 + P` (the last panel of the weights may be
/// partial: its missing lanes are neither read from the scales nor stored).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const P: usize>(
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    p0: usize,
    r0: usize,
    out: &mut [i8],
    ldc: usize,
) {
    let (k, n) = (w.k(), w.n());
    let full = k / 4;
    // SAFETY (whole function): see the caller; group t of panel p is the 64 bytes at
    // t * 64 of its data, rows are read at r * stride + 4 t + 0..4 for 4 t + 4 <= k, and
    // the tail bytes one by one; each panel's bias holds 16 lanes.
    unsafe {
        let data: [*const i8; P] = std::array::from_fn(|j| w.panel_data(p0 + j).as_ptr());
        let mut acc: [[__m512i; P]; R] = [std::array::from_fn(|j| {
            _mm512_loadu_si512(w.panel_bias(p0 + j, true).as_ptr().cast())
        }); R];
        let rows: [*const i8; R] =
            std::array::from_fn(|r| a.data.as_ptr().add((r0 + r) * a.stride));
        // The sign flip in the vector unit, after a broadcast straight from memory: the
        // scalar flip before a broadcast from a general register costs more per product.
        let flip = _mm512_set1_epi32(0x8080_8080_u32 as i32);
        for t in 0..full {
            let wv: [__m512i; P] =
                std::array::from_fn(|j| _mm512_loadu_si512(data[j].add(t * 64).cast()));
            for (acc, &row) in acc.iter_mut().zip(&rows) {
                let v = _mm512_set1_epi32(row.add(4 * t).cast::<i32>().read_unaligned());
                let v = _mm512_xor_si512(v, flip);
                for (acc, &wv) in acc.iter_mut().zip(&wv) {
                    *acc = _mm512_dpbusd_epi32(*acc, v, wv);
                }
            }
        }
        if !k.is_multiple_of(4) {
            let wv: [__m512i; P] =
                std::array::from_fn(|j| _mm512_loadu_si512(data[j].add(full * 64).cast()));
            for (acc, &row) in acc.iter_mut().zip(&rows) {
                let mut bytes = [0u8; 4];
                for (j, b) in bytes.iter_mut().enumerate().take(k % 4) {
                    *b = (*row.add(4 * full + j) as u8) ^ 0x80;
                }
                let v = _mm512_set1_epi32(u32::from_le_bytes(bytes) as i32);
                for (acc, &wv) in acc.iter_mut().zip(&wv) {
                    *acc = _mm512_dpbusd_epi32(*acc, v, wv);
                }
            }
        }
        let zp = rq.zero_point;
        let lo = _mm512_set1_ps((i32::from(rq.min) - zp) as f32);
        let hi = _mm512_set1_ps((i32::from(rq.max) - zp) as f32);
        let vzp = _mm512_set1_epi32(zp);
        for j in 0..P {
            let c0 = (p0 + j) * QS8_PANEL;
            let lanes = (n - c0).min(QS8_PANEL);
            let mask: __mmask16 = if lanes == 16 {
                0xffff
            } else {
                (1u16 << lanes) - 1
            };
            let vs = _mm512_maskz_loadu_ps(mask, rq.scales.as_ptr().add(c0));
            for (r, acc) in acc.iter().enumerate() {
                let f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[j]), vs);
                let f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
                // Round to nearest-even (the default MXCSR mode), as lrintf.
                let q = _mm512_add_epi32(_mm512_cvtps_epi32(f), vzp);
                let bytes = _mm512_cvtepi32_epi8(q);
                let dst = out.as_mut_ptr().add((r0 + r) * ldc + c0);
                _mm_mask_storeu_epi8(dst, mask, bytes);
            }
        }
    }
}

/// The whole product on AVX2, one row at a time: the row's four inputs of a group,
/// sign-extended to 16 bits and repeated, times each 16-byte quarter of the group's 64
/// weight bytes (four channels of four) sign-extended likewise, by `vpmaddwd`: two
/// partial sums per channel, added at the end. Exact integer sums (a pair of products
/// fits 32 bits), then the scalar requantization: the scalar twin's bytes.
pub(super) fn gemm_avx2(
    _proof: CpuSupport,
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    out: &mut [i8],
    ldc: usize,
) {
    assert_operands_fit(a, w, rq, out, ldc);
    let (m, n, k) = (a.m, w.n(), w.k());
    for p in 0..w.panels() {
        let data = w.panel_data(p);
        let bias = w.panel_bias(p, false);
        let lanes = (n - p * QS8_PANEL).min(QS8_PANEL);
        for r in 0..m {
            let row = &a.data[r * a.stride..r * a.stride + k];
            let mut pairs = [0i32; 2 * QS8_PANEL];
            // SAFETY: the proof says the CPU has AVX2; the panel holds k_padded / 4
            // groups of 64 bytes (`assert_operands_fit`), `pairs` 32 values.
            unsafe { row_pairs_avx2(row, data, &mut pairs) };
            let dst = &mut out[r * ldc + p * QS8_PANEL..r * ldc + p * QS8_PANEL + lanes];
            for (c, o) in dst.iter_mut().enumerate() {
                let acc = bias[c] + pairs[2 * c] + pairs[2 * c + 1];
                let ch = p * QS8_PANEL + c;
                *o = requantize(acc, rq.scales[ch], rq.zero_point, rq.min, rq.max);
            }
        }
    }
}

/// The 32 partial sums of one row against one packed panel (`data` at least
/// `k.div_ceil(4) * 64` bytes).
#[target_feature(enable = "avx2")]
unsafe fn row_pairs_avx2(row: &[i8], data: &[i8], pairs: &mut [i32; 2 * QS8_PANEL]) {
    let k = row.len();
    let groups = k.div_ceil(4);
    // SAFETY (whole function): group t's weights are data[64 t..64 t + 64] (the caller
    // checked the panel's length); the row is read at 4 t..4 t + 4 for whole groups and
    // byte by byte in the last one; `pairs` holds four vectors of eight.
    unsafe {
        let mut acc = [_mm256_setzero_si256(); 4];
        let d = data.as_ptr();
        for t in 0..groups {
            let x4 = if 4 * t + 4 <= k {
                row.as_ptr().add(4 * t).cast::<i32>().read_unaligned()
            } else {
                let mut b = [0u8; 4];
                for (j, b) in b.iter_mut().enumerate() {
                    *b = row.get(4 * t + j).map_or(0, |&v| v as u8);
                }
                i32::from_le_bytes(b)
            };
            let xs = _mm256_cvtepi8_epi16(_mm_set1_epi32(x4));
            for (q, acc) in acc.iter_mut().enumerate() {
                let wq = _mm_loadu_si128(d.add(64 * t + 16 * q).cast());
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(xs, _mm256_cvtepi8_epi16(wq)));
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            _mm256_storeu_si256(pairs.as_mut_ptr().add(8 * q).cast(), *acc);
        }
    }
}
