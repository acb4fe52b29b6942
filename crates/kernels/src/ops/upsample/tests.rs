use etch_base::ScalarType;
use proptest::prelude::*;

use crate::EValue;
use crate::ops::elementwise::testutil::{Lcg, assert_close, harness, read, tensor};
use crate::testing::Harness;

/// PyTorch's bilinear source coordinate along one axis, in f64.
fn source(
    o: usize,
    in_size: usize,
    out_size: usize,
    align: bool,
    scale: Option<f64>,
) -> (usize, usize, f64) {
    if in_size == out_size {
        return (o, o, 0.0);
    }
    let real = if align {
        if out_size > 1 {
            o as f64 * (in_size - 1) as f64 / (out_size - 1) as f64
        } else {
            0.0
        }
    } else {
        let r = scale.map_or(in_size as f64 / out_size as f64, |s| 1.0 / s);
        (r * (o as f64 + 0.5) - 0.5).max(0.0)
    };
    let i0 = (real.floor() as usize).min(in_size - 1);
    let i1 = (i0 + 1).min(in_size - 1);
    (i0, i1, (real - i0 as f64).clamp(0.0, 1.0))
}

fn scales_value(h: &mut Harness, s: Option<[f64; 2]>) -> usize {
    match s {
        Some(s) => h.push(EValue::DoubleList(s.to_vec().into())),
        None => h.none(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn bilinear_matches_reference(n in 1usize..3, c in 1usize..3, ih in 1usize..7, iw in 1usize..7, oh in 1usize..13, ow in 1usize..13, align in any::<bool>(), by_scale in any::<bool>(), seed in any::<u64>(), threads in 1usize..=2) {
        let mut rng = Lcg(seed);
        let x: Vec<f64> = rng.vec(n * c * ih * iw, 2.0).into_iter().map(|v| v as f32 as f64).collect();
        let mut h = harness(threads);
        let xt = tensor(&mut h, ScalarType::Float, &[n, c, ih, iw], &x);
        // With scale factors, the output is floor(in * scale); pick scales giving oh, ow.
        let (scales, (oh, ow)) = if by_scale {
            let s = [(oh as f64 + 0.25) / ih as f64, (ow as f64 + 0.25) / iw as f64];
            (Some(s), ((ih as f64 * s[0]) as usize, (iw as f64 * s[1]) as usize))
        } else {
            (None, (oh, ow))
        };
        prop_assume!(oh > 0 && ow > 0);
        let size = if by_scale { h.none() } else { h.int_list(&[oh as i64, ow as i64]) };
        let al = h.bool(align);
        let sc = scales_value(&mut h, scales);
        let out = h.out(ScalarType::Float, &[n, c, oh, ow]);
        h.call("aten::upsample_bilinear2d.vec_out", &[xt, size, al, sc, out, out]).unwrap();
        prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), vec![n, c, oh, ow]);
        let mut want = vec![];
        for p in 0..n * c {
            let src = &x[p * ih * iw..];
            for y in 0..oh {
                let (y0, y1, ly) = source(y, ih, oh, align, scales.map(|s| s[0]));
                for xx in 0..ow {
                    let (x0, x1, lx) = source(xx, iw, ow, align, scales.map(|s| s[1]));
                    let t = src[y0 * iw + x0] * (1.0 - lx) + src[y0 * iw + x1] * lx;
                    let b = src[y1 * iw + x0] * (1.0 - lx) + src[y1 * iw + x1] * lx;
                    want.push(t * (1.0 - ly) + b * ly);
                }
            }
        }
        assert_close(&read(&mut h, out), &want, 1e-4, 1e-4);
    }

    #[test]
    fn nearest_matches_reference(n in 1usize..3, c in 1usize..3, ih in 1usize..7, iw in 1usize..7, oh in 1usize..13, ow in 1usize..13, seed in any::<u64>(), threads in 1usize..=2) {
        let mut rng = Lcg(seed);
        let x: Vec<f64> = rng.vec(n * c * ih * iw, 2.0).into_iter().map(|v| v as f32 as f64).collect();
        let mut h = harness(threads);
        let xt = tensor(&mut h, ScalarType::Float, &[n, c, ih, iw], &x);
        let size = h.int_list(&[oh as i64, ow as i64]);
        let sc = h.none();
        let out = h.out(ScalarType::Float, &[n, c, oh, ow]);
        h.call("aten::upsample_nearest2d.vec_out", &[xt, size, sc, out, out]).unwrap();
        let mut want = vec![];
        for p in 0..n * c {
            for y in 0..oh {
                let sy = ((y as f32 * (ih as f64 / oh as f64) as f32).floor() as usize).min(ih - 1);
                for xx in 0..ow {
                    let sx = ((xx as f32 * (iw as f64 / ow as f64) as f32).floor() as usize).min(iw - 1);
                    want.push(x[p * ih * iw + sy * iw + sx]);
                }
            }
        }
        assert_close(&read(&mut h, out), &want, 0.0, 0.0);
    }
}

#[test]
fn nearest_doubles_each_pixel() {
    let mut h = Harness::new();
    let x = h.tensor(&[1, 1, 2, 2], &[1.0f32, 2.0, 3.0, 4.0]);
    let none = h.none();
    let sc = scales_value(&mut h, Some([2.0, 2.0]));
    let out = h.out(ScalarType::Float, &[1, 1, 4, 4]);
    h.call("aten::upsample_nearest2d.vec_out", &[x, none, sc, out, out])
        .unwrap();
    assert_eq!(
        h.read::<f32>(out),
        vec![
            1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0
        ]
    );
}

#[test]
fn bad_calls_are_errors() {
    let mut h = Harness::new();
    let x = h.tensor(&[1, 1, 2, 2], &[0.0f32; 4]);
    let x3 = h.tensor(&[1, 2, 2], &[0.0f32; 4]);
    let none = h.none();
    let size = h.int_list(&[4, 4]);
    let size0 = h.int_list(&[0, 4]);
    let size1 = h.int_list(&[4]);
    let sc = scales_value(&mut h, Some([2.0, 2.0]));
    let sc0 = scales_value(&mut h, Some([0.1, 2.0]));
    let f = h.bool(false);
    let out = h.out(ScalarType::Float, &[1, 1, 4, 4]);
    let bl = "aten::upsample_bilinear2d.vec_out";
    assert!(h.call(bl, &[x, size, f, none, out, out]).is_ok());
    assert!(h.call(bl, &[x, size, f, sc, out, out]).is_err());
    assert!(h.call(bl, &[x, none, f, none, out, out]).is_err());
    assert!(h.call(bl, &[x, size0, f, none, out, out]).is_err());
    assert!(h.call(bl, &[x, size1, f, none, out, out]).is_err());
    assert!(h.call(bl, &[x, none, f, sc0, out, out]).is_err());
    assert!(h.call(bl, &[x3, size, f, none, out, out]).is_err());
}
