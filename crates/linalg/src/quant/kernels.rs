//! The per-panel int8 kernels: which one runs ([`run_panel`]), the scalar twin, and the
//! per-row block terms they share.

use super::pack::NIBBLE_FLIP;
use super::{PANEL, Qd8Rows, Qd8Weights, WeightBits, qd8_row_stride};
use crate::Isa;

/// The part of each block sum that depends only on the row: `-o·Σq`, as
/// `row_terms[r * blocks + b]` (exact integers, below 2^24), so that a kernel's
/// `dot + term` is `Σ q·(u - o)` exactly.
pub(super) fn row_terms(a: &Qd8Rows, w: &Qd8Weights, out: &mut [f32]) {
    let stride = qd8_row_stride(w.k());
    let o = w.bits().zero_point();
    let blocks = w.blocks();
    for r in 0..a.m {
        let q = &a.q[r * stride..(r + 1) * stride];
        for b in 0..blocks {
            let len = w.block_len(b);
            let start = b * w.block();
            let sum: i32 = q[start..start + len].iter().map(|&v| i32::from(v)).sum();
            out[r * blocks + b] = (-o * sum) as f32;
        }
    }
}

/// Checks the operand lengths the unsafe panel kernels rely on (internal invariants of
/// [`super::gemm_qd8_with`], which validated the caller's buffers): `m` activation rows,
/// panel `p`'s codes and scales, `m` accumulator rows, blocks of whole 8-input groups.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(super) fn check_panel_operands(a: &Qd8Rows, w: &Qd8Weights, p: usize, acc: &[f32]) {
    let stride = qd8_row_stride(w.k());
    let per_input = match w.bits() {
        WeightBits::Four => PANEL / 2,
        WeightBits::Eight => PANEL,
    };
    assert!(a.q.len() >= a.m * stride);
    assert!(w.panel_data(p).len() >= stride * per_input);
    assert!(w.panel_scales(p).len() >= w.blocks() * PANEL);
    assert!(acc.len() >= a.m * PANEL);
    assert!(w.block().is_multiple_of(8) && stride.is_multiple_of(8));
}

/// Adds `Σ_b s · (dot + row term)`, block after block with fused multiply-adds (as
/// XNNPACK's kernels do), to the `m x PANEL` accumulators of panel `p` in `acc` (which
/// hold the zero-point term), with the kernel of `isa`.
/// What the kernels of `isa` add to the activations and their zero point: 128 for the
/// VNNI kernels, which (as XNNPACK's) multiply unsigned activations `q + 128` by signed
/// weights, 0 for the others (signed activations, as XNNPACK's AVX2 and scalar
/// kernels). Exact arithmetic is the same; the f32 rounding of the block terms is not,
/// and matching the official runtime to the bit on the same CPU needs the same form.
pub(super) fn unsigned_offset(isa: Isa) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni(_) => 128.0,
        _ => 0.0,
    }
}

///
/// `unsigned` holds the activation rows as unsigned bytes (`q + 128`) where
/// [`unsigned_offset`] is not 0 (the VNNI kernels read those).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(super) fn run_panel(
    isa: Isa,
    a: &Qd8Rows,
    w: &Qd8Weights,
    row_terms: &[f32],
    unsigned: &[u8],
    p: usize,
    acc: &mut [f32],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni(t) => super::x86::panel_avx512_vnni(t, a, w, unsigned, p, acc),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) | Isa::Avx512(t) if w.bits() == WeightBits::Four => {
            super::x86::panel_avx2(t, a, w, row_terms, p, acc)
        }
        #[cfg(target_arch = "aarch64")]
        Isa::NeonDot(t) => super::neon::panel_neon_dot(t, a, w, p, acc),
        _ => panel_scalar(a, w, row_terms, p, acc),
    }
}

/// The scalar twin: the same packed layout, decoded one code at a time.
pub(super) fn panel_scalar(
    a: &Qd8Rows,
    w: &Qd8Weights,
    row_terms: &[f32],
    p: usize,
    acc: &mut [f32],
) {
    let stride = qd8_row_stride(w.k());
    let data = w.panel_data(p);
    let scales = w.panel_scales(p);
    let blocks = w.blocks();
    for r in 0..a.m {
        let q = &a.q[r * stride..(r + 1) * stride];
        let out = &mut acc[r * PANEL..(r + 1) * PANEL];
        let mut start = 0;
        for b in 0..blocks {
            let len = w.block_len(b);
            let mut dots = [0i32; PANEL];
            match w.bits() {
                WeightBits::Four => {
                    for t in start / 8..(start + len) / 8 {
                        let group = &data[t * 4 * PANEL..(t + 1) * 4 * PANEL];
                        for (c, d) in dots.iter_mut().enumerate() {
                            for i in 0..4 {
                                let byte = group[4 * c + i] ^ NIBBLE_FLIP;
                                *d += i32::from(q[8 * t + i]) * i32::from(byte & 0xf)
                                    + i32::from(q[8 * t + 4 + i]) * i32::from(byte >> 4);
                            }
                        }
                    }
                }
                WeightBits::Eight => {
                    for t in start / 4..(start + len) / 4 {
                        let group = &data[t * 4 * PANEL..(t + 1) * 4 * PANEL];
                        for (c, d) in dots.iter_mut().enumerate() {
                            for i in 0..4 {
                                *d += i32::from(q[4 * t + i]) * i32::from(group[4 * c + i]);
                            }
                        }
                    }
                }
            }
            let term = row_terms[r * blocks + b];
            for ((o, &d), &s) in out.iter_mut().zip(&dots).zip(&scales[b * PANEL..]) {
                *o = (d as f32 + term).mul_add(s, *o);
            }
            start += len;
        }
    }
}
