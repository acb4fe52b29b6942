//! Bilinear resizing of NHWC images with XNNPACK's coordinate rules
//! (`xnn_indirection_init_resize_bilinear2d_hwc_f32`): half-pixel centers clamped to
//! the image by default, `align_corners`, and TensorFlow's legacy mode (`src = dst *
//! scale`).

/// Source coordinate, lower index, upper index and weight of the upper one, for each
/// output coordinate along one axis.
fn axis(
    out: usize,
    in_size: usize,
    out_size: usize,
    align_corners: bool,
    legacy: bool,
) -> (usize, usize, f32) {
    let adjust = usize::from(align_corners && out_size != 1);
    let scale = (in_size - adjust) as f32 / (out_size - adjust) as f32;
    let max = (in_size - 1) as f32;
    let src = if legacy || align_corners {
        (out as f32 * scale).min(max)
    } else {
        (out as f32 * scale + (0.5 * scale - 0.5)).max(0.0).min(max)
    };
    let lo = src as usize;
    let hi = (lo + 1).min(in_size - 1);
    (lo, hi, src - lo as f32)
}

/// Resizes one `in_h x in_w x channels` image to `out_h x out_w`. Returns `false` when a
/// slice is too short or a size is zero.
#[allow(clippy::too_many_arguments)]
pub fn resize_bilinear_nhwc(
    in_h: usize,
    in_w: usize,
    channels: usize,
    out_h: usize,
    out_w: usize,
    align_corners: bool,
    legacy: bool,
    input: &[f32],
    output: &mut [f32],
) -> bool {
    if in_h == 0 || in_w == 0 || out_h == 0 || out_w == 0 {
        return false;
    }
    if input.len() < in_h * in_w * channels || output.len() < out_h * out_w * channels {
        return false;
    }
    let c = channels;
    for oy in 0..out_h {
        let (top, bottom, ay) = axis(oy, in_h, out_h, align_corners, legacy);
        for ox in 0..out_w {
            let (left, right, ax) = axis(ox, in_w, out_w, align_corners, legacy);
            let px = |y: usize, x: usize| &input[(y * in_w + x) * c..(y * in_w + x + 1) * c];
            let (tl, tr, bl, br) = (
                px(top, left),
                px(top, right),
                px(bottom, left),
                px(bottom, right),
            );
            let out = &mut output[(oy * out_w + ox) * c..(oy * out_w + ox + 1) * c];
            for k in 0..c {
                let t = tl[k] + (tr[k] - tl[k]) * ax;
                let b = bl[k] + (br[k] - bl[k]) * ax;
                out[k] = t + (b - t) * ay;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn same_size_is_identity(h in 1usize..6, w in 1usize..6, c in 1usize..4, align in any::<bool>()) {
            let x: Vec<f32> = (0..h * w * c).map(|i| i as f32).collect();
            let mut y = vec![0f32; x.len()];
            prop_assert!(resize_bilinear_nhwc(h, w, c, h, w, align, false, &x, &mut y));
            prop_assert_eq!(x, y);
        }

        #[test]
        fn stays_within_the_input_range(h in 1usize..5, w in 1usize..5, oh in 1usize..9, ow in 1usize..9, align in any::<bool>()) {
            let x: Vec<f32> = (0..h * w).map(|i| ((i * 5) % 7) as f32).collect();
            let mut y = vec![0f32; oh * ow];
            prop_assert!(resize_bilinear_nhwc(h, w, 1, oh, ow, align, false, &x, &mut y));
            for v in y {
                prop_assert!((-1e-5..=6.0 + 1e-5).contains(&v));
            }
        }
    }

    #[test]
    fn doubling_with_half_pixel_centers() {
        // 1x2 -> 1x4: sources -0.25 (clamped to 0), 0.25, 0.75, 1.25 (clamped to 1);
        // with aligned corners 0, 1/3, 2/3, 1.
        for (align_corners, input, want) in [
            (false, [0.0, 4.0], [0.0, 1.0, 3.0, 4.0]),
            (true, [0.0, 3.0], [0.0, 1.0, 2.0, 3.0]),
        ] {
            let mut y = [0f32; 4];
            assert!(resize_bilinear_nhwc(
                1,
                2,
                1,
                1,
                4,
                align_corners,
                false,
                &input,
                &mut y
            ));
            assert_eq!(y, want, "align_corners {align_corners}");
        }
    }
}
