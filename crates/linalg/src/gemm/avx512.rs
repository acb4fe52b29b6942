//! The AVX-512 F entry points of the x86-64 GEMM kernels (`x86`, 16-lane vectors): the
//! `AVX512_MR x 32` micro-kernels, the 32-column panel product and the dot-product rows.

use super::kernels::AVX512_MR;
use super::x86;
use crate::simd_x86::Wide;

x86::entry_points!(Wide, AVX512_MR, "avx512f", "avx512f");

x86::axpy_rows_entry!("avx512f,avx2,fma", "AVX-512 F (16-lane vectors)");
