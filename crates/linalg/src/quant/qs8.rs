//! Static int8 ("qs8") arithmetic, as XNNPACK computes it for PT2E-quantized CNNs:
//! per-tensor quantized activations (`q = round(x / s) + zp`), weights quantized per
//! output channel (zero point 0, "qc8w") and int32 biases in the scale `s_in · s_w[c]`.
//!
//! Every accumulation is an exact integer; the one rounding step is XNNPACK's "fp32"
//! requantization (google/XNNPACK `src/xnnpack/requantization.h`,
//! `xnn_qs8_requantize_fp32`, and the `fp32` / `fmagic` epilogues of the
//! `src/qs8-qc8w-gemm/` and `src/qs8-qc8w-dwconv/` micro-kernels): the accumulator
//! converted to f32, multiplied by the channel's requantization scale
//! `s_in · s_w[c] / s_out` (computed in that order, `src/operators/convolution-nhwc.c`
//! `init_requantization_scale_qx8_qc8w`), clamped to `[min - zp, max - zp]`, rounded
//! to nearest-even, plus the output zero point. Matching these steps reproduces the
//! official runtime's int8 outputs exactly.
//!
//! * [`Qs8Weights`] packs a `[n, k]` int8 weight matrix once, at load time, into panels
//!   of 16 output channels (groups of 4 inputs, the `vpdpbusd` layout), with the
//!   biases folded with the input zero point.
//! * [`gemm_qs8`] multiplies int8 rows by them and requantizes to int8.
//! * [`depthwise_conv2d_qs8`] is the direct depthwise convolution.
//! * [`im2col_qs8`] gathers convolution patches, padding with the input zero point.

use std::ops::Range;

use crate::conv::ConvGeometry;
use crate::{Isa, LinalgError, ThreadPool, dispatch};

/// Output channels per packed panel.
pub const QS8_PANEL: usize = 16;

/// Inputs per packed group (one `vpdpbusd` lane's four bytes).
const GROUP: usize = 4;

/// The int8 output range and zero point of a requantization, with one scale per output
/// channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Qs8Requant {
    /// `s_in · s_w[c] / s_out` per output channel.
    pub scales: Vec<f32>,
    /// Output zero point.
    pub zero_point: i32,
    /// Quantized output bounds (the node's activation range, see [`quantize_bound`]).
    pub min: i8,
    pub max: i8,
}

/// `1.5 · 2^23`: added to an f32 of magnitude below `2^22`, it leaves that value
/// rounded to the nearest integer (ties to even, the default rounding mode) in the low
/// mantissa bits of the sum (XNNPACK's "magic bias").
const MAGIC_BIAS: f32 = 12_582_912.0;

/// `v.round_ties_even() as i32` for `|v| < 2^22`, which every clamped quantized value
/// is: plain arithmetic the compiler vectorizes, where `round_ties_even` is a call to
/// `rintf` per element.
#[inline(always)]
pub(crate) fn round_small(v: f32) -> i32 {
    (v + MAGIC_BIAS).to_bits() as i32 - MAGIC_BIAS.to_bits() as i32
}

/// XNNPACK's requantization of one accumulator (`xnn_qs8_requantize_fp32`).
#[inline(always)]
pub fn requantize(acc: i32, scale: f32, zero_point: i32, min: i8, max: i8) -> i8 {
    let lo = (i32::from(min) - zero_point) as f32;
    let hi = (i32::from(max) - zero_point) as f32;
    let v = (acc as f32 * scale).max(lo).min(hi);
    (round_small(v) + zero_point) as i8
}

/// An activation bound in the quantized domain: `xnn_qs8_quantize`
/// (google/XNNPACK `src/xnnpack/requantization.h`), `lrint(clamp(v / s + zp))`.
pub fn quantize_bound(value: f32, scale: f32, zero_point: i32) -> i8 {
    let v = value / scale + zero_point as f32;
    // fmaxf / fminf: a NaN operand yields the other one.
    let v = if v.is_nan() {
        -128.0
    } else {
        v.clamp(-128.0, 127.0)
    };
    v.round_ties_even() as i8
}

/// `Convert` f32 -> qs8: `clamp(rint(x · inv_scale) + zp, -128, 127)` with
/// `inv_scale = 1 / s` computed once in f32 (google/XNNPACK `src/microparams-init.c`
/// `xnn_init_f32_qs8_cvt_scalar_params`, the `src/f32-qs8-vcvt/` kernels).
pub fn quantize_qs8(x: &[f32], inv_scale: f32, zero_point: i32, out: &mut [i8]) {
    let lo = (-128 - zero_point) as f32;
    let hi = (127 - zero_point) as f32;
    for (o, &v) in out.iter_mut().zip(x) {
        let v = (v * inv_scale).max(lo).min(hi);
        *o = (round_small(v) + zero_point) as i8;
    }
}

