use etch_base::ScalarType;
use proptest::prelude::*;

use crate::Epilogue;
use crate::ops::elementwise::testutil::{Lcg, assert_close, harness, read, tensor};
use crate::ops::window::output_len;
use crate::testing::Harness;

#[derive(Debug, Clone)]
struct Case {
    lead: Vec<usize>,
    ih: usize,
    iw: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just(vec![2usize]),
            Just(vec![1usize, 3]),
            Just(vec![2usize, 2])
        ],
        (1usize..9, 1usize..9, 1usize..4, 1usize..4),
        (1usize..4, 1usize..4, 0usize..2, 0usize..2),
        (1usize..3, 1usize..3, any::<bool>()),
    )
        .prop_filter_map(
            "window fits",
            |(lead, (ih, iw, kh, kw), (sh, sw, ph, pw), (dh, dw, ceil))| {
                let c = Case {
                    lead,
                    ih,
                    iw,
                    k: [kh, kw],
                    s: [sh, sw],
                    p: [ph.min(kh / 2), pw.min(kw / 2)],
                    d: [dh, dw],
                    ceil,
                };
                let oh = output_len(ih, kh, sh, c.p[0], dh, ceil)?;
                let ow = output_len(iw, kw, sw, c.p[1], dw, ceil)?;
                // A dilated window can fall wholly in the padding; PyTorch leaves
                // that output undefined, so the cases keep a tap inside the input.
                let touches = |n: usize, size: usize, k: usize, st: usize, p: usize, d: usize| {
                    (0..n).all(|o| (0..k).any(|t| (o * st + t * d).wrapping_sub(p) < size))
                };
                let inside =
                    touches(oh, ih, kh, sh, c.p[0], dh) && touches(ow, iw, kw, sw, c.p[1], dw);
                (oh > 0 && ow > 0 && inside).then_some(c)
            },
        )
}

impl Case {
    fn out_hw(&self, dil: bool) -> (usize, usize) {
        let d = if dil { self.d } else { [1, 1] };
        (
            output_len(self.ih, self.k[0], self.s[0], self.p[0], d[0], self.ceil).unwrap(),
            output_len(self.iw, self.k[1], self.s[1], self.p[1], d[1], self.ceil).unwrap(),
        )
    }
    fn shape(&self, h: usize, w: usize) -> Vec<usize> {
        let mut s = self.lead.clone();
        s.extend([h, w]);
        s
    }
    fn planes(&self) -> usize {
        self.lead.iter().product()
    }
}

/// Max pooling straight from the definition: taps in row-major order, the first
/// largest kept.
fn max_ref(c: &Case, x: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (oh, ow) = c.out_hw(true);
    let mut vals = vec![];
    let mut idx = vec![];
    for pl in 0..c.planes() {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best: Option<(f64, usize)> = None;
                for ky in 0..c.k[0] {
                    for kx in 0..c.k[1] {
                        let iy = (oy * c.s[0] + ky * c.d[0]) as i64 - c.p[0] as i64;
                        let ix = (ox * c.s[1] + kx * c.d[1]) as i64 - c.p[1] as i64;
                        if iy < 0 || ix < 0 || iy >= c.ih as i64 || ix >= c.iw as i64 {
                            continue;
                        }
                        let at = iy as usize * c.iw + ix as usize;
                        let v = x[pl * c.ih * c.iw + at];
                        if best.is_none_or(|(b, _)| v > b) {
                            best = Some((v, at));
                        }
                    }
                }
                let (v, i) = best.unwrap();
                vals.push(v);
                idx.push(i as f64);
            }
        }
    }
    (vals, idx)
}

