//! x86 int8 panel kernels: AVX-512 VNNI (`vpdpbusd`: 64 unsigned-by-signed byte
//! products summed into 16 i32 lanes) and AVX2 (`vpmaddubsw` + `vpmaddwd`, 4-bit codes
//! only: their products cannot saturate the 16-bit pair sums).
//!
//! Lane `c` of every vector is output channel `c` of the panel; an activation group of
//! 4 bytes is broadcast to all lanes.

use std::arch::x86_64::*;

use super::kernels::check_panel_operands;
use super::pack::NIBBLE_FLIP;
use super::{PANEL, Qd8Rows, Qd8Weights, WeightBits, qd8_row_stride};
use crate::CpuSupport;

/// Rows per AVX-512 tile (8 rows x 16 channels: 16 accumulators; the weight codes
/// unpacked once per step feed 16 `vpdpbusd`).
const ROWS_AVX512: usize = 8;
/// Rows per tile of the AVX-512 row kernel, which writes finished outputs (12 rows x
/// 16 channels: 12 integer and 12 float accumulators; the unpacked weight codes feed
/// 24 `vpdpbusd` per step, and 12 independent chains hide their latency).
const ROWS_OUT_TILE: usize = 12;
/// Rows per AVX2 tile (2 rows x 16 channels as two halves: 12 accumulators).
const ROWS_AVX2: usize = 2;

/// [`check_panel_operands`], plus the row terms the AVX2 tile reads.
fn check(a: &Qd8Rows, w: &Qd8Weights, row_terms: &[f32], p: usize, acc: &[f32]) {
    check_panel_operands(a, w, p, acc);
    assert!(row_terms.len() >= a.m * w.blocks());
}

/// One panel for every row, on AVX-512 VNNI, reading the activation rows as unsigned
/// bytes (`unsigned[r * stride + k] = q[r, k] + 128`).
pub(super) fn panel_avx512_vnni(
    _proof: CpuSupport,
    a: &Qd8Rows,
    w: &Qd8Weights,
    unsigned: &[u8],
    p: usize,
    acc: &mut [f32],
) {
    check_panel_operands(a, w, p, acc);
    assert!(unsigned.len() >= a.m * qd8_row_stride(w.k()));
    let mut r = 0;
    while r < a.m {
        let rows = (a.m - r).min(ROWS_AVX512);
        // SAFETY: the proof says the CPU has AVX-512 F/BW/VL and VNNI; the checks above
        // showed that rows r..r+rows of the unsigned activations, the panel's codes and
        // scales and the accumulators hold everything the tile reads and writes.
        unsafe {
            match rows {
                8 => tile_avx512::<8>(unsigned, w, p, r, acc),
                7 => tile_avx512::<7>(unsigned, w, p, r, acc),
                6 => tile_avx512::<6>(unsigned, w, p, r, acc),
                5 => tile_avx512::<5>(unsigned, w, p, r, acc),
                4 => tile_avx512::<4>(unsigned, w, p, r, acc),
                3 => tile_avx512::<3>(unsigned, w, p, r, acc),
                2 => tile_avx512::<2>(unsigned, w, p, r, acc),
                _ => tile_avx512::<1>(unsigned, w, p, r, acc),
            }
        }
        r += rows;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_avx512<const R: usize>(
    unsigned: &[u8],
    w: &Qd8Weights,
    p: usize,
    r0: usize,
    acc: &mut [f32],
) {
    let mut facc = [_mm512_setzero_ps(); R];
    for (r, f) in facc.iter_mut().enumerate() {
        // SAFETY: `check_panel_operands` showed acc holds the tile's rows of PANEL f32.
        *f = unsafe { _mm512_loadu_ps(acc.as_ptr().add((r0 + r) * PANEL)) };
    }
    // SAFETY: as this function's (the caller checked the rows and the panel).
    unsafe { tile_blocks::<R>(unsigned, w, p, r0, &mut facc) };
    for (r, f) in facc.iter().enumerate() {
        let dst = &mut acc[(r0 + r) * PANEL..(r0 + r + 1) * PANEL];
        // SAFETY: dst holds PANEL = 16 f32.
        unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), *f) };
    }
}

