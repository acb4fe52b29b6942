use etch_base::ScalarType;
use proptest::prelude::*;

use crate::ops::elementwise::testutil::{
    Lcg, assert_close, assert_refused, harness, read, round_through, small_ints, tensor,
};
use crate::testing::Harness;

/// Groups input elements by output element: `groups[o]` lists the input values
/// reduced into output `o`, in row-major order.
fn groups(shape: &[usize], mask: &[bool], vals: &[f64]) -> Vec<Vec<f64>> {
    let out_n: usize = shape
        .iter()
        .zip(mask)
        .map(|(&s, &m)| if m { 1 } else { s })
        .product();
    let mut g = vec![Vec::new(); out_n];
    for (i, &v) in vals.iter().enumerate() {
        let mut rem = i;
        let mut o = 0;
        let mut ostride = 1;
        for d in (0..shape.len()).rev() {
            let j = rem % shape[d];
            rem /= shape[d];
            if !mask[d] {
                o += j * ostride;
                ostride *= shape[d];
            }
        }
        g[o].push(v);
    }
    g
}

fn out_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(mask)
        .filter_map(|(&s, &m)| match (m, keepdim) {
            (true, true) => Some(1),
            (true, false) => None,
            (false, _) => Some(s),
        })
        .collect()
}

fn shape_and_dims() -> impl Strategy<Value = (Vec<usize>, Vec<bool>, bool)> {
    proptest::collection::vec(0usize..5, 0..5).prop_flat_map(|shape| {
        let r = shape.len();
        (
            Just(shape),
            proptest::collection::vec(any::<bool>(), r),
            any::<bool>(),
        )
    })
}

