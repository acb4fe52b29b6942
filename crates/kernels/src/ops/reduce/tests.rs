use std::ops::Range;

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

/// The dims a reduction over `mask` reduces: the marked ones, or every dim when
/// none is marked (an empty or absent dim list reduces them all).
fn reduced_mask(mask: &[bool]) -> Vec<bool> {
    if mask.iter().any(|&m| m) {
        mask.to_vec()
    } else {
        vec![true; mask.len()]
    }
}

/// The optional dim list argument for a reduction over `mask` (`None` when no dim
/// is marked, which reduces every dim), and the mask of the dims it reduces.
fn optional_dims_arg(h: &mut Harness, mask: &[bool]) -> (usize, Vec<bool>) {
    let rmask = reduced_mask(mask);
    let dims = if mask.iter().any(|&m| m) {
        let d = dims_of(&rmask);
        h.int_list(&d)
    } else {
        h.none()
    };
    (dims, rmask)
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
        let (dims, mask) = optional_dims_arg(&mut h, &mask);
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
        let rmask = reduced_mask(&mask);
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
        let (dims, rmask) = optional_dims_arg(&mut h, &mask);
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

/// The int8 input `[[100, 100], [-1, 2]]`, whose first row sum and whole product
/// overflow int8.
fn int8_overflowing(h: &mut Harness) -> usize {
    tensor(h, ScalarType::Char, &[2, 2], &[100.0, 100.0, -1.0, 2.0])
}

#[test]
fn sum_dtype_and_any_variants() {
    let mut h = Harness::new();
    let x = int8_overflowing(&mut h);
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

/// `max.dim_max` / `min.dim_min` into fresh outs: (values, indices).
fn extremum_dim(
    h: &mut Harness,
    max: bool,
    x: usize,
    dtype: ScalarType,
    dim: i64,
    keepdim: bool,
    os: &[usize],
) -> Result<(Vec<f64>, Vec<i64>), crate::KernelError> {
    let op = if max {
        "aten::max.dim_max"
    } else {
        "aten::min.dim_min"
    };
    let (d, kd) = (h.int(dim), h.bool(keepdim));
    let values = h.out(dtype, os);
    let indices = h.out(ScalarType::Long, os);
    let ret = h.tensor_list(&[values, indices]);
    h.call(op, &[x, d, kd, values, indices, ret])?;
    assert_eq!(h.tensor_meta(values).sizes(), os);
    assert_eq!(h.tensor_meta(indices).sizes(), os);
    Ok((read(h, values), h.read::<i64>(indices)))
}

/// A random reduction over one dim: the input shape (of rank 1 or more), a number
/// that picks the dim, whether the dim is kept, the input dtype, the seed of the
/// input values and the thread count.
#[derive(Clone, Debug)]
struct OneDimCase {
    shape: Vec<usize>,
    pick: usize,
    keepdim: bool,
    dtype: ScalarType,
    seed: u64,
    threads: usize,
}

/// Cases whose shapes have a rank in `rank` (starting at 1 or more) and dims of a
/// length in `dim_len`, with an input dtype from `dtypes`.
fn one_dim_cases(
    dim_len: Range<usize>,
    rank: Range<usize>,
    dtypes: &'static [ScalarType],
) -> impl Strategy<Value = OneDimCase> {
    (
        proptest::collection::vec(dim_len, rank),
        any::<usize>(),
        any::<bool>(),
        0..dtypes.len(),
        any::<u64>(),
        1usize..=2,
    )
        .prop_map(
            move |(shape, pick, keepdim, dt, seed, threads)| OneDimCase {
                shape,
                pick,
                keepdim,
                dtype: dtypes[dt],
                seed,
                threads,
            },
        )
}

impl OneDimCase {
    /// The dim reduced: `pick` modulo the rank.
    fn dim(&self) -> usize {
        self.pick % self.shape.len()
    }

    /// Small whole input values, exact in the case's dtype, drawn from its seed.
    fn small_int_values(&self) -> Vec<f64> {
        let n: usize = self.shape.iter().product();
        small_ints(&mut Lcg(self.seed), self.dtype, n)
    }

    /// The output shape, and the input values each output element reduces.
    fn expected_layout(&self, vals: &[f64]) -> (Vec<usize>, Vec<Vec<f64>>) {
        let d = self.dim();
        let mask: Vec<bool> = (0..self.shape.len()).map(|i| i == d).collect();
        (
            out_shape(&self.shape, &mask, self.keepdim),
            groups(&self.shape, &mask, vals),
        )
    }

    /// A harness with the case's thread count, holding `vals` as the input tensor.
    fn harness_with_input(&self, vals: &[f64]) -> (Harness, usize) {
        let mut h = harness(self.threads);
        let x = tensor(&mut h, self.dtype, &self.shape, vals);
        (h, x)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn max_min_dim_match_reference(
        case in one_dim_cases(
            0..5,
            1..5,
            &[ScalarType::Float, ScalarType::Char, ScalarType::Long, ScalarType::Half],
        ),
    ) {
        let vals = case.small_int_values();
        let (os, g) = case.expected_layout(&vals);
        let (mut h, x) = case.harness_with_input(&vals);
        let (d, rank) = (case.dim(), case.shape.len());
        // Negative dims name the same dim.
        let dim = if case.pick % 2 == 0 { d as i64 } else { d as i64 - rank as i64 };
        for max in [true, false] {
            let r = extremum_dim(&mut h, max, x, case.dtype, dim, case.keepdim, &os);
            if case.shape[d] == 0 && !g.is_empty() {
                prop_assert!(r.is_err());
                continue;
            }
            let (values, indices) = r.unwrap();
            let mut want_v = Vec::new();
            let mut want_i = Vec::new();
            for g in &g {
                let mut best = 0;
                for (i, &v) in g.iter().enumerate() {
                    if (max && v > g[best]) || (!max && v < g[best]) {
                        best = i;
                    }
                }
                want_v.push(g[best]);
                want_i.push(best as i64);
            }
            prop_assert_eq!(values, want_v);
            prop_assert_eq!(indices, want_i);
        }
    }
}

#[test]
fn max_min_dim_nan_and_ties() {
    let mut h = Harness::new();
    let v = [2.0, 5.0, 5.0, -3.0, 1.0, f64::NAN, -1.0, f64::NAN];
    let x = tensor(&mut h, ScalarType::Float, &[2, 4], &v);
    let (values, indices) =
        extremum_dim(&mut h, true, x, ScalarType::Float, 1, false, &[2]).unwrap();
    assert_eq!(values[0], 5.0);
    assert!(values[1].is_nan());
    assert_eq!(indices, vec![1, 1]);
    let (values, indices) =
        extremum_dim(&mut h, false, x, ScalarType::Float, -1, true, &[2, 1]).unwrap();
    assert_eq!(values[0], -3.0);
    assert!(values[1].is_nan());
    assert_eq!(indices, vec![3, 1]);
    // Signed zeros: the value is the element at the index.
    let z = tensor(&mut h, ScalarType::Float, &[2], &[-0.0, 0.0]);
    let values = h.out(ScalarType::Float, &[]);
    let indices = h.out(ScalarType::Long, &[]);
    let (d, kd) = (h.int(0), h.bool(false));
    let ret = h.tensor_list(&[values, indices]);
    h.call("aten::max.dim_max", &[z, d, kd, values, indices, ret])
        .unwrap();
    assert!(h.read::<f32>(values)[0].is_sign_negative());
    assert_eq!(h.read::<i64>(indices), vec![0]);
}

#[test]
fn max_min_dim_bad_calls() {
    let mut h = Harness::new();
    let x = tensor(&mut h, ScalarType::Float, &[2, 3], &[0.0; 6]);
    let op = "aten::max.dim_max";
    let (d, far, kd) = (h.int(1), h.int(2), h.bool(false));
    let vf = h.out(ScalarType::Float, &[2]);
    let vi = h.out(ScalarType::Int, &[2]);
    let il = h.out(ScalarType::Long, &[2]);
    let ii = h.out(ScalarType::Int, &[2]);
    let ret = h.tensor_list(&[vf, il]);
    h.call(op, &[x, d, kd, vf, il, ret]).unwrap();
    assert_refused(&mut h, op, &[x, far, kd, vf, il, ret]);
    assert_refused(&mut h, op, &[x, d, kd, vi, il, ret]);
    assert_refused(&mut h, op, &[x, d, kd, vf, ii, ret]);
    let small = h.out(ScalarType::Long, &[1]);
    assert_refused(&mut h, op, &[x, d, kd, vf, small, ret]);
    let e = tensor(&mut h, ScalarType::Float, &[2, 0], &[]);
    assert_refused(&mut h, "aten::min.dim_min", &[e, d, kd, vf, il, ret]);
}

#[test]
fn max_min_unary() {
    let mut h = Harness::new();
    let x = tensor(
        &mut h,
        ScalarType::Float,
        &[2, 3],
        &[3.0, -7.5, 9.25, 0.0, 2.0, 1.0],
    );
    let out = h.out(ScalarType::Float, &[]);
    h.call("aten::max.unary_out", &[x, out, out]).unwrap();
    assert_eq!(h.read::<f32>(out), vec![9.25]);
    h.call("aten::min.unary_out", &[x, out, out]).unwrap();
    assert_eq!(h.read::<f32>(out), vec![-7.5]);
    // Into a wider out dtype; integers.
    let od = h.out(ScalarType::Double, &[]);
    h.call("aten::min.unary_out", &[x, od, od]).unwrap();
    assert_eq!(h.read::<f64>(od), vec![-7.5]);
    let i = tensor(&mut h, ScalarType::Int, &[4], &[5.0, -2.0, 8.0, 8.0]);
    let oi = h.out(ScalarType::Int, &[]);
    h.call("aten::max.unary_out", &[i, oi, oi]).unwrap();
    assert_eq!(h.read::<i32>(oi), vec![8]);
    // NaN anywhere wins.
    let n = tensor(&mut h, ScalarType::Float, &[3], &[1.0, f64::NAN, 2.0]);
    h.call("aten::max.unary_out", &[n, out, out]).unwrap();
    assert!(h.read::<f32>(out)[0].is_nan());
    h.call("aten::min.unary_out", &[n, out, out]).unwrap();
    assert!(h.read::<f32>(out)[0].is_nan());
    // Errors: empty input, float into an integer out.
    let e = tensor(&mut h, ScalarType::Float, &[0], &[]);
    assert_refused(&mut h, "aten::max.unary_out", &[e, out, out]);
    assert_refused(&mut h, "aten::max.unary_out", &[x, oi, oi]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn prod_matches_reference(
        case in one_dim_cases(0..4, 1..4, &[ScalarType::Float, ScalarType::Int, ScalarType::Double]),
    ) {
        let dtype = case.dtype;
        let out_dtype = if dtype == ScalarType::Int { ScalarType::Long } else { dtype };
        // Values in -2..=2: products stay exact.
        let vals: Vec<f64> = case.small_int_values().into_iter().map(|v| (v / 2.5).trunc()).collect();
        let (os, g) = case.expected_layout(&vals);
        let (mut h, x) = case.harness_with_input(&vals);
        let (dv, kd, none) = (h.int(case.dim() as i64), h.bool(case.keepdim), h.none());
        let out = h.out(out_dtype, &os);
        h.call("aten::prod.int_out", &[x, dv, kd, none, out, out]).unwrap();
        let want: Vec<f64> = g.iter().map(|g| g.iter().product()).collect();
        prop_assert_eq!(read(&mut h, out), want);
        let all = h.out(out_dtype, &[]);
        h.call("aten::prod.out", &[x, none, all, all]).unwrap();
        prop_assert_eq!(read(&mut h, all), vec![vals.iter().product::<f64>()]);
    }
}

#[test]
fn prod_and_mean_dtypes_and_errors() {
    let mut h = Harness::new();
    let x = int8_overflowing(&mut h);
    let none = h.none();
    // An int8 product without dtype is int64 (no int8 overflow).
    let ol = h.out(ScalarType::Long, &[]);
    h.call("aten::prod.out", &[x, none, ol, ol]).unwrap();
    assert_eq!(h.read::<i64>(ol), vec![-20000]);
    let oc = h.out(ScalarType::Char, &[]);
    assert_refused(&mut h, "aten::prod.out", &[x, none, oc, oc]);
    // With dtype: out must be it, inputs are cast to it first.
    let float = h.int(ScalarType::Float as i64);
    let of = h.out(ScalarType::Float, &[]);
    h.call("aten::prod.out", &[x, float, of, of]).unwrap();
    assert_eq!(h.read::<f32>(of), vec![-20000.0]);
    assert_refused(&mut h, "aten::prod.out", &[x, float, ol, ol]);
    // Over an empty dim the product is 1.
    let e = tensor(&mut h, ScalarType::Float, &[2, 0], &[]);
    let (d1, f) = (h.int(1), h.bool(false));
    let o2 = h.out(ScalarType::Float, &[2]);
    h.call("aten::prod.int_out", &[e, d1, f, none, o2, o2])
        .unwrap();
    assert_eq!(h.read::<f32>(o2), vec![1.0, 1.0]);
    let far = h.int(2);
    assert_refused(&mut h, "aten::prod.int_out", &[e, far, f, none, o2, o2]);
    // mean.dtype_out: the mean of all, a float out; ints need a dtype.
    h.call("aten::mean.dtype_out", &[x, float, of, of]).unwrap();
    assert_eq!(h.read::<f32>(of), vec![50.25]);
    assert_refused(&mut h, "aten::mean.dtype_out", &[x, none, of, of]);
    let xf = tensor(&mut h, ScalarType::Float, &[3], &[1.0, 2.0, 4.5]);
    h.call("aten::mean.dtype_out", &[xf, none, of, of]).unwrap();
    assert_eq!(h.read::<f32>(of), vec![2.5]);
    let od = h.out(ScalarType::Double, &[]);
    assert_refused(&mut h, "aten::mean.dtype_out", &[xf, float, od, od]);
}

/// The variance of each group over `n - correction`, NaN where nothing is reduced or
/// the denominator is not positive (the official runtime's rule).
fn var_ref(groups: &[Vec<f64>], correction: f64) -> Vec<f64> {
    groups
        .iter()
        .map(|g| {
            let n = g.len() as f64;
            if g.is_empty() || n - correction <= 0.0 {
                return f64::NAN;
            }
            let m = g.iter().sum::<f64>() / n;
            let ss: f64 = g.iter().map(|v| (v - m) * (v - m)).sum();
            (ss / (n - correction)) as f32 as f64
        })
        .collect()
}

proptest! {
    #[test]
    fn var_out_and_var_mean((shape, mask, keepdim) in shape_and_dims(), seed in any::<u64>(), unbiased in any::<bool>()) {
        let n: usize = shape.iter().product();
        let mut rng = Lcg(seed);
        let vals: Vec<f64> = rng.vec(n, 3.0).iter().map(|&v| v as f32 as f64).collect();
        let mut h = Harness::new();
        let x = tensor(&mut h, ScalarType::Float, &shape, &vals);
        let (dims, rmask) = optional_dims_arg(&mut h, &mask);
        let kd = h.bool(keepdim);
        let os = out_shape(&shape, &rmask, keepdim);
        let g = groups(&shape, &rmask, &vals);

        let ub = h.bool(unbiased);
        let outv = h.out(ScalarType::Float, &os);
        h.call("aten::var.out", &[x, dims, ub, kd, outv, outv]).unwrap();
        let correction = if unbiased { 1.0 } else { 0.0 };
        assert_close(&read(&mut h, outv), &var_ref(&g, correction), 1e-5, 1e-6);

        // var_mean with a correction of 2 (NaN wherever fewer than 3 are reduced,
        // the mean too).
        let corr = h.double(2.0);
        let (o0, o1) = (h.out(ScalarType::Float, &os), h.out(ScalarType::Float, &os));
        h.call("aten::var_mean.correction_out", &[x, dims, corr, kd, o0, o1, o0, o1]).unwrap();
        assert_close(&read(&mut h, o0), &var_ref(&g, 2.0), 1e-5, 1e-6);
        let mean: Vec<f64> = g.iter().map(|g| {
            if g.len() < 3 { return f64::NAN; }
            let mut acc = 0f32;
            for &v in g { acc += v as f32; }
            (acc / g.len() as f32) as f64
        }).collect();
        prop_assert_eq!(format!("{:?}", read(&mut h, o1)), format!("{mean:?}"));
    }
}

#[test]
fn var_refuses_integers_and_a_mismatched_mean() {
    let mut h = Harness::new();
    let xi = tensor(&mut h, ScalarType::Int, &[3], &[1.0, 2.0, 4.0]);
    let xf = tensor(&mut h, ScalarType::Float, &[3], &[1.0, 2.0, 4.0]);
    let (none, t, f) = (h.none(), h.bool(true), h.bool(false));
    let of = h.out(ScalarType::Float, &[]);
    let oi = h.out(ScalarType::Int, &[]);
    assert_refused(&mut h, "aten::var.out", &[xi, none, t, f, of, of]);
    assert_refused(&mut h, "aten::var.out", &[xf, none, t, f, oi, oi]);
    h.call("aten::var.out", &[xf, none, f, f, of, of]).unwrap();
    assert_eq!(h.read::<f32>(of), vec![14.0 / 9.0]);
    let od = h.out(ScalarType::Double, &[]);
    let op = "aten::var_mean.correction_out";
    assert_refused(&mut h, op, &[xf, none, none, f, of, od, of, od]);
    // One element, correction 1: both outputs NaN, as the official runtime.
    let one = tensor(&mut h, ScalarType::Float, &[1], &[5.0]);
    let o2 = h.out(ScalarType::Float, &[]);
    h.call(op, &[one, none, none, f, of, o2, of, o2]).unwrap();
    assert!(h.read::<f32>(of)[0].is_nan() && h.read::<f32>(o2)[0].is_nan());
    // A larger correction than the count is NaN, not inf.
    let corr = h.int(5);
    h.call("aten::var.correction_out", &[xf, none, corr, f, of, of])
        .unwrap();
    assert!(h.read::<f32>(of)[0].is_nan());
}

#[test]
fn f32_sums_over_the_last_dims_keep_the_sequential_bits() {
    // The inner-runs path (`reduce/inner_runs.rs`): global average pooling's shape
    // (sixteen runs at once with AVX-512, then the rest), on one thread and on three.
    for threads in [1, 3] {
        for (shape, dims) in [
            (vec![2, 40, 7, 7], vec![2, 3]),
            (vec![3, 17, 5], vec![-1]),
            (vec![700, 64], vec![1]),
        ] {
            let n: usize = shape.iter().product();
            let run: usize = shape[shape.len() - dims.len()..].iter().product();
            let mut rng = Lcg(n as u64);
            let vals = rng.vec(n, 2.0);
            for mean in [false, true] {
                let mut h = harness(threads);
                let x = tensor(&mut h, ScalarType::Float, &shape, &vals);
                let d = h.int_list(&dims);
                let kd = h.bool(true);
                let none = h.none();
                let mut os = shape.clone();
                let rank = os.len();
                os[rank - dims.len()..].iter_mut().for_each(|s| *s = 1);
                let out = h.out(ScalarType::Float, &os);
                let name = if mean {
                    "aten::mean.out"
                } else {
                    "aten::sum.IntList_out"
                };
                h.call(name, &[x, d, kd, none, out, out]).unwrap();
                let got = read(&mut h, out);
                for (i, values) in vals.chunks_exact(run).enumerate() {
                    let s = values.iter().fold(0f32, |s, &v| s + v as f32);
                    let want = if mean { s / run as f32 } else { s };
                    assert_eq!(got[i], want as f64, "{name} {shape:?}, output {i}");
                }
            }
        }
    }
}