/// Adds `Σ_b s · Σ (q + 128)(u - o)` of rows `r0 .. r0 + R` against panel `p` to
/// `facc` (one register of 16 channels per row), block after block.
///
/// # Safety
///
/// The CPU must have AVX-512 F/BW/VL and VNNI; rows `r0 .. r0 + R` of `unsigned` (each
/// `qd8_row_stride(k)` bytes) and panel `p`'s codes and scales must exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_blocks<const R: usize>(
    unsigned: &[u8],
    w: &Qd8Weights,
    p: usize,
    r0: usize,
    facc: &mut [__m512; R],
) {
    // XNNPACK's VNNI kernels multiply unsigned activations (`q + 128`, the "qdu8"
    // form) by signed weights (`u - o`): `vpdpbusd` then yields `Σ (q + 128)(u - o)`
    // directly, and the accumulators start at `(zp + 128) · K` (see `unsigned_offset`).
    let stride = qd8_row_stride(w.k());
    let blocks = w.blocks();
    let data = w.panel_data(p).as_ptr();
    let scales = w.panel_scales(p).as_ptr();
    let scales_bf16 = w.panel_scales_bf16(p).map(|s| s.as_ptr());
    let q = unsigned[r0 * stride..].as_ptr();
    let high = _mm512_set1_epi8(0xf0_u8 as i8);
    let flip = _mm512_set1_epi8(-128);
    // Four unsigned activations, broadcast to every lane (one load).
    let group = |qp: *const u8| -> __m512i {
        // SAFETY: callers pass a pointer with 4 readable bytes (inside the padded row).
        _mm512_set1_epi32(unsafe { qp.cast::<i32>().read_unaligned() })
    };
    // 4-bit sums come out 16 x the centred ones (each nibble sits in a byte's high
    // half). Where the packer found it exact, the block's scale is divided by 16 once
    // instead of every row's sum shifted back: the fused product is the same real number
    // (both operands exact), so the result is the same to the bit.
    let sixteenth = w.bits() == WeightBits::Four && w.sixteenth_scales_exact();
    let shift = w.bits() == WeightBits::Four && !sixteenth;
    let mut start = 0;
    for b in 0..blocks {
        let len = w.block_len(b);
        // One accumulator per row: the rows are the independent `vpdpbusd` chains.
        let mut iacc = [_mm512_setzero_si512(); R];
        // SAFETY (whole block): inputs start..start+len lie within the padded row
        // (stride), whose codes occupy stride * 8 (4-bit) or stride * 16 (8-bit) bytes.
        unsafe {
            match w.bits() {
                WeightBits::Four => {
                    let mut kk = start;
                    while kk < start + len {
                        // 16 x the centred weights (the nibbles are stored XOR 8).
                        let v = _mm512_loadu_si512(data.add(kk * 8).cast());
                        let lo = _mm512_and_si512(_mm512_slli_epi16::<4>(v), high);
                        let hi = _mm512_and_si512(v, high);
                        for (r, acc) in iacc.iter_mut().enumerate() {
                            let qp = q.add(r * stride + kk);
                            *acc = _mm512_dpbusd_epi32(*acc, group(qp), lo);
                            *acc = _mm512_dpbusd_epi32(*acc, group(qp.add(4)), hi);
                        }
                        kk += 8;
                    }
                }
                WeightBits::Eight => {
                    let mut kk = start;
                    while kk < start + len {
                        let v =
                            _mm512_xor_si512(_mm512_loadu_si512(data.add(kk * 16).cast()), flip);
                        for (r, acc) in iacc.iter_mut().enumerate() {
                            let qp = q.add(r * stride + kk);
                            *acc = _mm512_dpbusd_epi32(*acc, group(qp), v);
                        }
                        kk += 4;
                    }
                }
            }
            let s = match scales_bf16 {
                // bf16 -> f32 is exact: the bits shifted into the high half.
                Some(h) => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                    _mm256_loadu_si256(h.add(b * PANEL).cast()),
                ))),
                None => _mm512_loadu_ps(scales.add(b * PANEL)),
            };
            let s = if sixteenth {
                _mm512_mul_ps(s, _mm512_set1_ps(1.0 / 16.0))
            } else {
                s
            };
            for (f, &sum) in facc.iter_mut().zip(&iacc) {
                let sum = if shift {
                    _mm512_srai_epi32::<4>(sum)
                } else {
                    sum
                };
                *f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, *f);
            }
        }
        start += len;
    }
}

