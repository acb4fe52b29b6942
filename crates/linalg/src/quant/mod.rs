//! Integer products for dynamically quantized linear layers (the 8da4w / 8da8w
//! recipes): activations quantized per row to int8 with XNNPACK's arithmetic ("qd8"),
//! times 4- or 8-bit weights quantized per output channel or per block of inputs.
//!
//! * [`quantize_qd8`] quantizes rows of f32 activations (asymmetric, one scale and
//!   zero point per row, `lrintf` rounding: google/XNNPACK `src/xnnpack/quantization.h`,
//!   `xnn_qd8_asymmetric_quantization_params`, and the f32-qd8 convert of
//!   `src/operator-run.c`).
//! * [`Qd8Weights`] packs a weight matrix once, at load time, into panels of 16 output
//!   channels laid out for the `vpdpbusd` / `pmaddubsw` int8 dot products.
//! * [`gemm_qd8`] computes `clamp(dequantize(A) · dequantize(W)ᵀ + bias)`.
//!
//! # The arithmetic
//!
//! With `q` an activation row (zero point `zp`, dequantization scale `d`), `u` a weight
//! code (the stored value, zero point `o`: 8 for 4-bit codes, 128 for int8 weights
//! shifted to unsigned) and `s[b]` the weight scale of block `b`:
//!
//! `y = d · Σ_b s[b] · Σ_{k in b} (q_k - zp)(u_k - o) + bias`
//!
//! evaluated in XNNPACK's order (google/XNNPACK `src/qd8-f32-qb4w-gemm/`, and the packer
//! in `src/qb4-packw/`), so that the results match the official runtime's to the last
//! bits, not just to rounding: `y = d · (zp · K + Σ_b s[b] · Σ_{k in b} q_k (u_k - o)) +
//! bias` with `K = -Σ_b s[b] · Σ_{k in b} (u_k - o)` precomputed per output channel at
//! packing time, the block terms added with fused multiply-adds. The inner sum
//! `Σ q·(u - o) = Σ q·u - o·Σq` is the AVX2 / scalar dot product (`u` unsigned, `q`
//! signed) plus a row term computed once per row and block (the aarch64 `sdot` kernel
//! computes the same signed sum directly, from centred weights); the VNNI kernel, as
//! XNNPACK's, uses the unsigned "qdu8" form instead, `Σ (q + 128)(u - o)` with the zero
//! point `zp + 128` (same exact value, and the same f32 rounding as the official
//! runtime on a VNNI CPU); it is an exact integer, and blocks are at
//! most 256 inputs so that it converts to f32 exactly. (Expanding the zero point into
//! the integer sums instead, with uncentred weight sums, loses several bits to
//! cancellation when `|zp|` is large: a visible drift over a 30-layer LLM.)

mod kernels;
#[cfg(target_arch = "aarch64")]
mod neon;
mod pack;
pub mod qs8;
#[cfg(test)]
mod qs8_tests;
#[cfg(target_arch = "x86_64")]
mod qs8_x86;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use pack::{Qd8Weights, WeightBits};

use crate::{Isa, LinalgError, ThreadPool, dispatch};

/// Output channels per packed panel (one 512-bit vector of i32 lanes).
pub const PANEL: usize = 16;

/// The row stride of quantized activations for rows of `k` values: `k` rounded up to a
/// multiple of 8 (the padding holds zeros).
pub fn qd8_row_stride(k: usize) -> usize {
    k.div_ceil(8) * 8
}

/// XNNPACK's qd8 quantization parameters of a row whose values lie in `[min, max]`:
/// the quantization scale (`255 / (rmax - rmin)`, the range widened to include 0; 1 for
/// an all-zero row) and the zero point, nudged into `[-128, 127]` and rounded to
/// nearest-even as `lrintf` does.
pub fn qd8_params(min: f32, max: f32) -> (f32, f32) {
    let (qmin, qmax) = (-128f32, 127f32);
    let rmin = min.min(0.0);
    let rmax = max.max(0.0);
    let scale = if rmin == rmax {
        1.0
    } else {
        (qmax - qmin) / (rmax - rmin)
    };
    let dmin = rmin * scale;
    let dmax = rmax * scale;
    let zp = if (qmin + dmin) + (qmax + dmax) > 0.0 {
        qmin - dmin
    } else {
        qmax - dmax
    };
    (scale, zp.clamp(qmin, qmax).round_ties_even())
}