/// `Convert` qs8 -> f32: `(q - zp) · s` (google/XNNPACK `src/qs8-f32-vcvt/`).
pub fn dequantize_qs8(q: &[i8], scale: f32, zero_point: i32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(q) {
        *o = (i32::from(v) - zero_point) as f32 * scale;
    }
}

/// A `[n, k]` int8 weight matrix packed for [`gemm_qs8`], with its folded biases.
#[derive(Debug, Clone)]
pub struct Qs8Weights {
    n: usize,
    k: usize,
    /// Panels of [`QS8_PANEL`] channels; in a panel, for every group of 4 inputs, the 4
    /// bytes of channel 0, then channel 1, ... (inputs past `k` and channels past `n`
    /// are zero).
    data: Vec<i8>,
    /// `bias[c] - zp_in · Σ_k w[c, k]`, per channel (padded to whole panels).
    bias_signed: Vec<i32>,
    /// `bias_signed[c] - 128 · Σ_k w[c, k]`: the start of the accumulators of the
    /// kernels that multiply unsigned activations `q + 128` (VNNI).
    bias_unsigned: Vec<i32>,
}

impl Qs8Weights {
    /// Packs `w` (`[n, k]` row-major) with `bias` (`n` int32 values, or none) for
    /// activations of zero point `input_zero_point`.
    pub fn new(
        n: usize,
        k: usize,
        w: &[i8],
        bias: Option<&[i32]>,
        input_zero_point: i32,
    ) -> Result<Self, LinalgError> {
        let need = n
            .checked_mul(k)
            .ok_or_else(|| LinalgError::Shape(format!("qs8 weights: {n} x {k} overflows")))?;
        if w.len() < need {
            return Err(LinalgError::Shape(format!(
                "qs8 weights: {} values for {n} x {k}",
                w.len()
            )));
        }
        if let Some(b) = bias
            && b.len() < n
        {
            return Err(LinalgError::Shape(format!(
                "qs8 weights: {} bias values for {n} channels",
                b.len()
            )));
        }
        let panels = n.div_ceil(QS8_PANEL);
        let kp = k.div_ceil(GROUP) * GROUP;
        let mut data = vec![0i8; panels * QS8_PANEL * kp];
        let mut bias_signed = vec![0i32; panels * QS8_PANEL];
        let mut bias_unsigned = vec![0i32; panels * QS8_PANEL];
        for c in 0..n {
            let (p, lane) = (c / QS8_PANEL, c % QS8_PANEL);
            let row = &w[c * k..(c + 1) * k];
            let panel = &mut data[p * QS8_PANEL * kp..(p + 1) * QS8_PANEL * kp];
            for (i, &v) in row.iter().enumerate() {
                let (t, j) = (i / GROUP, i % GROUP);
                panel[t * QS8_PANEL * GROUP + lane * GROUP + j] = v;
            }
            let sum: i64 = row.iter().map(|&v| i64::from(v)).sum();
            let b = i64::from(bias.map_or(0, |b| b[c]));
            let signed = b - i64::from(input_zero_point) * sum;
            let unsigned = signed - 128 * sum;
            let fits = |v: i64| i32::try_from(v).ok();
            bias_signed[c] = fits(signed).ok_or_else(|| {
                LinalgError::Shape(format!("qs8 weights: channel {c}'s bias overflows int32"))
            })?;
            bias_unsigned[c] = fits(unsigned).ok_or_else(|| {
                LinalgError::Shape(format!("qs8 weights: channel {c}'s bias overflows int32"))
            })?;
        }
        Ok(Self {
            n,
            k,
            data,
            bias_signed,
            bias_unsigned,
        })
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inputs per output channel.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes held by the packed weights and biases.
    pub fn packed_bytes(&self) -> usize {
        self.data.len() + 4 * (self.bias_signed.len() + self.bias_unsigned.len())
    }

    /// Inputs per channel rounded up to whole groups.
    pub(crate) fn k_padded(&self) -> usize {
        self.k.div_ceil(GROUP) * GROUP
    }

    pub(crate) fn panels(&self) -> usize {
        self.n.div_ceil(QS8_PANEL)
    }

    pub(crate) fn panel_data(&self, p: usize) -> &[i8] {
        let len = QS8_PANEL * self.k_padded();
        &self.data[p * len..(p + 1) * len]
    }

    pub(crate) fn panel_bias(&self, p: usize, unsigned: bool) -> &[i32] {
        let b = if unsigned {
            &self.bias_unsigned
        } else {
            &self.bias_signed
        };
        &b[p * QS8_PANEL..(p + 1) * QS8_PANEL]
    }
}

/// Int8 rows: `m` rows of `k` values, row `r` at `data[r * stride..]`.
#[derive(Debug, Clone, Copy)]
pub struct Qs8Rows<'a> {
    pub m: usize,
    pub stride: usize,
    pub data: &'a [i8],
}