fn dims_of(mask: &[bool]) -> Vec<i64> {
    mask.iter()
        .enumerate()
        .filter(|(_, m)| **m)
        .map(|(d, _)| d as i64 - if d % 2 == 0 { mask.len() as i64 } else { 0 })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn sum_and_mean((shape, mask, keepdim) in shape_and_dims(), dt in 0usize..5, seed in any::<u64>(), threads in 1usize..=2, mean in any::<bool>()) {
        let dtype = [ScalarType::Float, ScalarType::Double, ScalarType::Half, ScalarType::Int, ScalarType::Bool][dt];
        if mean && !dtype.is_floating_point() {
            return Ok(());
        }
        let n: usize = shape.iter().product();
        let mut rng = Lcg(seed);
        let vals = if dtype.is_floating_point() { rng.vec(n, 2.0) } else { small_ints(&mut rng, dtype, n) };
        let vals: Vec<f64> = vals.iter().map(|&v| round_through(dtype, v)).collect();
        let mut h = harness(threads);
        let x = tensor(&mut h, dtype, &shape, &vals);
        // All dims reduced when the mask is all false and we pass None.
        let all = !mask.iter().any(|&m| m);
        let mask: Vec<bool> = if all { vec![true; shape.len()] } else { mask };
        let dims = if all { h.none() } else { let d = dims_of(&mask); h.int_list(&d) };
        let kd = h.bool(keepdim);
        let none = h.none();
        let result = if dtype.is_floating_point() { dtype } else { ScalarType::Long };
        let os = out_shape(&shape, &mask, keepdim);
        let out = h.out(result, &os);
        let name = if mean { "aten::mean.out" } else { "aten::sum.IntList_out" };
        h.call(name, &[x, dims, kd, none, out, out]).unwrap();
        prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), os.clone());
        let want: Vec<f64> = groups(&shape, &mask, &vals).iter().map(|g| {
            let s: f64 = g.iter().sum();
            round_through(result, if mean { s / g.len() as f64 } else { s })
        }).collect();
        let (rel, abs) = match result {
            ScalarType::Float => (1e-5, 2e-5),
            ScalarType::Half => (8e-3, 8e-3),
            ScalarType::Double => (1e-12, 1e-12),
            _ => (0.0, 0.0),
        };
        assert_close(&read(&mut h, out), &want, rel, abs);
    }

    #[test]
    fn extrema_and_args((shape, mask, keepdim) in shape_and_dims(), dt in 0usize..3, seed in any::<u64>(), threads in 1usize..=2) {
        let dtype = [ScalarType::Float, ScalarType::Char, ScalarType::BFloat16][dt];
        let n: usize = shape.iter().product();
        let mut rng = Lcg(seed);
        let vals = small_ints(&mut rng, dtype, n);
        let mut h = harness(threads);
        let x = tensor(&mut h, dtype, &shape, &vals);
        let d = dims_of(&mask);
        let dims = h.int_list(&d);
        let kd = h.bool(keepdim);
        let all = !mask.iter().any(|&m| m);
        let rmask: Vec<bool> = if all { vec![true; shape.len()] } else { mask.clone() };
        let os = out_shape(&shape, &rmask, keepdim);
        let g = groups(&shape, &rmask, &vals);
        let empty = g.iter().any(|g| g.is_empty());
        for (name, pick) in [("aten::amax.out", true), ("aten::amin.out", false)] {
            let out = h.out(dtype, &os);
            let r = h.call(name, &[x, dims, kd, out, out]);
            if empty {
                prop_assert!(r.is_err());
                continue;
            }
            r.unwrap();
            let want: Vec<f64> = g.iter().map(|g| g.iter().copied().fold(if pick { f64::MIN } else { f64::MAX }, if pick { f64::max } else { f64::min })).collect();
            prop_assert_eq!(read(&mut h, out), want);
        }
        // argmax/argmin over one dim (the first masked one), or flattened.
        let first = mask.iter().position(|&m| m);
        let amask: Vec<bool> = match first {
            Some(f) => (0..shape.len()).map(|d| d == f).collect(),
            None => vec![true; shape.len()],
        };
        let g = groups(&shape, &amask, &vals);
        let dim = match first { Some(f) => h.int(f as i64), None => h.none() };
        let aos = match first { Some(_) => out_shape(&shape, &amask, keepdim), None if keepdim => vec![1; shape.len()], None => vec![] };
        for (name, pick) in [("aten::argmax.out", true), ("aten::argmin.out", false)] {
            let out = h.out(ScalarType::Long, &aos);
            let r = h.call(name, &[x, dim, kd, out, out]);
            if g.iter().any(|g| g.is_empty()) && !g.is_empty() {
                prop_assert!(r.is_err());
                continue;
            }
            r.unwrap();
            prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), aos.clone());
            let want: Vec<f64> = g.iter().map(|g| {
                let mut best = 0;
                for (i, &v) in g.iter().enumerate() {
                    if (pick && v > g[best]) || (!pick && v < g[best]) { best = i; }
                }
                best as f64
            }).collect();
            prop_assert_eq!(read(&mut h, out), want);
        }
    }

    #[test]
    fn any_and_var((shape, mask, keepdim) in shape_and_dims(), seed in any::<u64>()) {
        let n: usize = shape.iter().product();
        let mut rng = Lcg(seed);
        let bools = small_ints(&mut rng, ScalarType::Bool, n);
        let mut h = Harness::new();
        let b = tensor(&mut h, ScalarType::Bool, &shape, &bools);
        let all = !mask.iter().any(|&m| m);
        let rmask: Vec<bool> = if all { vec![true; shape.len()] } else { mask.clone() };
        let dims = if all { h.none() } else { let d = dims_of(&rmask); h.int_list(&d) };
        let kd = h.bool(keepdim);
        let os = out_shape(&shape, &rmask, keepdim);
        let out = h.out(ScalarType::Bool, &os);
        h.call("aten::any.dims_out", &[b, dims, kd, out, out]).unwrap();
        let want: Vec<f64> = groups(&shape, &rmask, &bools).iter().map(|g| g.iter().any(|&v| v != 0.0) as u8 as f64).collect();
        prop_assert_eq!(read(&mut h, out), want);

        let vals = rng.vec(n, 3.0);
        let x = tensor(&mut h, ScalarType::Float, &shape, &vals);
        let corr = h.int(1);
        let outv = h.out(ScalarType::Float, &os);
        h.call("aten::var.correction_out", &[x, dims, corr, kd, outv, outv]).unwrap();
        let want: Vec<f64> = groups(&shape, &rmask, &vals).iter().map(|g| {
            let g: Vec<f64> = g.iter().map(|&v| v as f32 as f64).collect();
            let m = g.iter().sum::<f64>() / g.len() as f64;
            let ss: f64 = g.iter().map(|v| (v - m) * (v - m)).sum();
            (ss / (g.len() as f64 - 1.0).max(0.0)) as f32 as f64
        }).collect();
        assert_close(&read(&mut h, outv), &want, 1e-5, 1e-6);
    }
}

#[test]
fn rmsnorm_mean_is_the_official_sequential_sum_at_any_thread_count() {
    // The official portable kernel adds in f32 one element after another and divides by
    // the count: the same bits on every thread count.
    for threads in [1, 2] {
        let mut h = harness(threads);
        let (s, d) = (64, 4096);
        let mut rng = Lcg(11);
        let vals: Vec<f64> = rng.vec(s * d, 1.0).iter().map(|v| v * v + 1000.0).collect();
        let x = tensor(&mut h, ScalarType::Float, &[1, s, d], &vals);
        let dims = h.int_list(&[-1]);
        let kd = h.bool(true);
        let none = h.none();
        let out = h.out(ScalarType::Float, &[1, s, 1]);
        h.call("aten::mean.out", &[x, dims, kd, none, out, out])
            .unwrap();
        let got = read(&mut h, out);
        for r in 0..s {
            let mut acc = 0f32;
            for &v in &vals[r * d..(r + 1) * d] {
                acc += v as f32;
            }
            let want = acc / d as f32;
            assert_eq!(got[r] as f32, want, "row {r}");
        }
    }
}

