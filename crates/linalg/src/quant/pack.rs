//! Packing quantized weights into the panels the int8 kernels read.
//!
//! A panel holds 16 output channels (`PANEL`); inputs are padded to a multiple of 8
//! with the weight zero point (so padding contributes nothing). Within a panel:
//!
//! * 4-bit: for each group of 8 inputs `t`, 64 bytes; byte `4c + i` holds channel `c`'s
//!   code of input `8t + i` in its low nibble and of input `8t + 4 + i` in its high
//!   nibble, so masking the low nibbles gives one 4-input dot product per i32 lane and
//!   shifting gives the next. Each nibble is stored XOR 8 ([`NIBBLE_FLIP`]): read as the
//!   high half of a signed byte, a stored nibble is then `16 · (code - 8)`, the centred
//!   weight the VNNI kernels multiply, with one mask and no subtraction.
//! * 8-bit: for each group of 4 inputs `t`, 64 bytes; byte `4c + i` is channel `c`'s
//!   weight of input `4t + i` plus 128 (unsigned, for `vpdpbusd`).
//!
//! Scales are stored per panel and block, 16 lanes each (0 for padding channels).

use etch_memory::WeightBuffer;

use super::{PANEL, qd8_row_stride};
use crate::LinalgError;

/// What 4-bit codes are stored XORed with (both nibbles of a byte): `code ^ 8` is the
/// two's-complement nibble of `code - 8`.
pub(crate) const NIBBLE_FLIP: u8 = 0x88;

/// How many bits a weight code has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightBits {
    /// 4-bit codes `0..=15`, zero point 8 (XNNPACK's qc4w / qb4w).
    Four,
    /// int8 weights, zero point 0 (stored shifted to unsigned, zero point 128: qc8w).
    Eight,
}

impl WeightBits {
    /// The zero point of a stored (unsigned) code.
    pub fn zero_point(self) -> i32 {
        match self {
            WeightBits::Four => 8,
            WeightBits::Eight => 128,
        }
    }
}

/// The longest block of inputs summed in integers before scaling: the sum stays exact
/// in f32 (below 2^24) for either width.
const MAX_BLOCK: usize = 128;

/// A quantized `[n, k]` weight matrix packed for [`super::gemm_qd8`] (built once, at
/// load time).
#[derive(Clone, Debug)]
pub struct Qd8Weights {
    n: usize,
    k: usize,
    bits: WeightBits,
    /// Inputs per block (a multiple of 8).
    block: usize,
    blocks: usize,
    /// The panels; on huge pages when large (a decode step streams them whole).
    data: WeightBuffer<u8>,
    /// `[panel][block][PANEL]`.
    scales: Vec<f32>,
    /// The same scales as bf16 bits when every one is exactly a bf16 (block-quantized
    /// weights always are): half the scale traffic for the kernels that read them.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86 kernels only
    scales_bf16: Option<Vec<u16>>,
    /// `[panels * PANEL]`: `Σ_b scale[j, b] · Σ_{k in b} code[j, k]`.
    channel_sums: Vec<f32>,
    /// Whether the x86 VNNI kernels may scale a block's 16-fold 4-bit sum by `s / 16`
    /// instead of shifting it back (see [`Qd8Weights::sixteenth_scales_exact`]).
    sixteenth_scales_exact: bool,
}

impl Qd8Weights {
    /// Packs 4-bit weights: `code(j, c)` is the stored code (`0..=15`, zero point 8) of
    /// output `j`, input `c`; `scales` has `n * ceil(k / group)` values, row-major, one
    /// per output and group of `group` inputs (`group == k`: one per output channel).
    pub fn from_int4(
        n: usize,
        k: usize,
        group: usize,
        scales: &[f32],
        code: impl Fn(usize, usize) -> u8,
    ) -> Result<Qd8Weights, LinalgError> {
        Self::pack(n, k, group, scales, WeightBits::Four, |j, row| {
            for (c, r) in row.iter_mut().enumerate() {
                *r = code(j, c) & 0xf;
            }
        })
    }

