//! 2-D pooling over NHWC images: max pooling (padding never wins), average pooling
//! over the window's in-bounds pixels (padding is not counted, XNNPACK's rule), and
//! global average pooling.

use crate::conv::window_coord;

/// Geometry of one pooling window over an NHWC image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolGeometry {
    /// Input height, width, channels.
    pub in_h: usize,
    pub in_w: usize,
    pub channels: usize,
    /// Output height, width.
    pub out_h: usize,
    pub out_w: usize,
    /// Window.
    pub kernel_h: usize,
    pub kernel_w: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub dilation_h: usize,
    pub dilation_w: usize,
    /// Padding before the first row and column.
    pub pad_top: usize,
    pub pad_left: usize,
}

impl PoolGeometry {
    fn fits(&self, input: &[f32], output: &[f32]) -> bool {
        input.len() >= self.in_h * self.in_w * self.channels
            && output.len() >= self.out_h * self.out_w * self.channels
    }

    /// Calls `f(out, oy, ox)` for every output pixel `(oy, ox)` of one image (lengths
    /// already checked): `out` is its channels in `output`.
    fn for_each_output(&self, output: &mut [f32], mut f: impl FnMut(&mut [f32], usize, usize)) {
        let c = self.channels;
        for oy in 0..self.out_h {
            for ox in 0..self.out_w {
                f(&mut output[(oy * self.out_w + ox) * c..][..c], oy, ox);
            }
        }
    }

    /// The channels of each pixel of `input` that the window of output pixel `(oy, ox)`
    /// covers inside the image (padding is never visited).
    fn window<'a>(
        &'a self,
        input: &'a [f32],
        oy: usize,
        ox: usize,
    ) -> impl Iterator<Item = &'a [f32]> + 'a {
        let (c, in_w) = (self.channels, self.in_w);
        let rows = (0..self.kernel_h).filter_map(move |ky| {
            window_coord(
                oy,
                ky,
                self.stride_h,
                self.dilation_h,
                self.pad_top,
                self.in_h,
            )
        });
        rows.flat_map(move |iy| {
            (0..self.kernel_w)
                .filter_map(move |kx| {
                    window_coord(ox, kx, self.stride_w, self.dilation_w, self.pad_left, in_w)
                })
                .map(move |ix| &input[(iy * in_w + ix) * c..][..c])
        })
    }
}

/// Max pooling of one image, output clamped to `[min, max]`. Returns `false` when a
/// slice is too short.
pub fn max_pool2d_nhwc(
    g: &PoolGeometry,
    input: &[f32],
    min: f32,
    max: f32,
    output: &mut [f32],
) -> bool {
    if !g.fits(input, output) {
        return false;
    }
    g.for_each_output(output, |out, oy, ox| {
        out.fill(f32::NEG_INFINITY);
        for px in g.window(input, oy, ox) {
            for (o, &x) in out.iter_mut().zip(px) {
                *o = o.max(x);
            }
        }
        for o in out.iter_mut() {
            *o = o.max(min).min(max);
        }
    });
    true
}

/// Average pooling of one image over the in-bounds pixels of each window, output
/// clamped. Returns `false` when a slice is too short.
pub fn avg_pool2d_nhwc(
    g: &PoolGeometry,
    input: &[f32],
    min: f32,
    max: f32,
    output: &mut [f32],
) -> bool {
    if !g.fits(input, output) {
        return false;
    }
    g.for_each_output(output, |out, oy, ox| {
        out.fill(0.0);
        let mut count = 0usize;
        for px in g.window(input, oy, ox) {
            count += 1;
            for (o, &x) in out.iter_mut().zip(px) {
                *o += x;
            }
        }
        let scale = if count == 0 { 0.0 } else { 1.0 / count as f32 };
        for o in out.iter_mut() {
            *o = (*o * scale).max(min).min(max);
        }
    });
    true
}

/// Mean over `pixels` rows of `channels` values (global average pooling of one
/// image), clamped. Returns `false` when a slice is too short.
pub fn global_avg_pool_nhwc(
    pixels: usize,
    channels: usize,
    input: &[f32],
    min: f32,
    max: f32,
    output: &mut [f32],
) -> bool {
    if input.len() < pixels * channels || output.len() < channels {
        return false;
    }
    let out = &mut output[..channels];
    out.fill(0.0);
    for px in input[..pixels * channels].chunks_exact(channels.max(1)) {
        for (o, &x) in out.iter_mut().zip(px) {
            *o += x;
        }
    }
    let scale = if pixels == 0 {
        0.0
    } else {
        1.0 / pixels as f32
    };
    for o in out.iter_mut() {
        *o = (*o * scale).max(min).min(max);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn unit_windows_copy(h in 1usize..6, w in 1usize..6, c in 1usize..5) {
            let g = PoolGeometry { in_h: h, in_w: w, channels: c, out_h: h, out_w: w, kernel_h: 1, kernel_w: 1, stride_h: 1, stride_w: 1, dilation_h: 1, dilation_w: 1, pad_top: 0, pad_left: 0 };
            let x: Vec<f32> = (0..h * w * c).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut a = vec![0f32; x.len()];
            let mut m = vec![0f32; x.len()];
            prop_assert!(avg_pool2d_nhwc(&g, &x, f32::NEG_INFINITY, f32::INFINITY, &mut a));
            prop_assert!(max_pool2d_nhwc(&g, &x, f32::NEG_INFINITY, f32::INFINITY, &mut m));
            prop_assert_eq!(&a, &x);
            prop_assert_eq!(&m, &x);
        }

        #[test]
        fn whole_image_window_is_global(h in 1usize..6, w in 1usize..6, c in 1usize..5) {
            let g = PoolGeometry { in_h: h, in_w: w, channels: c, out_h: 1, out_w: 1, kernel_h: h, kernel_w: w, stride_h: 1, stride_w: 1, dilation_h: 1, dilation_w: 1, pad_top: 0, pad_left: 0 };
            let x: Vec<f32> = (0..h * w * c).map(|i| ((i * 7) % 11) as f32).collect();
            let mut a = vec![0f32; c];
            let mut b = vec![0f32; c];
            prop_assert!(avg_pool2d_nhwc(&g, &x, f32::NEG_INFINITY, f32::INFINITY, &mut a));
            prop_assert!(global_avg_pool_nhwc(h * w, c, &x, f32::NEG_INFINITY, f32::INFINITY, &mut b));
            for (p, q) in a.iter().zip(&b) {
                prop_assert!((p - q).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn padding_is_not_counted() {
        // 2x2 image, 3x3 window padded by 1: the corner output averages the 4 pixels.
        let g = PoolGeometry {
            in_h: 2,
            in_w: 2,
            channels: 1,
            out_h: 2,
            out_w: 2,
            kernel_h: 3,
            kernel_w: 3,
            stride_h: 1,
            stride_w: 1,
            dilation_h: 1,
            dilation_w: 1,
            pad_top: 1,
            pad_left: 1,
        };
        let x = [1.0, 2.0, 3.0, -4.0];
        let mut a = [0f32; 4];
        let mut m = [0f32; 4];
        assert!(avg_pool2d_nhwc(
            &g,
            &x,
            f32::NEG_INFINITY,
            f32::INFINITY,
            &mut a
        ));
        assert!(max_pool2d_nhwc(
            &g,
            &x,
            f32::NEG_INFINITY,
            f32::INFINITY,
            &mut m
        ));
        assert_eq!(a, [0.5; 4]);
        assert_eq!(m, [3.0; 4]);
    }
}