#[test]
fn sum_dtype_and_any_variants() {
    let mut h = Harness::new();
    let x = tensor(
        &mut h,
        ScalarType::Char,
        &[2, 2],
        &[100.0, 100.0, -1.0, 2.0],
    );
    let dims = h.int_list(&[1]);
    let f = h.bool(false);
    let long = h.int(ScalarType::Long as i64);
    let out = h.out(ScalarType::Long, &[2]);
    h.call("aten::sum.IntList_out", &[x, dims, f, long, out, out])
        .unwrap();
    assert_eq!(h.read::<i64>(out), vec![200, 1]);
    // dtype must match out.
    let float = h.int(ScalarType::Float as i64);
    assert_refused(
        &mut h,
        "aten::sum.IntList_out",
        &[x, dims, f, float, out, out],
    );
    // mean of ints needs a dtype.
    let none = h.none();
    let outf = h.out(ScalarType::Float, &[2]);
    assert_refused(&mut h, "aten::mean.out", &[x, dims, f, none, outf, outf]);
    h.call("aten::mean.out", &[x, dims, f, float, outf, outf])
        .unwrap();
    assert_eq!(h.read::<f32>(outf), vec![100.0, 0.5]);
    // any.out over one dim and any.all_out.
    let b = tensor(
        &mut h,
        ScalarType::Bool,
        &[2, 3],
        &[0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
    );
    let d = h.int(-1);
    let outb = h.out(ScalarType::Bool, &[2]);
    h.call("aten::any.out", &[b, d, f, outb, outb]).unwrap();
    assert_eq!(read(&mut h, outb), vec![1.0, 0.0]);
    let out0 = h.out(ScalarType::Bool, &[]);
    h.call("aten::any.all_out", &[b, out0, out0]).unwrap();
    assert_eq!(read(&mut h, out0), vec![1.0]);
    let outl = h.out(ScalarType::Long, &[]);
    assert_refused(&mut h, "aten::any.all_out", &[b, outl, outl]);
}

#[test]
fn nan_handling() {
    let mut h = Harness::new();
    let x = tensor(
        &mut h,
        ScalarType::Float,
        &[4],
        &[1.0, f64::NAN, 3.0, f64::NAN],
    );
    let dims = h.int_list(&[]);
    let f = h.bool(false);
    let out = h.out(ScalarType::Float, &[]);
    h.call("aten::amax.out", &[x, dims, f, out, out]).unwrap();
    assert!(h.read::<f32>(out)[0].is_nan());
    let none = h.none();
    let outi = h.out(ScalarType::Long, &[]);
    h.call("aten::argmax.out", &[x, none, f, outi, outi])
        .unwrap();
    assert_eq!(h.read::<i64>(outi), vec![1]);
    h.call("aten::argmin.out", &[x, none, f, outi, outi])
        .unwrap();
    assert_eq!(h.read::<i64>(outi), vec![1]);
}

#[test]
fn bad_calls_are_errors() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[2, 3], &[0.0; 6]);
    let f = h.bool(false);
    let none = h.none();
    let out = h.out(ScalarType::Float, &[3]);
    let dup = h.int_list(&[0, -2]);
    assert_refused(
        &mut h,
        "aten::sum.IntList_out",
        &[x, dup, f, none, out, out],
    );
    let far = h.int_list(&[2]);
    assert_refused(
        &mut h,
        "aten::sum.IntList_out",
        &[x, far, f, none, out, out],
    );
    let d0 = h.int_list(&[0]);
    assert_refused(&mut h, "aten::sum.IntList_out", &[x, d0, f, none, out]);
    let outi = h.out(ScalarType::Int, &[3]);
    assert_refused(&mut h, "aten::amax.out", &[x, d0, f, outi, outi]);
    assert_refused(&mut h, "aten::argmax.out", &[x, none, f, out, out]);
    let e = tensor(&mut h, ScalarType::Float, &[0, 3], &[]);
    assert_refused(&mut h, "aten::amax.out", &[e, d0, f, out, out]);
    let outl = h.out(ScalarType::Long, &[3]);
    let z = h.int(0);
    assert_refused(&mut h, "aten::argmax.out", &[e, z, f, outl, outl]);
    // Sum over an empty dim is zero; mean is NaN.
    h.call("aten::sum.IntList_out", &[e, d0, f, none, out, out])
        .unwrap();
    assert_eq!(h.read::<f32>(out), vec![0.0; 3]);
    h.call("aten::mean.out", &[e, d0, f, none, out, out])
        .unwrap();
    assert!(h.read::<f32>(out).iter().all(|v| v.is_nan()));
}