    /// [`Qd8Weights::from_int4`] for codes stored two per byte, low nibble first, each
    /// output's `k` codes in `ceil(k / 2)` bytes (XNNPACK's and ExecuTorch's layout of
    /// 4-bit weights): decoded a byte at a time, not a code at a time.
    pub fn from_int4_nibbles(
        n: usize,
        k: usize,
        group: usize,
        scales: &[f32],
        bytes: &[u8],
    ) -> Result<Qd8Weights, LinalgError> {
        let row_bytes = k.div_ceil(2);
        if n.checked_mul(row_bytes).is_none_or(|len| bytes.len() < len) {
            return Err(LinalgError::ViewOutOfBounds {
                what: "4-bit weights",
                rows: n,
                cols: k,
                len: bytes.len(),
            });
        }
        Self::pack(n, k, group, scales, WeightBits::Four, |j, row| {
            let src = &bytes[j * row_bytes..][..row_bytes];
            let mut pairs = row.chunks_exact_mut(2);
            for (pair, &b) in (&mut pairs).zip(src) {
                pair[0] = b & 0xf;
                pair[1] = b >> 4;
            }
            if let ([last], Some(&b)) = (pairs.into_remainder(), src.last()) {
                *last = b & 0xf;
            }
        })
    }

    /// Packs int8 weights `values` (`[n, k]` row-major, zero point 0) with one scale
    /// per output channel.
    pub fn from_int8(
        n: usize,
        k: usize,
        values: &[i8],
        scales: &[f32],
    ) -> Result<Qd8Weights, LinalgError> {
        if values.len() < n * k {
            return Err(LinalgError::ViewOutOfBounds {
                what: "int8 weights",
                rows: n,
                cols: k,
                len: values.len(),
            });
        }
        Self::pack(n, k, k, scales, WeightBits::Eight, |j, row| {
            for (r, &v) in row.iter_mut().zip(&values[j * k..(j + 1) * k]) {
                *r = (i32::from(v) + 128) as u8;
            }
        })
    }

    fn pack(
        n: usize,
        k: usize,
        group: usize,
        scales: &[f32],
        bits: WeightBits,
        codes: impl Fn(usize, &mut [u8]),
    ) -> Result<Qd8Weights, LinalgError> {
        if group == 0 || k == 0 {
            return Err(LinalgError::Shape(format!(
                "quantized weights: {n} x {k} in groups of {group}"
            )));
        }
        let groups = k.div_ceil(group);
        if scales.len() != n * groups {
            return Err(LinalgError::Shape(format!(
                "quantized weights: {} scales for {n} x {k} in groups of {group}",
                scales.len()
            )));
        }
        let k_pad = qd8_row_stride(k);
        let block = if group >= k {
            MAX_BLOCK.min(k_pad)
        } else if group.is_multiple_of(8) && group <= 4096 {
            group
        } else {
            return Err(LinalgError::Shape(format!(
                "quantized weights: group size {group} is not a multiple of 8 (or above 4096)"
            )));
        };
        let blocks = k_pad.div_ceil(block);
        let panels = n.div_ceil(PANEL);
        let zero = bits.zero_point() as u8;
        let panel_bytes = match bits {
            WeightBits::Four => k_pad * PANEL / 2,
            WeightBits::Eight => k_pad * PANEL,
        };
        let mut data = WeightBuffer::<u8>::zeroed(panels * panel_bytes)?;
        let mut scale_data = vec![0f32; panels * blocks * PANEL];
        let mut channel_sums = vec![0f32; panels * PANEL];
        // One channel at a time: its codes decoded once into `row` (padding at the zero
        // point), then scattered into the panel layout and summed per block.
        let mut row = vec![zero; k_pad];
        for j in 0..n {
            let (p, c) = (j / PANEL, j % PANEL);
            codes(j, &mut row[..k]);
            let dst = &mut data[p * panel_bytes..][..panel_bytes];
            match bits {
                WeightBits::Four => {
                    for (t, group) in dst.chunks_exact_mut(4 * PANEL).enumerate() {
                        let src = &row[8 * t..8 * t + 8];
                        for i in 0..4 {
                            group[4 * c + i] = (src[i] | (src[4 + i] << 4)) ^ NIBBLE_FLIP;
                        }
                    }
                }
                WeightBits::Eight => {
                    for (t, group) in dst.chunks_exact_mut(4 * PANEL).enumerate() {
                        group[4 * c..4 * c + 4].copy_from_slice(&row[4 * t..4 * t + 4]);
                    }
                }
            }
            // XNNPACK's packed "k scaled sum": minus the scaled sums of the centred
            // weights, block by block in f32 (google/XNNPACK
            // `src/qb4-packw/gen/qb4-packw-x16c8-gemm-goi-scalar.c`).
            let mut sum = 0f32;
            for b in 0..blocks {
                let start = b * block;
                let s = scales[j * groups + (start / group).min(groups - 1)];
                scale_data[(p * blocks + b) * PANEL + c] = s;
                let centred: i32 = row[start..(start + block).min(k_pad)]
                    .iter()
                    .map(|&u| i32::from(u) - i32::from(zero))
                    .sum();
                sum -= centred as f32 * s;
            }
            channel_sums[j] = sum;
        }
        // Channels past n in the last panel: zero-point codes (their sums stay 0).
        for j in n..panels * PANEL {
            let (p, c) = (j / PANEL, j % PANEL);
            let dst = &mut data[p * panel_bytes..][..panel_bytes];
            let fill = match bits {
                WeightBits::Four => (zero | (zero << 4)) ^ NIBBLE_FLIP,
                WeightBits::Eight => zero,
            };
            for group in dst.chunks_exact_mut(4 * PANEL) {
                group[4 * c..4 * c + 4].fill(fill);
            }
        }
        Ok(Qd8Weights {
            n,
            k,
            bits,
            block,
            blocks,
            data,
            scales_bf16: scale_data
                .iter()
                .all(|s| s.to_bits() & 0xffff == 0)
                .then(|| {
                    scale_data
                        .iter()
                        .map(|s| (s.to_bits() >> 16) as u16)
                        .collect()
                }),
            sixteenth_scales_exact: bits == WeightBits::Four
                && block * 255 * 128 < 1 << 24
                && scale_data
                    .iter()
                    .all(|s| *s == 0.0 || !s.is_finite() || s.abs() >= f32::MIN_POSITIVE * 16.0),
            scales: scale_data,
            channel_sums,
        })
    }