/// Quantizes `x` (rows of `k` values) to int8 rows of stride [`qd8_row_stride`]`(k)`
/// in `q` (padding zeroed), `q = clamp(rint(x · scale) + zp, -128, 127)`, and writes
/// each row's `(1 / scale, zp)` pair to `params`.
pub fn quantize_qd8(
    x: &[f32],
    k: usize,
    q: &mut [i8],
    params: &mut [f32],
) -> Result<(), LinalgError> {
    if k == 0 {
        return Ok(());
    }
    let rows = x.len() / k;
    let stride = qd8_row_stride(k);
    if q.len() < rows * stride {
        return Err(LinalgError::OutputTooSmall {
            what: "qd8 quantized rows",
            need: rows * stride,
            len: q.len(),
        });
    }
    if params.len() < 2 * rows {
        return Err(LinalgError::OutputTooSmall {
            what: "qd8 row parameters",
            need: 2 * rows,
            len: params.len(),
        });
    }
    for ((xs, qs), p) in x
        .chunks_exact(k)
        .zip(q.chunks_exact_mut(stride))
        .zip(params.chunks_exact_mut(2))
    {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = dispatch().elementwise.avx512() {
            let (lo, hi) = x86::row_min_max(t, xs);
            let (scale, zp) = qd8_params(lo, hi);
            x86::quantize_row(t, xs, scale, zp, &mut qs[..k]);
            qs[k..].fill(0);
            p[0] = 1.0 / scale;
            p[1] = zp;
            continue;
        }
        let (lo, hi) = xs
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            });
        let (scale, zp) = qd8_params(lo, hi);
        quantize_row_scalar(xs, scale, zp, &mut qs[..k]);
        qs[k..].fill(0);
        p[0] = 1.0 / scale;
        p[1] = zp;
    }
    Ok(())
}

/// `q = clamp(rint(x · scale) + zp, -128, 127)` for one row (the scalar twin of the
/// SIMD row quantizers).
pub(crate) fn quantize_row_scalar(xs: &[f32], scale: f32, zp: f32, qs: &mut [i8]) {
    for (d, &v) in qs.iter_mut().zip(xs) {
        *d = ((v * scale).round_ties_even() + zp).clamp(-128.0, 127.0) as i8;
    }
}

/// Quantized activations: `m` rows of stride [`qd8_row_stride`]`(k)` and one
/// `(dequantization scale, zero point)` pair per row, as [`quantize_qd8`] writes them.
#[derive(Clone, Copy, Debug)]
pub struct Qd8Rows<'a> {
    /// Number of rows.
    pub m: usize,
    /// `m` rows of `qd8_row_stride(k)` int8 values.
    pub q: &'a [i8],
    /// `2 * m` values: each row's dequantization scale and zero point.
    pub params: &'a [f32],
}

/// The proof for the one-row kernel (one activation row, 4-bit weights, AVX-512 VNNI);
/// `None` where the per-panel tiles run.
fn one_row_kernel(isa: Isa, m: usize, w: &Qd8Weights) -> Option<crate::CpuSupport> {
    match (isa, m, w.bits()) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni(t), 1, WeightBits::Four) => Some(t),
        _ => None,
    }
}

/// Fewest activation rows per task of the row kernel (one full tile each).
#[cfg(target_arch = "x86_64")]
const MIN_ROWS_PER_TASK: usize = 8;

/// The proof for the row kernel (several activation rows, AVX-512 VNNI): each task takes
/// a run of rows against every panel and writes finished outputs, with no panel
/// accumulators and no epilogue pass; `None` where the per-panel tiles run (too few rows
/// to give every thread a tile: the threads then split the panels).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // x86 kernel only
fn rows_kernel(isa: Isa, m: usize, threads: usize) -> Option<crate::CpuSupport> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni(t) if m > 1 && (threads <= 1 || m >= MIN_ROWS_PER_TASK * threads) => {
            Some(t)
        }
        _ => None,
    }
}

/// f32 scratch elements [`gemm_qd8`] may need for `m` rows times `w`, whatever the
/// instruction set and thread count (an upper bound of [`gemm_qd8_scratch_len_for`]).
pub fn gemm_qd8_scratch_len(m: usize, w: &Qd8Weights) -> usize {
    // The VNNI kernels also keep the activations as unsigned bytes (`q + 128`),
    // converted once per call for every panel they are read against.
    let unsigned_rows = (m * qd8_row_stride(w.k())).div_ceil(4);
    unsigned_rows + m * w.blocks() + m * w.panels() * PANEL
}

/// f32 scratch elements [`gemm_qd8`] needs for `m` rows times `w` on this CPU with
/// `threads` threads.
pub fn gemm_qd8_scratch_len_for(m: usize, w: &Qd8Weights, threads: usize) -> usize {
    scratch_len_with(dispatch().quant, m, w, threads)
}

fn scratch_len_with(isa: Isa, m: usize, w: &Qd8Weights, threads: usize) -> usize {
    if rows_kernel(isa, m, threads).is_some() {
        (m * qd8_row_stride(w.k())).div_ceil(4)
    } else {
        gemm_qd8_scratch_len(m, w)
    }
}