/// The finished outputs of activation rows `first .. first + out.len() / n` against
/// every panel, on AVX-512 VNNI: each tile of up to eight rows starts at the zero-point
/// term, adds the blocks ([`tile_blocks`]) and is dequantized, biased, clamped and
/// stored straight into `out` (row-major, `n = w.n()` per row). The same arithmetic, in
/// the same order, as the per-panel tiles followed by `gemm_qd8_with`'s epilogue, with
/// no panel accumulators in between: prefill's product on this CPU.
#[allow(clippy::too_many_arguments)]
pub(super) fn rows_avx512_vnni(
    _proof: CpuSupport,
    a: &Qd8Rows,
    w: &Qd8Weights,
    unsigned: &[u8],
    bias: Option<&[f32]>,
    (min, max): (f32, f32),
    first: usize,
    out: &mut [f32],
) {
    let n = w.n();
    let panels = w.panels();
    if n == 0 || panels == 0 {
        return;
    }
    let rows = out.len() / n;
    let stride = qd8_row_stride(w.k());
    assert!(first + rows <= a.m && a.params.len() >= 2 * a.m);
    assert!(unsigned.len() >= a.m * stride && w.block().is_multiple_of(8));
    assert!(w.channel_sums().len() >= panels * PANEL);
    assert!(bias.is_none_or(|b| b.len() >= n));
    // Every panel's codes and scales have the same length: the last one is checked.
    let per_input = match w.bits() {
        WeightBits::Four => PANEL / 2,
        WeightBits::Eight => PANEL,
    };
    assert!(w.panel_data(panels - 1).len() >= stride * per_input);
    assert!(w.panel_scales(panels - 1).len() >= w.blocks() * PANEL);
    let job = RowsJob {
        a,
        w,
        unsigned,
        bias,
        min,
        max,
        first,
    };
    let mut r = 0;
    while r < rows {
        let tile = (rows - r).min(ROWS_OUT_TILE);
        for p in 0..panels {
            // SAFETY: the proof says the CPU has AVX-512 F/BW/VL and VNNI; the checks
            // above showed that rows first + r .. + tile of the unsigned activations and
            // their parameters, panel p's codes, scales and channel sums, the bias and
            // the output rows r .. r + tile hold everything the tile reads and writes.
            unsafe {
                match tile {
                    12 => out_tile::<12>(&job, r, p, out),
                    11 => out_tile::<11>(&job, r, p, out),
                    10 => out_tile::<10>(&job, r, p, out),
                    9 => out_tile::<9>(&job, r, p, out),
                    8 => out_tile::<8>(&job, r, p, out),
                    7 => out_tile::<7>(&job, r, p, out),
                    6 => out_tile::<6>(&job, r, p, out),
                    5 => out_tile::<5>(&job, r, p, out),
                    4 => out_tile::<4>(&job, r, p, out),
                    3 => out_tile::<3>(&job, r, p, out),
                    2 => out_tile::<2>(&job, r, p, out),
                    _ => out_tile::<1>(&job, r, p, out),
                }
            }
        }
        r += tile;
    }
}

/// What every tile of one [`rows_avx512_vnni`] call reads.
struct RowsJob<'a> {
    a: &'a Qd8Rows<'a>,
    w: &'a Qd8Weights,
    unsigned: &'a [u8],
    bias: Option<&'a [f32]>,
    min: f32,
    max: f32,
    /// Activation row of output row 0.
    first: usize,
}