fn avg_ref(c: &Case, x: &[f64], include_pad: bool, divisor: Option<i64>) -> Vec<f64> {
    let (oh, ow) = c.out_hw(false);
    let mut out = vec![];
    for pl in 0..c.planes() {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut sum = 0.0;
                let mut inside = 0;
                let mut padded = 0;
                for ky in 0..c.k[0] {
                    for kx in 0..c.k[1] {
                        let iy = (oy * c.s[0] + ky) as i64 - c.p[0] as i64;
                        let ix = (ox * c.s[1] + kx) as i64 - c.p[1] as i64;
                        if iy < (c.ih + c.p[0]) as i64 && ix < (c.iw + c.p[1]) as i64 {
                            padded += 1;
                        }
                        if iy < 0 || ix < 0 || iy >= c.ih as i64 || ix >= c.iw as i64 {
                            continue;
                        }
                        inside += 1;
                        sum += x[pl * c.ih * c.iw + iy as usize * c.iw + ix as usize];
                    }
                }
                let n = match divisor {
                    Some(d) => d as f64,
                    None if include_pad => padded as f64,
                    None => inside as f64,
                };
                out.push(sum / n);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn max_pool_matches_reference(c in case(), seed in any::<u64>(), threads in 1usize..=2, nan in any::<bool>()) {
        let mut rng = Lcg(seed);
        // Few distinct values, so ties are common; perhaps a NaN.
        let mut x: Vec<f64> = rng.vec(c.planes() * c.ih * c.iw, 4.0).into_iter().map(|v| v.round()).collect();
        if nan {
            let at = (seed as usize) % x.len();
            x[at] = f64::NAN;
        }
        let mut h = harness(threads);
        let xt = tensor(&mut h, ScalarType::Float, &c.shape(c.ih, c.iw), &x);
        let k = h.int_list(&[c.k[0] as i64, c.k[1] as i64]);
        let s = h.int_list(&[c.s[0] as i64, c.s[1] as i64]);
        let p = h.int_list(&[c.p[0] as i64, c.p[1] as i64]);
        let d = h.int_list(&[c.d[0] as i64, c.d[1] as i64]);
        let ceil = h.bool(c.ceil);
        let (oh, ow) = c.out_hw(true);
        let out = h.out(ScalarType::Float, &c.shape(oh, ow));
        let idx = h.out(ScalarType::Long, &c.shape(oh, ow));
        let list = h.tensor_list(&[out, idx]);
        h.call("aten::max_pool2d_with_indices.out", &[xt, k, s, p, d, ceil, out, idx, list]).unwrap();
        let got = h.read::<f32>(out);
        if !nan {
            let (vals, ids) = max_ref(&c, &x);
            assert_close(&read(&mut h, out), &vals, 0.0, 0.0);
            let got_i: Vec<f64> = h.read::<i64>(idx).into_iter().map(|v| v as f64).collect();
            assert_close(&got_i, &ids, 0.0, 0.0);
        }
        // With the indices unread (arranged at load), the same values to the bit.
        let values = h.out(ScalarType::Float, &c.shape(oh, ow));
        let unread = h.out(ScalarType::Long, &c.shape(oh, ow));
        let list = h.tensor_list(&[values, unread]);
        let epilogue = Epilogue { indices_unread: true, ..Epilogue::default() };
        let args = [xt, k, s, p, d, ceil, values, unread, list];
        h.call_with_epilogue("aten::max_pool2d_with_indices.out", &args, epilogue).unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        prop_assert_eq!(bits(h.read::<f32>(values)), bits(got));
    }

    #[test]
    fn avg_pool_matches_reference(c in case(), include_pad in any::<bool>(), div in prop_oneof![Just(None), (1i64..7).prop_map(Some)], seed in any::<u64>(), threads in 1usize..=2) {
        let mut rng = Lcg(seed);
        let x: Vec<f64> = rng.vec(c.planes() * c.ih * c.iw, 2.0).into_iter().map(|v| v as f32 as f64).collect();
        let mut h = harness(threads);
        let xt = tensor(&mut h, ScalarType::Float, &c.shape(c.ih, c.iw), &x);
        let k = h.int_list(&[c.k[0] as i64, c.k[1] as i64]);
        let s = h.int_list(&[c.s[0] as i64, c.s[1] as i64]);
        let p = h.int_list(&[c.p[0] as i64, c.p[1] as i64]);
        let ceil = h.bool(c.ceil);
        let inc = h.bool(include_pad);
        let dv = match div { Some(d) => h.int(d), None => h.none() };
        let (oh, ow) = c.out_hw(false);
        let out = h.out(ScalarType::Float, &c.shape(oh, ow));
        h.call("aten::avg_pool2d.out", &[xt, k, s, p, ceil, inc, dv, out, out]).unwrap();
        assert_close(&read(&mut h, out), &avg_ref(&c, &x, include_pad, div), 1e-5, 1e-6);
    }

    #[test]
    fn adaptive_avg_pool_matches_reference(lead in prop_oneof![Just(vec![3usize]), Just(vec![2usize, 2])], ih in 1usize..10, iw in 1usize..10, oh in 1usize..6, ow in 1usize..6, seed in any::<u64>(), threads in 1usize..=2) {
        let planes: usize = lead.iter().product();
        let mut rng = Lcg(seed);
        let x: Vec<f64> = rng.vec(planes * ih * iw, 2.0).into_iter().map(|v| v as f32 as f64).collect();
        let mut h = harness(threads);
        let mut shape = lead.clone();
        shape.extend([ih, iw]);
        let xt = tensor(&mut h, ScalarType::Float, &shape, &x);
        let size = h.int_list(&[oh as i64, ow as i64]);
        let mut oshape = lead.clone();
        oshape.extend([oh, ow]);
        let out = h.out(ScalarType::Float, &oshape);
        h.call("aten::_adaptive_avg_pool2d.out", &[xt, size, out, out]).unwrap();
        let mut want = vec![];
        for pl in 0..planes {
            for oy in 0..oh {
                let (y0, y1) = ((oy * ih) as f64 / oh as f64, ((oy + 1) * ih) as f64 / oh as f64);
                for ox in 0..ow {
                    let (x0, x1) = ((ox * iw) as f64 / ow as f64, ((ox + 1) * iw) as f64 / ow as f64);
                    let (mut s, mut n) = (0.0, 0.0);
                    for iy in y0.floor() as usize..y1.ceil() as usize {
                        for ix in x0.floor() as usize..x1.ceil() as usize {
                            s += x[pl * ih * iw + iy * iw + ix];
                            n += 1.0;
                        }
                    }
                    want.push(s / n);
                }
            }
        }
        assert_close(&read(&mut h, out), &want, 1e-5, 1e-6);
    }
}

#[test]
fn bad_calls_are_errors() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[1, 1, 4, 4], &[0.0; 16]);
    let x2 = tensor(&mut h, ScalarType::Float, &[4, 4], &[0.0; 16]);
    let k2 = h.int_list(&[2, 2]);
    let k5 = h.int_list(&[5, 5]);
    let empty = h.int_list(&[]);
    let zero = h.int_list(&[0]);
    let big_pad = h.int_list(&[2]);
    let one = h.int_list(&[1]);
    let f = h.bool(false);
    let none = h.none();
    let div0 = h.int(0);
    let out = h.out(ScalarType::Float, &[1, 1, 4, 4]);
    let idx = h.out(ScalarType::Long, &[1, 1, 4, 4]);
    let idx_bad = h.out(ScalarType::Int, &[1, 1, 4, 4]);
    let mp = "aten::max_pool2d_with_indices.out";
    let l = h.tensor_list(&[out, idx]);
    let lb = h.tensor_list(&[out, idx_bad]);
    assert!(
        h.call(mp, &[x, k2, empty, zero, one, f, out, idx, l])
            .is_ok()
    );
    assert_eq!(h.tensor_meta(out).sizes(), &[1, 1, 2, 2]);
    assert!(
        h.call(mp, &[x, k5, empty, zero, one, f, out, idx, l])
            .is_err()
    );
    assert!(
        h.call(mp, &[x, k2, empty, big_pad, one, f, out, idx, l])
            .is_err()
    );
    assert!(
        h.call(mp, &[x, k2, empty, zero, one, f, out, idx_bad, lb])
            .is_err()
    );
    assert!(
        h.call(mp, &[x2, k2, empty, zero, one, f, out, idx, l])
            .is_err()
    );
    assert!(
        h.call(mp, &[x, empty, empty, zero, one, f, out, idx, l])
            .is_err()
    );
    assert!(h.call(mp, &[x, k2, empty, zero, one, f, out, idx]).is_err());
    let ap = "aten::avg_pool2d.out";
    assert!(
        h.call(ap, &[x, k2, empty, zero, f, f, none, out, out])
            .is_ok()
    );
    assert!(
        h.call(ap, &[x, k2, empty, zero, f, f, div0, out, out])
            .is_err()
    );
    let aap = "aten::_adaptive_avg_pool2d.out";
    assert!(h.call(aap, &[x, zero, out, out]).is_err());
    assert!(h.call(aap, &[x, one, out, out]).is_ok());
}
