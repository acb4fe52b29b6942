//! The sliding window of the convolution and pooling kinds: output extents, and the
//! geometry their `etch-linalg` kernels take for one call's dims.

use etch_linalg::conv::ConvGeometry;
use etch_linalg::pool::PoolGeometry;

use crate::dims::Dims;
use crate::graph::Window;

/// Output rows of `w` over an input `in_h` rows tall, or `None` where the window
/// (dilated) is taller than the padded input.
pub fn output_height(w: &Window, in_h: usize) -> Option<usize> {
    let pad = w.pad_top + w.pad_bottom;
    window_out(in_h, pad, w.kernel_h, w.dilation_h, w.stride_h)
}

/// Output columns of `w` over an input `in_w` columns wide, or `None` where the window
/// (dilated) is wider than the padded input.
pub fn output_width(w: &Window, in_w: usize) -> Option<usize> {
    let pad = w.pad_left + w.pad_right;
    window_out(in_w, pad, w.kernel_w, w.dilation_w, w.stride_w)
}

/// Output extent of a convolution or pooling window along one axis.
fn window_out(
    input: usize,
    pad: usize,
    kernel: usize,
    dilation: usize,
    stride: usize,
) -> Option<usize> {
    let padded = input.checked_add(pad)?;
    let effective = dilation
        .checked_mul(kernel.checked_sub(1)?)?
        .checked_add(1)?;
    if padded < effective {
        return None;
    }
    Some((padded - effective) / stride + 1)
}

/// The geometry of a convolution with window `w` from NHWC dims `xd` to `yd`.
pub fn conv_geometry(w: &Window, xd: &Dims, yd: &Dims) -> ConvGeometry {
    ConvGeometry {
        in_h: xd.get(1),
        in_w: xd.get(2),
        out_h: yd.get(1),
        out_w: yd.get(2),
        kernel_h: w.kernel_h,
        kernel_w: w.kernel_w,
        stride_h: w.stride_h,
        stride_w: w.stride_w,
        dilation_h: w.dilation_h,
        dilation_w: w.dilation_w,
        pad_top: w.pad_top,
        pad_left: w.pad_left,
        groups: w.groups,
        group_in: w.group_in,
        group_out: w.group_out,
    }
}

/// The geometry of a pooling with window `w` from NHWC dims `xd` to `yd`.
pub fn pool_geometry(w: &Window, xd: &Dims, yd: &Dims) -> PoolGeometry {
    PoolGeometry {
        in_h: xd.get(1),
        in_w: xd.get(2),
        channels: xd.get(3),
        out_h: yd.get(1),
        out_w: yd.get(2),
        kernel_h: w.kernel_h,
        kernel_w: w.kernel_w,
        stride_h: w.stride_h,
        stride_w: w.stride_w,
        dilation_h: w.dilation_h,
        dilation_w: w.dilation_w,
        pad_top: w.pad_top,
        pad_left: w.pad_left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows() {
        assert_eq!(window_out(224, 2, 3, 1, 2), Some(112));
        assert_eq!(window_out(7, 0, 7, 1, 1), Some(1));
        assert_eq!(window_out(2, 0, 3, 1, 1), None);
    }
}