/// `out[m, n] = clamp(d_r · Σ_b s[j, b] Σ_k (q[r, k] - zp_r)(u[j, k] - o) + bias[j],
/// min, max)`, on the best int8 kernel of this CPU. `scratch` holds at least
/// [`gemm_qd8_scratch_len`] values (the caller's temp allocator).
pub fn gemm_qd8(
    pool: &ThreadPool,
    a: &Qd8Rows,
    w: &Qd8Weights,
    bias: Option<&[f32]>,
    clamp: (f32, f32),
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    gemm_qd8_with(dispatch().quant, pool, a, w, bias, clamp, out, scratch)
}

/// [`gemm_qd8`] with the kernels of `isa` (for tests and A/B measurements).
#[allow(clippy::too_many_arguments)]
pub fn gemm_qd8_with(
    isa: Isa,
    pool: &ThreadPool,
    a: &Qd8Rows,
    w: &Qd8Weights,
    bias: Option<&[f32]>,
    (min, max): (f32, f32),
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    let (m, n, k) = (a.m, w.n(), w.k());
    let stride = qd8_row_stride(k);
    if a.q.len() < m * stride || a.params.len() < 2 * m {
        return Err(LinalgError::ViewOutOfBounds {
            what: "qd8 activations",
            rows: m,
            cols: stride,
            len: a.q.len(),
        });
    }
    if out.len() < m * n {
        return Err(LinalgError::OutputTooSmall {
            what: "qd8 GEMM output",
            need: m * n,
            len: out.len(),
        });
    }
    if let Some(b) = bias
        && b.len() < n
    {
        return Err(LinalgError::Shape(format!(
            "qd8 GEMM: {} bias values for {n} outputs",
            b.len()
        )));
    }
    let need = scratch_len_with(isa, m, w, pool.threads());
    if scratch.len() < need {
        return Err(LinalgError::ScratchTooSmall {
            what: "qd8 GEMM",
            need,
            len: scratch.len(),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // Scratch: the activations as unsigned bytes (first: the row kernel needs only them),
    // then the row terms and the panel accumulators.
    let offset = kernels::unsigned_offset(isa);
    let (unsigned, rest) = scratch[..need].split_at_mut((m * stride).div_ceil(4));
    let unsigned: &mut [u8] = bytemuck::cast_slice_mut(unsigned);
    if offset != 0.0 {
        // Each group of four is then one broadcast load in the VNNI kernels.
        for (u, &q) in unsigned.iter_mut().zip(&a.q[..m * stride]) {
            *u = (q as u8) ^ 0x80;
        }
    }
    let unsigned: &[u8] = unsigned;
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = rows_kernel(isa, m, pool.threads()) {
        let per = m.div_ceil(pool.threads()).max(1);
        pool.for_each_chunk_mut(&mut out[..m * n], per * n, 1, |task, rows| {
            x86::rows_avx512_vnni(t, a, w, unsigned, bias, (min, max), task * per, rows);
        });
        return Ok(());
    }
    let (row_terms, acc) = rest.split_at_mut(m * w.blocks());
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // x86 kernel only
    let row_kernel = one_row_kernel(isa, m, w);
    // The VNNI kernel's unsigned form needs no row terms.
    if offset == 0.0 {
        kernels::row_terms(a, w, row_terms);
    }
    let row_terms: &[f32] = row_terms;
    let panels = w.panels();
    let per_task = panels.div_ceil(pool.threads()).max(1);
    let corr = w.channel_sums();
    pool.for_each_chunk_mut(acc, per_task * m * PANEL, 1, |task, chunk| {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = row_kernel {
            x86::row_panels_avx512_vnni(t, a, w, unsigned, task * per_task, chunk);
            return;
        }
        for (i, panel_acc) in chunk.chunks_exact_mut(m * PANEL).enumerate() {
            let p = task * per_task + i;
            // The accumulators start at the zero-point term `zp · K` (XNNPACK's order).
            let k_sums = &corr[p * PANEL..(p + 1) * PANEL];
            for (r, row) in panel_acc.chunks_exact_mut(PANEL).enumerate() {
                let zp = a.params[2 * r + 1] + offset;
                for (o, &kj) in row.iter_mut().zip(k_sums) {
                    *o = kj * zp;
                }
            }
            kernels::run_panel(isa, a, w, row_terms, unsigned, p, panel_acc);
        }
    });
    // Epilogue: the row's dequantization, bias and clamp; panels of 16 channels
    // scattered to the row-major output.
    for r in 0..m {
        let d = a.params[2 * r];
        let row = &mut out[r * n..(r + 1) * n];
        for (p, chunk) in row.chunks_mut(PANEL).enumerate() {
            let src = &acc[(p * m + r) * PANEL..][..chunk.len()];
            for (j, (o, &s)) in chunk.iter_mut().zip(src).enumerate() {
                let b = bias.map_or(0.0, |b| b[p * PANEL + j]);
                *o = (s * d + b).max(min).min(max);
            }
        }
    }
    Ok(())
}
