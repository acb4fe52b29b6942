//! The AVX2 + FMA (+ F16C) entry points of the x86-64 GEMM kernels (`x86`, 8-lane
//! vectors), and the packing and finishing loops compiled for AVX2.

use std::arch::x86_64::*;

use super::x86;
use crate::simd_x86::Narrow;

/// Rows of the tile.
const MR: usize = 6;

x86::entry_points!(Narrow, MR, "avx2,fma", "avx2,fma,f16c");

/// [`super::finish_tiles`] compiled with AVX2 and FMA.
pub(super) fn finish_tiles<O: super::OutElem>(
    _: CpuSupport,
    g: &super::Gemm<'_>,
    t: &super::TileRows<'_>,
    first: usize,
    chunk: &mut [O],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run<O: super::OutElem>(
        g: &super::Gemm<'_>,
        t: &super::TileRows<'_>,
        first: usize,
        chunk: &mut [O],
    ) {
        super::finish_tiles_body(g, t, first, chunk)
    }
    // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
    unsafe { run(g, t, first, chunk) }
}

/// [`super::pack_a_panel_elems`] compiled with AVX2 and FMA.
pub(super) fn pack_a_panel(
    _: CpuSupport,
    mr: usize,
    a: &super::MatRef<'_>,
    row0: usize,
    rows: usize,
    panel: &mut [f32],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(mr: usize, a: &super::MatRef<'_>, row0: usize, rows: usize, panel: &mut [f32]) {
        super::pack_a_panel_elems(mr, a, row0, rows, panel)
    }
    // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
    unsafe { run(mr, a, row0, rows, panel) }
}

/// [`super::pack_b_elems`] compiled with AVX2 and FMA.
pub(super) fn pack_b(
    _: CpuSupport,
    nr: usize,
    b: &super::MatRef<'_>,
    ks: (usize, usize),
    cs: (usize, usize),
    dst: &mut [f32],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(
        nr: usize,
        b: &super::MatRef<'_>,
        ks: (usize, usize),
        cs: (usize, usize),
        dst: &mut [f32],
    ) {
        super::pack_b_elems(nr, b, ks, cs, dst)
    }
    // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
    unsafe { run(nr, b, ks, cs, dst) }
}

/// Packs eight rows of A (`k` elements each) into one 8-row panel: step `kk`, row `r`
/// at `panel[kk * 8 + r]`, transposing 8x8 blocks in registers and the last `k % 8`
/// steps element by element.
pub(super) fn pack_a_8_rows(_: CpuSupport, rows: [&[f32]; 8], panel: &mut [f32]) {
    let k = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    let panel = &mut panel[..8 * k];
    let blocks = k / 8;
    // SAFETY: the `CpuSupport` token proves AVX2 was detected on this CPU; every load
    // reads `rows[r][8 * b..8 * b + 8]` with `b < k / 8` (each row holds `k`), every
    // store writes `panel[64 * b + 8 * j..][..8]` inside `panel`'s `8 * k` elements.
    unsafe { transpose_blocks(&rows, blocks, panel.as_mut_ptr()) };
    for kk in blocks * 8..k {
        for (r, row) in rows.iter().enumerate() {
            panel[kk * 8 + r] = row[kk];
        }
    }
}

/// The 8x8 blocks of [`pack_a_8_rows`].
#[target_feature(enable = "avx2")]
unsafe fn transpose_blocks(rows: &[&[f32]; 8], blocks: usize, out: *mut f32) {
    for b in 0..blocks {
        // SAFETY: see `pack_a_8_rows`.
        unsafe {
            let v: [__m256; 8] =
                std::array::from_fn(|r| _mm256_loadu_ps(rows[r].as_ptr().add(8 * b)));
            // Interleave pairs of rows, then pairs of pairs, then the 128-bit halves.
            let t0 = _mm256_unpacklo_ps(v[0], v[1]);
            let t1 = _mm256_unpackhi_ps(v[0], v[1]);
            let t2 = _mm256_unpacklo_ps(v[2], v[3]);
            let t3 = _mm256_unpackhi_ps(v[2], v[3]);
            let t4 = _mm256_unpacklo_ps(v[4], v[5]);
            let t5 = _mm256_unpackhi_ps(v[4], v[5]);
            let t6 = _mm256_unpacklo_ps(v[6], v[7]);
            let t7 = _mm256_unpackhi_ps(v[6], v[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let cols = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (j, c) in cols.iter().enumerate() {
                _mm256_storeu_ps(out.add(64 * b + 8 * j), *c);
            }
        }
    }
}

x86::axpy_rows_entry!("avx2,fma", "AVX2 and FMA");