    /// The packed code bytes (for tests that compare two packings).
    #[cfg(test)]
    pub(crate) fn packed_codes(&self) -> &[u8] {
        &self.data
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inputs per output channel.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The code width.
    pub fn bits(&self) -> WeightBits {
        self.bits
    }

    /// Inputs per block summed in integers (a multiple of 8).
    pub fn block(&self) -> usize {
        self.block
    }

    /// Blocks per row of padded inputs.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Panels of 16 output channels.
    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Bytes of packed data (codes, scales and channel sums).
    pub fn packed_bytes(&self) -> usize {
        self.data.len() + 4 * (self.scales.len() + self.channel_sums.len())
    }

    /// The codes of panel `p`.
    pub(crate) fn panel_data(&self, p: usize) -> &[u8] {
        let len = self.data.len() / self.panels().max(1);
        &self.data[p * len..(p + 1) * len]
    }

    /// The `[block][PANEL]` scales of panel `p`.
    pub(crate) fn panel_scales(&self, p: usize) -> &[f32] {
        &self.scales[p * self.blocks * PANEL..(p + 1) * self.blocks * PANEL]
    }

    /// The `[block][PANEL]` scales of panel `p` as bf16 bits, when they all are bf16.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86 kernels only
    pub(crate) fn panel_scales_bf16(&self, p: usize) -> Option<&[u16]> {
        let n = self.blocks * PANEL;
        self.scales_bf16.as_ref().map(|s| &s[p * n..(p + 1) * n])
    }

    /// `Σ_b scale · Σ code` per (padded) output channel.
    /// For 4-bit weights: whether `cvt(16·S) · (s / 16)` is `cvt(S) · s` exactly for
    /// every block sum `S` and scale `s`: the 16-fold sums (unsigned activations up to
    /// 255 times nibbles up to 128 in magnitude, over one block) convert to f32 exactly,
    /// and no scale becomes subnormal when divided by 16.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86 kernels only
    pub(crate) fn sixteenth_scales_exact(&self) -> bool {
        self.sixteenth_scales_exact
    }

    /// The same weights with the 16-fold sums shifted back instead (the tests' check
    /// that both forms give the same bits).
    #[cfg(test)]
    pub(crate) fn with_shifted_sums(&self) -> Qd8Weights {
        Qd8Weights {
            sixteenth_scales_exact: false,
            ..self.clone()
        }
    }

    pub(crate) fn channel_sums(&self) -> &[f32] {
        &self.channel_sums
    }

    /// The length of block `b` (the last one may be shorter).
    pub(crate) fn block_len(&self, b: usize) -> usize {
        self.block.min(qd8_row_stride(self.k) - b * self.block)
    }
}
