//! Test data shared by the unit tests of this crate.

use proptest::prelude::*;

use crate::conv::ConvGeometry;
use crate::gemm::{Elems, MatRef};

/// `n` pseudo-random values in `[-1, 1)` from a 64-bit LCG started at `seed`.
pub(crate) fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `n` values on the grid of eighths in `[-1, 1]`, hashed from their index and `seed`
/// (sums of their products stay close to exact in f32).
pub(crate) fn grid_values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 20) % 17) as f32 / 8.0 - 1.0
        })
        .collect()
}

/// Small convolution geometries whose (dilated) kernel fits the padded input, with
/// their own strides, dilations and padding per axis, and several groups.
pub(crate) fn conv_geometry() -> impl Strategy<Value = ConvGeometry> {
    (
        (1usize..8, 1usize..8, 1usize..4, 1usize..4),
        (1usize..4, 1usize..4, 1usize..3, 1usize..3),
        (0usize..3, 0usize..3, 1usize..3, 1usize..4, 1usize..4),
    )
        .prop_filter_map("kernel fits", |(size, steps, (ph, pw, groups, gi, go))| {
            geometry(size, steps, (ph, pw), (groups, gi, go))
        })
}

/// The geometry of an `ih x iw` input, a `kh x kw` kernel, strides `(sh, sw)`,
/// dilations `(dh, dw)`, padding `(ph, pw)` before and after, and `(groups, group_in,
/// group_out)` channels, the output as large as they allow; `None` when the dilated
/// kernel does not fit the padded input.
pub(crate) fn geometry(
    (ih, iw, kh, kw): (usize, usize, usize, usize),
    (sh, sw, dh, dw): (usize, usize, usize, usize),
    (ph, pw): (usize, usize),
    (groups, group_in, group_out): (usize, usize, usize),
) -> Option<ConvGeometry> {
    let eff_h = dh * (kh - 1) + 1;
    let eff_w = dw * (kw - 1) + 1;
    if ih + 2 * ph < eff_h || iw + 2 * pw < eff_w {
        return None;
    }
    Some(ConvGeometry {
        in_h: ih,
        in_w: iw,
        out_h: (ih + 2 * ph - eff_h) / sh + 1,
        out_w: (iw + 2 * pw - eff_w) / sw + 1,
        kernel_h: kh,
        kernel_w: kw,
        stride_h: sh,
        stride_w: sw,
        dilation_h: dh,
        dilation_w: dw,
        pad_top: ph,
        pad_left: pw,
        groups,
        group_in,
        group_out,
    })
}

/// An f32 matrix view at offset 0 with strides `rs` and `cs`.
pub(crate) fn mat(data: &[f32], rows: usize, cols: usize, rs: usize, cs: usize) -> MatRef<'_> {
    MatRef {
        data: Elems::F32(data),
        offset: 0,
        rows,
        cols,
        rs,
        cs,
    }
}