/// One tile of [`rows_avx512_vnni`]: output rows `r .. r + R` (activation rows
/// `job.first + r ..`), channels of panel `p`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn out_tile<const R: usize>(job: &RowsJob<'_>, r: usize, p: usize, out: &mut [f32]) {
    let RowsJob {
        a,
        w,
        unsigned,
        bias,
        min,
        max,
        first,
    } = *job;
    let n = w.n();
    let c0 = p * PANEL;
    let width = (n - c0).min(PANEL);
    // Lanes of this panel's real channels (the last panel may be partial).
    let mask: __mmask16 = if width == PANEL {
        0xffff
    } else {
        (1u16 << width) - 1
    };
    // SAFETY (whole tile): as the caller's checks say; loads past a partial panel's
    // channels are masked.
    unsafe {
        let sums = _mm512_loadu_ps(w.channel_sums().as_ptr().add(c0));
        let mut facc = [_mm512_setzero_ps(); R];
        for (i, f) in facc.iter_mut().enumerate() {
            // The accumulators start at the zero-point term `(zp + 128) · K`.
            let zp = a.params[2 * (first + r + i) + 1] + 128.0;
            *f = _mm512_mul_ps(sums, _mm512_set1_ps(zp));
        }
        tile_blocks::<R>(unsigned, w, p, first + r, &mut facc);
        let b = match bias {
            Some(b) => _mm512_maskz_loadu_ps(mask, b.as_ptr().add(c0)),
            None => _mm512_setzero_ps(),
        };
        let (lo, hi) = (_mm512_set1_ps(min), _mm512_set1_ps(max));
        for (i, f) in facc.iter().enumerate() {
            let d = _mm512_set1_ps(a.params[2 * (first + r + i)]);
            // (s · d + b), then max with min and min with max, as the scalar epilogue.
            let y = _mm512_add_ps(_mm512_mul_ps(*f, d), b);
            let y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
            _mm512_mask_storeu_ps(out.as_mut_ptr().add((r + i) * n + c0), mask, y);
        }
    }
}

/// One activation row against panels `first..first + acc.len() / PANEL` of 4-bit
/// weights, on AVX-512 VNNI: the decode step of an 8da4w linear layer. The same
/// arithmetic as [`tile_avx512`] (the unsigned "qdu8" form), with the activations
/// already unsigned (`unsigned_row[k] = q[k] + 128`, so each group of four is one
/// broadcast load), the accumulators started at the zero-point term here, and the
/// panels walked in one loop, so the weight codes stream without a call per panel.
pub(super) fn row_panels_avx512_vnni(
    _proof: CpuSupport,
    a: &Qd8Rows,
    w: &Qd8Weights,
    unsigned_row: &[u8],
    first: usize,
    acc: &mut [f32],
) {
    let count = acc.len() / PANEL;
    assert!(a.m == 1 && w.bits() == WeightBits::Four && first + count <= w.panels());
    if count == 0 {
        return;
    }
    let stride = qd8_row_stride(w.k());
    assert!(unsigned_row.len() >= stride && w.block().is_multiple_of(8));
    assert!(w.panel_data(first).len() >= stride * PANEL / 2);
    assert!(w.panel_scales(first).len() >= w.blocks() * PANEL);
    assert!(w.channel_sums().len() >= (first + count) * PANEL && a.params.len() >= 2);
    // SAFETY: the proof says the CPU has AVX-512 F/BW/VL and VNNI; the checks above
    // showed that the row and every panel's codes and scales (all panels have the same
    // length), the channel sums and the accumulators hold everything the loop reads
    // and writes.
    unsafe { row_panels_avx512_vnni_impl(a, w, unsigned_row, first, acc) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn row_panels_avx512_vnni_impl(
    a: &Qd8Rows,
    w: &Qd8Weights,
    unsigned_row: &[u8],
    first: usize,
    acc: &mut [f32],
) {
    let blocks = w.blocks();
    let q = unsigned_row.as_ptr();
    let high = _mm512_set1_epi8(0xf0_u8 as i8);
    let zp = _mm512_set1_ps(a.params[1] + 128.0);
    let group = |qp: *const u8| -> __m512i {
        // SAFETY: callers pass a pointer with 4 readable bytes (inside the padded row).
        _mm512_set1_epi32(unsafe { qp.cast::<i32>().read_unaligned() })
    };
    for (i, out) in acc.chunks_exact_mut(PANEL).enumerate() {
        let p = first + i;
        let data = w.panel_data(p).as_ptr();
        let scales = w.panel_scales(p).as_ptr();
        let scales_bf16 = w.panel_scales_bf16(p).map(|s| s.as_ptr());
        // SAFETY (whole panel): as in `tile_avx512` for one row; the channel sums of
        // panel p are PANEL floats inside `channel_sums` (checked by the caller).
        unsafe {
            let mut f = _mm512_mul_ps(
                _mm512_loadu_ps(w.channel_sums().as_ptr().add(p * PANEL)),
                zp,
            );
            let mut start = 0;
            for b in 0..blocks {
                let len = w.block_len(b);
                let mut iacc = [_mm512_setzero_si512(); 2];
                let mut kk = start;
                while kk < start + len {
                    // 16 x the centred weights (the nibbles are stored XOR 8).
                    let v = _mm512_loadu_si512(data.add(kk * 8).cast());
                    let lo = _mm512_and_si512(_mm512_slli_epi16::<4>(v), high);
                    let hi = _mm512_and_si512(v, high);
                    let qp = q.add(kk);
                    iacc[0] = _mm512_dpbusd_epi32(iacc[0], group(qp), lo);
                    iacc[1] = _mm512_dpbusd_epi32(iacc[1], group(qp.add(4)), hi);
                    kk += 8;
                }
                let s = match scales_bf16 {
                    Some(h) => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                        _mm256_loadu_si256(h.add(b * PANEL).cast()),
                    ))),
                    None => _mm512_loadu_ps(scales.add(b * PANEL)),
                };
                // 16 x the centred block sum: an exact shift back.
                let sum = _mm512_srai_epi32::<4>(_mm512_add_epi32(iacc[0], iacc[1]));
                f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, f);
                start += len;
            }
            _mm512_storeu_ps(out.as_mut_ptr(), f);
        }
    }
}

