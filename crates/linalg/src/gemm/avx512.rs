//! The AVX-512 F entry points of the x86-64 GEMM kernels (`x86`, 16-lane vectors): the
//! `AVX512_MR x 32` micro-kernels, the 32-column panel product and the dot-product rows.

use super::kernels::AVX512_MR;
use super::x86;
use crate::simd_x86::Wide;

x86::entry_points!(Wide, AVX512_MR, "avx512f", "avx512f");

/// [`super::axpy_rows_body`] compiled with AVX-512 F (16-lane vectors).
pub(super) fn axpy_rows(
    _: crate::CpuSupport,
    xs: &[f32],
    b: &[f32],
    start: usize,
    ld: usize,
    acc: &mut [f32],
) {
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn run(xs: &[f32], b: &[f32], start: usize, ld: usize, acc: &mut [f32]) {
        super::axpy_rows_body::<true>(xs, b, start, ld, acc)
    }
    // SAFETY: the `CpuSupport` token behind `Isa::avx512` proves AVX-512 F (with AVX2
    // and FMA) was detected on this CPU.
    unsafe { run(xs, b, start, ld, acc) }
}