/// `out[r * ldc + c] = requantize(bias'[c] + Σ_k a[r, k] · w[c, k])` for every row and
/// channel, on the best int8 kernel of this CPU.
pub fn gemm_qs8(
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    out: &mut [i8],
    ldc: usize,
) -> Result<(), LinalgError> {
    gemm_qs8_with(dispatch().quant, a, w, rq, out, ldc)
}

/// [`gemm_qs8`] with the kernels of `isa` (for tests and A/B measurements).
pub fn gemm_qs8_with(
    isa: Isa,
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    out: &mut [i8],
    ldc: usize,
) -> Result<(), LinalgError> {
    let (m, n, k) = (a.m, w.n, w.k);
    if m == 0 || n == 0 {
        return Ok(());
    }
    if a.stride < k || a.data.len() < (m - 1) * a.stride + k {
        return Err(LinalgError::ViewOutOfBounds {
            what: "qs8 GEMM activations",
            rows: m,
            cols: a.stride,
            len: a.data.len(),
        });
    }
    check_output(m, n, ldc, out.len())?;
    if rq.scales.len() < n {
        return Err(LinalgError::Shape(format!(
            "qs8 GEMM: {} requantization scales for {n} channels",
            rq.scales.len()
        )));
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni(t) => super::qs8_x86::gemm_avx512_vnni(t, a, w, rq, out, ldc),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => super::qs8_x86::gemm_avx2(t, a, w, rq, out, ldc),
        _ => gemm_qs8_scalar(a, w, rq, out, ldc),
    }
    Ok(())
}

/// Fails unless an output of `m` rows (`m >= 1`) of `n` values, `ldc` apart, fits in
/// `len` values (the last row holding only its `n`).
fn check_output(m: usize, n: usize, ldc: usize, len: usize) -> Result<(), LinalgError> {
    if ldc < n || len < (m - 1) * ldc + n {
        return Err(LinalgError::OutputTooSmall {
            what: "qs8 GEMM output",
            need: (m - 1) * ldc + n,
            len,
        });
    }
    Ok(())
}

/// The scalar twin: the same packed layout, one product at a time.
pub(crate) fn gemm_qs8_scalar(
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    out: &mut [i8],
    ldc: usize,
) {
    for p in 0..w.panels() {
        let data = w.panel_data(p);
        let bias = w.panel_bias(p, false);
        let lanes = (w.n - p * QS8_PANEL).min(QS8_PANEL);
        for r in 0..a.m {
            let row = &a.data[r * a.stride..r * a.stride + w.k];
            let mut acc = [0i32; QS8_PANEL];
            acc.copy_from_slice(bias);
            for (i, &x) in row.iter().enumerate() {
                let (t, j) = (i / GROUP, i % GROUP);
                let group = &data[t * QS8_PANEL * GROUP..(t + 1) * QS8_PANEL * GROUP];
                for (c, s) in acc.iter_mut().enumerate() {
                    *s += i32::from(x) * i32::from(group[c * GROUP + j]);
                }
            }
            let dst = &mut out[r * ldc + p * QS8_PANEL..r * ldc + p * QS8_PANEL + lanes];
            for (c, o) in dst.iter_mut().enumerate() {
                let ch = p * QS8_PANEL + c;
                *o = requantize(acc[c], rq.scales[ch], rq.zero_point, rq.min, rq.max);
            }
        }
    }
}

