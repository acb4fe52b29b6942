//! aarch64 int8 panel kernel: `sdot` (Armv8.2 dot-product extension: four signed byte
//! products summed into each i32 lane).
//!
//! Lane `l` of vector `j` is output channel `4j + l` of the panel; an activation group
//! of 4 bytes is broadcast to all lanes. The arithmetic is the scalar twin's signed form
//! (no activation offset): `Σ q·(u - o)` per block, exact in i32, then one fused
//! multiply-add by the block scale. 4-bit codes are stored XOR 8, so masking a nibble
//! into the high half of a byte gives `16 · (u - 8)` directly; the block sum is shifted
//! back by 4 (exact).
//!
//! The `sdot` intrinsic (`vdotq_s32`) is not stable in Rust yet, so the one instruction
//! is written as inline assembly.

use std::arch::aarch64::*;
use std::arch::asm;

use super::kernels::check_panel_operands;
use super::{PANEL, Qd8Rows, Qd8Weights, WeightBits, qd8_row_stride};
use crate::CpuSupport;

/// One panel for every row, with `sdot`.
pub(super) fn panel_neon_dot(
    _proof: CpuSupport,
    a: &Qd8Rows,
    w: &Qd8Weights,
    p: usize,
    acc: &mut [f32],
) {
    check_panel_operands(a, w, p, acc);
    for r in 0..a.m {
        // SAFETY: the proof says the CPU has NEON and the dot-product extension; the
        // checks above showed that row r, the panel's codes and scales and the row's
        // accumulators hold everything the kernel reads and writes.
        unsafe { row_neon_dot(a, w, p, r, &mut acc[r * PANEL..(r + 1) * PANEL]) };
    }
}

/// `acc += sdot(weights, activations)`: per i32 lane, the sum of four byte products.
///
/// # Safety
/// Needs the dot-product extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, weights: int8x16_t, activations: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads two vector registers and accumulates into a third; the
    // caller guarantees the extension exists. No memory is touched.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) weights,
            x = in(vreg) activations,
            options(pure, nomem, nostack),
        );
    }
    acc
}

/// Four activations broadcast to every lane.
///
/// # Safety
/// `qp` must point at 4 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn group(qp: *const i8) -> int8x16_t {
    // SAFETY: 4 readable bytes (caller).
    let v = unsafe { qp.cast::<u32>().read_unaligned() };
    vreinterpretq_s8_u32(vdupq_n_u32(v))
}

/// One row against panel `p`: `acc[c] += Σ_b s[b, c] · Σ_{k in b} q[k] (u[c, k] - o)`.
///
/// # Safety
/// Needs NEON and the dot-product extension; the operands must hold what
/// [`panel_neon_dot`] checked.
#[target_feature(enable = "neon,dotprod")]
unsafe fn row_neon_dot(a: &Qd8Rows, w: &Qd8Weights, p: usize, r: usize, acc: &mut [f32]) {
    let stride = qd8_row_stride(w.k());
    let data = w.panel_data(p).as_ptr();
    let scales = w.panel_scales(p).as_ptr();
    let q = a.q[r * stride..].as_ptr();
    let high = vdupq_n_u8(0xf0);
    let flip = vdupq_n_u8(0x80);
    // SAFETY (whole function): inputs start..start+len lie within the padded row
    // (stride); the codes of input group t occupy 64 bytes at t * 64 (4-bit, 8 inputs)
    // or t * 64 (8-bit, 4 inputs), inside the panel's data; scales hold blocks * PANEL.
    unsafe {
        let mut f = [
            vld1q_f32(acc.as_ptr()),
            vld1q_f32(acc.as_ptr().add(4)),
            vld1q_f32(acc.as_ptr().add(8)),
            vld1q_f32(acc.as_ptr().add(12)),
        ];
        let mut start = 0;
        for b in 0..w.blocks() {
            let len = w.block_len(b);
            let mut sums = [vdupq_n_s32(0); 4];
            match w.bits() {
                WeightBits::Four => {
                    let mut kk = start;
                    while kk < start + len {
                        let (lo_x, hi_x) = (group(q.add(kk)), group(q.add(kk + 4)));
                        for (j, s) in sums.iter_mut().enumerate() {
                            let v = vld1q_u8(data.add(kk * 8 + 16 * j));
                            let lo = vreinterpretq_s8_u8(vandq_u8(vshlq_n_u8::<4>(v), high));
                            let hi = vreinterpretq_s8_u8(vandq_u8(v, high));
                            *s = sdot(sdot(*s, lo, lo_x), hi, hi_x);
                        }
                        kk += 8;
                    }
                    for s in &mut sums {
                        // 16 x the centred sum: an exact shift back.
                        *s = vshrq_n_s32::<4>(*s);
                    }
                }
                WeightBits::Eight => {
                    let mut kk = start;
                    while kk < start + len {
                        let x = group(q.add(kk));
                        for (j, s) in sums.iter_mut().enumerate() {
                            // Stored as w + 128: flipping the top bit gives w.
                            let v = veorq_u8(vld1q_u8(data.add(kk * 16 + 16 * j)), flip);
                            *s = sdot(*s, vreinterpretq_s8_u8(v), x);
                        }
                        kk += 4;
                    }
                }
            }
            for (j, (fj, s)) in f.iter_mut().zip(&sums).enumerate() {
                let scale = vld1q_f32(scales.add(b * PANEL + 4 * j));
                *fj = vfmaq_f32(*fj, vcvtq_f32_s32(*s), scale);
            }
            start += len;
        }
        for (j, fj) in f.iter().enumerate() {
            vst1q_f32(acc.as_mut_ptr().add(4 * j), *fj);
        }
    }
}