/// One panel for every row, on AVX2 (4-bit codes).
pub(super) fn panel_avx2(
    _proof: CpuSupport,
    a: &Qd8Rows,
    w: &Qd8Weights,
    row_terms: &[f32],
    p: usize,
    acc: &mut [f32],
) {
    check(a, w, row_terms, p, acc);
    assert!(w.bits() == WeightBits::Four);
    let mut r = 0;
    while r < a.m {
        let rows = (a.m - r).min(ROWS_AVX2);
        // SAFETY: the proof says the CPU has AVX2 and FMA; `check` showed that every
        // operand the tile reads and writes is in bounds.
        unsafe {
            match rows {
                2 => tile_avx2::<2>(a, w, row_terms, p, r, acc),
                _ => tile_avx2::<1>(a, w, row_terms, p, r, acc),
            }
        }
        r += rows;
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(
    a: &Qd8Rows,
    w: &Qd8Weights,
    row_terms: &[f32],
    p: usize,
    r0: usize,
    acc: &mut [f32],
) {
    let stride = qd8_row_stride(w.k());
    let blocks = w.blocks();
    let data = w.panel_data(p).as_ptr();
    let scales = w.panel_scales(p).as_ptr();
    let q = a.q[r0 * stride..].as_ptr();
    let low = _mm256_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(NIBBLE_FLIP as i8);
    let ones = _mm256_set1_epi16(1);
    let mut facc = [[_mm256_setzero_ps(); 2]; R];
    for (r, f) in facc.iter_mut().enumerate() {
        // SAFETY: `check` showed acc holds the tile's rows of PANEL = 16 f32.
        unsafe {
            let src = acc.as_ptr().add((r0 + r) * PANEL);
            *f = [_mm256_loadu_ps(src), _mm256_loadu_ps(src.add(8))];
        }
    }
    let mut start = 0;
    for b in 0..blocks {
        let len = w.block_len(b);
        let mut iacc = [[_mm256_setzero_si256(); 2]; R];
        // SAFETY (whole block): as in the AVX-512 tile, inputs start..start+len lie in
        // the padded row and the panel's 4-bit codes (stride * 8 bytes).
        unsafe {
            let mut kk = start;
            while kk < start + len {
                // Up to 32 inputs in 16-bit sums: 8 products of at most 15 x 128 each
                // pair, 30720 < 32767, so the sums cannot saturate.
                let end = (kk + 32).min(start + len);
                let mut pairs = [[_mm256_setzero_si256(); 2]; R];
                while kk < end {
                    // The stored nibbles are XOR 8: flip them back to the codes.
                    let v0 = _mm256_xor_si256(_mm256_loadu_si256(data.add(kk * 8).cast()), flip);
                    let v1 =
                        _mm256_xor_si256(_mm256_loadu_si256(data.add(kk * 8 + 32).cast()), flip);
                    let lo = [_mm256_and_si256(v0, low), _mm256_and_si256(v1, low)];
                    let hi = [
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v0), low),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v1), low),
                    ];
                    for (r, pair) in pairs.iter_mut().enumerate() {
                        let qp = q.add(r * stride + kk);
                        let a0 = _mm256_set1_epi32(qp.cast::<i32>().read_unaligned());
                        let a1 = _mm256_set1_epi32(qp.add(4).cast::<i32>().read_unaligned());
                        for h in 0..2 {
                            let s = _mm256_add_epi16(
                                _mm256_maddubs_epi16(lo[h], a0),
                                _mm256_maddubs_epi16(hi[h], a1),
                            );
                            pair[h] = _mm256_add_epi16(pair[h], s);
                        }
                    }
                    kk += 8;
                }
                for (i, pair) in iacc.iter_mut().zip(&pairs) {
                    for h in 0..2 {
                        i[h] = _mm256_add_epi32(i[h], _mm256_madd_epi16(pair[h], ones));
                    }
                }
            }
            for h in 0..2 {
                let s = _mm256_loadu_ps(scales.add(b * PANEL + 8 * h));
                for (r, (f, i)) in facc.iter_mut().zip(&iacc).enumerate() {
                    let term = _mm256_set1_ps(row_terms[(r0 + r) * blocks + b]);
                    let t = _mm256_add_ps(_mm256_cvtepi32_ps(i[h]), term);
                    f[h] = _mm256_fmadd_ps(t, s, f[h]);
                }
            }
        }
        start += len;
    }
    for (r, f) in facc.iter().enumerate() {
        let dst = &mut acc[(r0 + r) * PANEL..(r0 + r + 1) * PANEL];
        // SAFETY: dst holds PANEL = 16 f32, two vectors of 8.
        unsafe {
            _mm256_storeu_ps(dst.as_mut_ptr(), f[0]);
            _mm256_storeu_ps(dst.as_mut_ptr().add(8), f[1]);
        }
    }
}

