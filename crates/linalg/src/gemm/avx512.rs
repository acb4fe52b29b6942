//! The AVX-512 F entry points of the x86-64 GEMM kernels (`x86`, 16-lane vectors): the
//! `AVX512_MR x 32` micro-kernel, the 32-column panel product and the dot-product rows.

use super::kernels::{AVX512_MR, TilePost, WeightElem, by_four_rows};
use super::x86;
use crate::CpuSupport;
use crate::simd_x86::Wide;

x86::tile_entry!(
    /// [`x86::kernel`] of an `AVX512_MR x 32` tile.
    kernel_mrx32 = kernel::<Wide, AVX512_MR>, "avx512f"
);

x86::row_entry!(
    /// [`x86::kernel_row`] of `AVX512_MR x 32` tiles.
    kernel_row_mrx32 = <Wide, AVX512_MR>, "avx512f"
);

x86::tile_entry!(
    /// [`x86::kernel_one_vector`] of an `AVX512_MR x 16` tile (at most 16 columns).
    kernel_mrx16 = kernel_one_vector::<Wide, AVX512_MR>, "avx512f"
);

/// [`x86::panel_dot`] of a 32-column panel.
///
/// # Safety
/// Needs AVX-512 F. `x` must hold `k` floats, `b` `k*32` and `out` 32.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn panel_dot_32(k: usize, x: *const f32, b: *const f32, out: *mut f32) {
    // SAFETY: the caller's promise, AVX-512 F enabled here.
    unsafe { x86::panel_dot::<Wide>(k, x, b, out) }
}

/// [`x86::dot4`] with 16-lane vectors.
///
/// # Safety
/// Needs AVX-512 F; each `w[r]` must point at `x.len()` elements.
#[target_feature(enable = "avx512f")]
unsafe fn dot4<W: WeightElem>(x: &[f32], w: [*const W; 4]) -> [f32; 4] {
    // SAFETY: the caller's promise, AVX-512 F enabled here.
    unsafe { x86::dot4::<Wide, W>(x, w) }
}

/// [`x86::dot1`] with 16-lane vectors.
///
/// # Safety
/// Needs AVX-512 F; `w` must point at `x.len()` elements.
#[target_feature(enable = "avx512f")]
unsafe fn dot1<W: WeightElem>(x: &[f32], w: *const W) -> f32 {
    // SAFETY: the caller's promise, AVX-512 F enabled here.
    unsafe { x86::dot1::<Wide, W>(x, w) }
}

/// `out[j] = dot(x, w[j*ldw..][..k])`, 4 rows at a time.
pub(super) fn dot_rows<W: WeightElem>(
    _proof: CpuSupport,
    x: &[f32],
    w: &[W],
    ldw: usize,
    out: &mut [f32],
) {
    by_four_rows(
        x.len(),
        w,
        ldw,
        out,
        // SAFETY: the CpuSupport proof says AVX-512 F was detected; each row slice
        // holds x.len() elements.
        |r| unsafe { dot4(x, r.map(<[W]>::as_ptr)) },
        // SAFETY: as above, for one row.
        |r| unsafe { dot1(x, r.as_ptr()) },
    )
}