/// [`gemm_qs8`] over row blocks split between the pool's threads (`out` rows of
/// `ldc`).
pub fn gemm_qs8_parallel(
    pool: &ThreadPool,
    a: &Qs8Rows,
    w: &Qs8Weights,
    rq: &Qs8Requant,
    out: &mut [i8],
    ldc: usize,
) -> Result<(), LinalgError> {
    let (m, n) = (a.m, w.n);
    if m == 0 || n == 0 {
        return Ok(());
    }
    check_output(m, n, ldc, out.len())?;
    let rows = m.div_ceil(pool.threads()).max(1);
    // The last row holds only its `n` outputs (the caller's slice may end there).
    let out = &mut out[..(m - 1) * ldc + n];
    let failed = std::sync::atomic::AtomicBool::new(false);
    pool.for_each_chunk_mut(out, rows * ldc, 1, |t, chunk| {
        let r0 = t * rows;
        let nr = (chunk.len() + ldc - n) / ldc;
        let sub = Qs8Rows {
            m: nr,
            stride: a.stride,
            data: a.data.get(r0 * a.stride..).unwrap_or(&[]),
        };
        if gemm_qs8(&sub, w, rq, chunk, ldc).is_err() {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if failed.into_inner() {
        return Err(LinalgError::Shape("qs8 GEMM: a row block failed".into()));
    }
    Ok(())
}

/// Writes the im2col rows of output pixels `pixels` for group `group` of one int8 NHWC
/// image into `col` (rows of `stride >= patch_len()` values): taps in the padding read
/// the input zero point, so they add nothing to `Σ (q - zp) · w`. Returns `false` when
/// a slice is too short.
pub fn im2col_qs8(
    g: &ConvGeometry,
    input: &[i8],
    zero_point: i8,
    group: usize,
    pixels: Range<usize>,
    col: &mut [i8],
    stride: usize,
) -> bool {
    crate::conv::im2col_rows(g, input, group, pixels, col, stride, zero_point)
}

/// Direct depthwise convolution of one int8 NHWC image, output rows `rows` into `out`
/// (those rows only): filter `[kh, kw, channels]` (channel `c` reads input channel
/// `c / multiplier`), `acc = bias[c] + Σ_taps (q - zp_in) · w`, then
/// [`requantize`]. Returns `false` when a slice is too short.
#[allow(clippy::too_many_arguments)]
pub fn depthwise_conv2d_qs8(
    g: &ConvGeometry,
    input: &[i8],
    input_zero_point: i32,
    filter: &[i8],
    bias: &[i32],
    rq: &Qs8Requant,
    rows: Range<usize>,
    out: &mut [i8],
) -> bool {
    let co = g.out_channels();
    let ci = g.in_channels();
    let mult = g.group_out.max(1);
    if input.len() < g.in_h * g.in_w * ci
        || filter.len() < g.kernel_h * g.kernel_w * co
        || bias.len() < co
        || rq.scales.len() < co
        || out.len() < rows.len() * g.out_w * co
        || rows.end > g.out_h
    {
        return false;
    }
    if mult == 1 && g.kernel_h * g.kernel_w <= DEPTHWISE_MAX_TAPS {
        depthwise_unit_with(
            dispatch().quant,
            g,
            input,
            input_zero_point,
            filter,
            bias,
            rq,
            rows,
            out,
        );
        return true;
    }
    // Channels in blocks of CH accumulators on the stack (no allocation per call).
    const CH: usize = 64;
    for (r, oy) in rows.enumerate() {
        for ox in 0..g.out_w {
            let dst = &mut out[(r * g.out_w + ox) * co..(r * g.out_w + ox + 1) * co];
            for c0 in (0..co).step_by(CH) {
                let nc = (co - c0).min(CH);
                let mut acc = [0i32; CH];
                acc[..nc].copy_from_slice(&bias[c0..c0 + nc]);
                g.for_each_tap(oy, ox, |pixel, tap| {
                    let px = &input[pixel * ci..(pixel + 1) * ci];
                    let taps = &filter[tap * co + c0..][..nc];
                    for (j, (s, &wv)) in acc.iter_mut().zip(taps).enumerate() {
                        let x = i32::from(px[(c0 + j) / mult]) - input_zero_point;
                        *s += x * i32::from(wv);
                    }
                });
                for (j, (o, &s)) in dst[c0..c0 + nc].iter_mut().zip(&acc).enumerate() {
                    *o = requantize(s, rq.scales[c0 + j], rq.zero_point, rq.min, rq.max);
                }
            }
        }
    }
    true
}

/// [`depthwise_conv2d_qs8`] without a channel multiplier (every channel reads its own
/// input channel), the operands checked by the caller, compiled for `isa`'s vector
/// width: the same integer sums and requantization on every ISA.
#[allow(clippy::too_many_arguments)]
pub(crate) fn depthwise_unit_with(
    isa: Isa,
    g: &ConvGeometry,
    input: &[i8],
    zp: i32,
    filter: &[i8],
    bias: &[i32],
    rq: &Qs8Requant,
    rows: Range<usize>,
    out: &mut [i8],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(p) | Isa::Avx512Vnni(p) => {
            let _ = p;
            // SAFETY: the proof token says the CPU has AVX-512 F and BW.
            unsafe { depthwise_unit_avx512(g, input, zp, filter, bias, rq, rows, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(p) => {
            let _ = p;
            // SAFETY: the proof token says the CPU has AVX2.
            unsafe { depthwise_unit_avx2(g, input, zp, filter, bias, rq, rows, out) }
        }
        _ => depthwise_unit(g, input, zp, filter, bias, rq, rows, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
unsafe fn depthwise_unit_avx512(
    g: &ConvGeometry,
    input: &[i8],
    zp: i32,
    filter: &[i8],
    bias: &[i32],
    rq: &Qs8Requant,
    rows: Range<usize>,
    out: &mut [i8],
) {
    depthwise_unit(g, input, zp, filter, bias, rq, rows, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn depthwise_unit_avx2(
    g: &ConvGeometry,
    input: &[i8],
    zp: i32,
    filter: &[i8],
    bias: &[i32],
    rq: &Qs8Requant,
    rows: Range<usize>,
    out: &mut [i8],
) {
    depthwise_unit(g, input, zp, filter, bias, rq, rows, out)
}

/// The most kernel taps a window may have for the direct path below (a 5x5 kernel);
/// bigger kernels go through the multiplier loop of [`depthwise_conv2d_qs8`].
const DEPTHWISE_MAX_TAPS: usize = 25;

/// The depthwise kernel's body in plain Rust over fixed-size channel blocks, inlined
/// into each ISA's wrapper so that the compiler vectorizes it for that ISA. Per output
/// pixel, the taps inside the image are listed once; then each block of channels keeps
/// its sums in registers across them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn depthwise_unit(
    g: &ConvGeometry,
    input: &[i8],
    zp: i32,
    filter: &[i8],
    bias: &[i32],
    rq: &Qs8Requant,
    rows: Range<usize>,
    out: &mut [i8],
) {
    let c = g.out_channels();
    let lo = (i32::from(rq.min) - rq.zero_point) as f32;
    let hi = (i32::from(rq.max) - rq.zero_point) as f32;
    let requant = |dst: &mut [i8], acc: &[i32], c0: usize| {
        let scales = &rq.scales[c0..c0 + acc.len()];
        for ((o, &a), &scale) in dst.iter_mut().zip(acc).zip(scales) {
            let v = (a as f32 * scale).max(lo).min(hi);
            *o = (round_small(v) + rq.zero_point) as i8;
        }
    };
    let mut taps = [(0usize, 0usize); DEPTHWISE_MAX_TAPS];
    for (r, oy) in rows.enumerate() {
        for ox in 0..g.out_w {
            // (input offset, filter offset) of each tap inside the image.
            let mut n = 0;
            g.for_each_tap(oy, ox, |pixel, tap| {
                if let Some(t) = taps.get_mut(n) {
                    *t = (pixel * c, tap * c);
                    n += 1;
                }
            });
            let taps = &taps[..n];
            let at = (r * g.out_w + ox) * c;
            let dst = &mut out[at..at + c];
            let mut c0 = 0;
            while c0 + 64 <= c {
                let acc = depthwise_block::<64>(taps, input, filter, bias, zp, c0);
                requant(&mut dst[c0..c0 + 64], &acc, c0);
                c0 += 64;
            }
            while c0 + 16 <= c {
                let acc = depthwise_block::<16>(taps, input, filter, bias, zp, c0);
                requant(&mut dst[c0..c0 + 16], &acc, c0);
                c0 += 16;
            }
            for ch in c0..c {
                let mut a = bias[ch];
                for &(x, w) in taps {
                    a += (i32::from(input[x + ch]) - zp) * i32::from(filter[w + ch]);
                }
                requant(&mut dst[ch..ch + 1], &[a], ch);
            }
        }
    }
}

/// Sums of `B` channels from `c0` over the listed taps, bias first.
#[inline(always)]
fn depthwise_block<const B: usize>(
    taps: &[(usize, usize)],
    input: &[i8],
    filter: &[i8],
    bias: &[i32],
    zp: i32,
    c0: usize,
) -> [i32; B] {
    let mut acc = [0i32; B];
    acc.copy_from_slice(&bias[c0..c0 + B]);
    for &(x, w) in taps {
        let x = &input[x + c0..x + c0 + B];
        let w = &filter[w + c0..w + c0 + B];
        for j in 0..B {
            acc[j] += (i32::from(x[j]) - zp) * i32::from(w[j]);
        }
    }
    acc
}