/// The smallest and largest value of a row (AVX-512 F), as the scalar fold computes
/// them for finite values.
pub(super) fn row_min_max(_proof: CpuSupport, xs: &[f32]) -> (f32, f32) {
    // SAFETY: the proof says the CPU has AVX-512 F.
    unsafe { row_min_max_impl(xs) }
}

#[target_feature(enable = "avx512f")]
unsafe fn row_min_max_impl(xs: &[f32]) -> (f32, f32) {
    let mut lo = _mm512_set1_ps(f32::INFINITY);
    let mut hi = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut chunks = xs.chunks_exact(16);
    for c in &mut chunks {
        // SAFETY: the chunk holds 16 f32.
        let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
    }
    let (mut l, mut h) = (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
    for &v in chunks.remainder() {
        l = l.min(v);
        h = h.max(v);
    }
    (l, h)
}

/// `q = clamp(rint(x · scale) + zp, -128, 127)` for one row (AVX-512 F; `vcvtps2dq`
/// rounds to nearest-even, as `lrintf`).
pub(super) fn quantize_row(_proof: CpuSupport, xs: &[f32], scale: f32, zp: f32, qs: &mut [i8]) {
    // SAFETY: the proof says the CPU has AVX-512 F.
    unsafe { quantize_row_impl(xs, scale, zp, qs) }
}

#[target_feature(enable = "avx512f")]
unsafe fn quantize_row_impl(xs: &[f32], scale: f32, zp: f32, qs: &mut [i8]) {
    let vs = _mm512_set1_ps(scale);
    let vz = _mm512_set1_epi32(zp as i32);
    let (lo, hi) = (_mm512_set1_epi32(-128), _mm512_set1_epi32(127));
    let n = xs.len().min(qs.len());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n elements of xs and qs.
        unsafe {
            let v = _mm512_mul_ps(_mm512_loadu_ps(xs.as_ptr().add(i)), vs);
            let q = _mm512_add_epi32(_mm512_cvtps_epi32(v), vz);
            let q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
            _mm_storeu_si128(qs.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi8(q));
        }
        i += 16;
    }
    super::quantize_row_scalar(&xs[i..n], scale, zp, &mut qs[i..n]);
}
