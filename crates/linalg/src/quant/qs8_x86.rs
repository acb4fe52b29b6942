//! The AVX-512 VNNI qs8 GEMM: `vpdpbusd` multiplies unsigned activations (`q + 128`,
//! as XNNPACK's `qs8-qc8w-gemm` VNNI kernels do) by the signed weights of a panel of
//! 16 output channels; the accumulators start at the bias folded with `-128 · Σ w`,
//! so the exact integer sums equal the scalar twin's. The epilogue is XNNPACK's fp32
//! requantization (`super::qs8::requantize`).

use std::arch::x86_64::*;

use super::qs8::{QS8_PANEL, Qs8Requant, Qs8Rows, Qs8Weights};
use crate::CpuSupport;

/// Rows per tile.
const ROWS: usize = 8;

/// The whole product on AVX-512 VNNI (operands validated by `gemm_qs8_with`).
pub(super) fn gemm_avx512_vnni(
    _proof: CpuSupport,
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    out: &mut [i8],
    ldc: usize,
) {
    let (m, n, k) = (a.m, w.n(), w.k());
    assert!(a.stride >= k && a.data.len() >= (m - 1) * a.stride + k);
    assert!(ldc >= n && out.len() >= (m - 1) * ldc + n);
    assert!(rq.scales.len() >= n);
    for p in 0..w.panels() {
        let lanes = (n - p * QS8_PANEL).min(QS8_PANEL);
        let mut scales = [0f32; QS8_PANEL];
        scales[..lanes].copy_from_slice(&rq.scales[p * QS8_PANEL..p * QS8_PANEL + lanes]);
        assert!(w.panel_data(p).len() >= QS8_PANEL * w.k_padded());
        let mut r = 0;
        while r < m {
            let rows = (m - r).min(ROWS);
            // SAFETY: the proof says the CPU has AVX-512 F/BW/VL and VNNI; the asserts
            // above show rows r..r+rows of `a` hold k values each, the panel holds
            // k_padded groups of 64 bytes, and `out` holds `lanes` bytes of each row
            // at column p * 16.
            unsafe {
                match rows {
                    8 => tile::<8>(a, w, rq, &scales, p, lanes, r, out, ldc),
                    4..=7 => tile::<4>(a, w, rq, &scales, p, lanes, r, out, ldc),
                    2 | 3 => tile::<2>(a, w, rq, &scales, p, lanes, r, out, ldc),
                    _ => tile::<1>(a, w, rq, &scales, p, lanes, r, out, ldc),
                }
            }
            r += match rows {
                8 => 8,
                4..=7 => 4,
                2 | 3 => 2,
                _ => 1,
            };
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize>(
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    scales: &[f32; QS8_PANEL],
    p: usize,
    lanes: usize,
    r0: usize,
    out: &mut [i8],
    ldc: usize,
) {
    let k = w.k();
    let full = k / 4;
    let data = w.panel_data(p).as_ptr();
    let bias = w.panel_bias(p, true).as_ptr();
    // SAFETY (whole function): see the caller; group t of the panel is the 64 bytes at
    // t * 64, rows are read at r * stride + 4 t + 0..4 for 4 t + 4 <= k, and the tail
    // bytes one by one.
    unsafe {
        let b = _mm512_loadu_si512(bias.cast());
        let mut acc = [b; R];
        let rows: [*const i8; R] =
            std::array::from_fn(|r| a.data.as_ptr().add((r0 + r) * a.stride));
        for t in 0..full {
            let wv = _mm512_loadu_si512(data.add(t * 64).cast());
            for (acc, &row) in acc.iter_mut().zip(&rows) {
                let v = row.add(4 * t).cast::<u32>().read_unaligned() ^ 0x8080_8080;
                *acc = _mm512_dpbusd_epi32(*acc, _mm512_set1_epi32(v as i32), wv);
            }
        }
        if !k.is_multiple_of(4) {
            let wv = _mm512_loadu_si512(data.add(full * 64).cast());
            for (acc, &row) in acc.iter_mut().zip(&rows) {
                let mut bytes = [0u8; 4];
                for (j, b) in bytes.iter_mut().enumerate().take(k % 4) {
                    *b = (*row.add(4 * full + j) as u8) ^ 0x80;
                }
                let v = u32::from_le_bytes(bytes);
                *acc = _mm512_dpbusd_epi32(*acc, _mm512_set1_epi32(v as i32), wv);
            }
        }
        let vs = _mm512_loadu_ps(scales.as_ptr());
        let zp = rq.zero_point;
        let lo = _mm512_set1_ps((i32::from(rq.min) - zp) as f32);
        let hi = _mm512_set1_ps((i32::from(rq.max) - zp) as f32);
        let vzp = _mm512_set1_epi32(zp);
        let mask: __mmask16 = if lanes == 16 {
            0xffff
        } else {
            (1u16 << lanes) - 1
        };
        for (r, acc) in acc.iter().enumerate() {
            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(*acc), vs);
            let f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
            // Round to nearest-even (the default MXCSR mode), as lrintf.
            let q = _mm512_add_epi32(_mm512_cvtps_epi32(f), vzp);
            let bytes = _mm512_cvtepi32_epi8(q);
            let dst = out.as_mut_ptr().add((r0 + r) * ldc + p * QS8_PANEL);
            _mm_mask_storeu_epi8(dst, mask, bytes);
        }
    }
}
