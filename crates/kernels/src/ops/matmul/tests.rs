use etch_base::{Element, ScalarType};
use half::{bf16, f16};
use proptest::prelude::*;

use crate::ThreadPool;
use crate::ops::elementwise::testutil::Lcg;
use crate::testing::Harness;

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    Lcg(seed)
        .vec(n, 1.0)
        .into_iter()
        .map(|v| v as f32)
        .collect()
}

/// Naive `x [m, k] · w[n, k]^T + bias` in f64.
fn linear_ref(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            for kk in 0..k {
                s += x[i * k + kk] as f64 * w[j * k + kk] as f64;
            }
            out[i * n + j] = s + bias.map_or(0.0, |b| b[if b.len() == 1 { 0 } else { j }] as f64);
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], k: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = 1e-5 * (k as f64).sqrt().max(1.0);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what} at {i}: {g} vs {w}"
        );
    }
}

fn run_linear(h: &mut Harness, lead: &[usize], n: usize, k: usize, bias: bool, seed: u64) {
    let m: usize = lead.iter().product();
    let x = rand_vec(m * k, seed);
    let w = rand_vec(n * k, seed + 1);
    let b = rand_vec(n, seed + 2);
    let mut xs = lead.to_vec();
    xs.push(k);
    let xi = h.tensor(&xs, &x);
    let wi = h.tensor(&[n, k], &w);
    let bi = if bias { h.tensor(&[n], &b) } else { h.none() };
    let mut os = lead.to_vec();
    os.push(n);
    let out = h.out(ScalarType::Float, &os);
    h.call("aten::linear.out", &[xi, wi, bi, out, out]).unwrap();
    assert_eq!(h.tensor_meta(out).sizes(), &os[..]);
    let want = linear_ref(&x, &w, bias.then_some(&b[..]), m, n, k);
    assert_close(
        &h.read::<f32>(out),
        &want,
        k,
        &format!("linear {lead:?}x{n}x{k}"),
    );
}

#[test]
fn linear_model_shapes() {
    // Weights of a real model: [1536, 576], [576, 1536] and the [49152, 576] head.
    let mut h = Harness::with_pool(ThreadPool::new(2).unwrap());
    for (n, k) in [(1536, 576), (576, 1536), (49152, 576)] {
        run_linear(&mut h, &[1, 1], n, k, false, 1);
        run_linear(&mut h, &[1, 7], n, k, n != 49152, 2);
    }
}

#[test]
fn linear_small_shapes() {
    for threads in [1, 3] {
        let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
        for (lead, n, k) in [
            (vec![], 5, 3),
            (vec![1], 1, 1),
            (vec![2, 3], 17, 33),
            (vec![0], 4, 4),
            (vec![3], 0, 4),
            (vec![3], 4, 0),
            (vec![1, 40], 70, 300),
        ] {
            run_linear(&mut h, &lead, n, k, true, 9);
            run_linear(&mut h, &lead, n, k, false, 10);
        }
    }
}

/// `linear` in the half type `E` (f16 or bf16) against the f64 reference on the
/// rounded operands, within one rounding of the f32 result (`ulp`, relative).
fn check_linear_half<E: Element>(dtype: ScalarType, ulp: f64) {
    let (m, n, k) = (3, 37, 100);
    let round = |v: &[f32]| v.iter().map(|&a| E::from_f32(a)).collect::<Vec<E>>();
    let widen = |v: &[E]| v.iter().map(|a| a.to_f32()).collect::<Vec<f32>>();
    let x = round(&rand_vec(m * k, 1));
    let w = round(&rand_vec(n * k, 2));
    let b = round(&rand_vec(n, 3));
    for mm in [1, m] {
        let mut h = Harness::with_pool(ThreadPool::new(2).unwrap());
        let xi = h.tensor(&[mm, k], &x[..mm * k]);
        let wi = h.tensor(&[n, k], &w);
        let bi = h.tensor(&[n], &b);
        let out = h.out(dtype, &[mm, n]);
        h.call("aten::linear.out", &[xi, wi, bi, out, out]).unwrap();
        let want = linear_ref(&widen(&x[..mm * k]), &widen(&w), Some(&widen(&b)), mm, n, k);
        for (g, w) in h.read::<E>(out).iter().zip(&want) {
            let g = g.to_f64();
            assert!(
                (g - w).abs() <= ulp * (1.0 + w.abs()),
                "{dtype} m={mm}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn linear_half_types() {
    check_linear_half::<f16>(ScalarType::Half, 1e-3);
    check_linear_half::<bf16>(ScalarType::BFloat16, 8e-3);
}

#[test]
fn linear_bad_calls() {
    let mut h = Harness::new();
    let x = h.tensor(&[2, 3], &[0f32; 6]);
    let w = h.tensor(&[4, 3], &[0f32; 12]);
    let none = h.none();
    let out = h.out(ScalarType::Float, &[2, 4]);
    let w_bad = h.tensor(&[4, 2], &[0f32; 8]);
    assert!(
        h.call("aten::linear.out", &[x, w_bad, none, out, out])
            .is_err()
    );
    let w1 = h.tensor(&[12], &[0f32; 12]);
    assert!(
        h.call("aten::linear.out", &[x, w1, none, out, out])
            .is_err()
    );
    let b_bad = h.tensor(&[3], &[0f32; 3]);
    assert!(
        h.call("aten::linear.out", &[x, w, b_bad, out, out])
            .is_err()
    );
    let w16 = h.tensor(&[4, 3], &[f16::ZERO; 12]);
    assert!(
        h.call("aten::linear.out", &[x, w16, none, out, out])
            .is_err()
    );
    let wi = h.tensor(&[4, 3], &[0i64; 12]);
    let xi = h.tensor(&[2, 3], &[0i64; 6]);
    let oi = h.out(ScalarType::Long, &[2, 4]);
    assert!(h.call("aten::linear.out", &[xi, wi, none, oi, oi]).is_err());
    let small = h.out(ScalarType::Float, &[2, 3]);
    assert!(
        h.call("aten::linear.out", &[x, w, none, small, small])
            .is_err()
    );
    let s = h.tensor(&[], &[0f32]);
    assert!(h.call("aten::linear.out", &[s, w, none, out, out]).is_err());
    assert!(h.call("aten::linear.out", &[x, w, none, out]).is_err());
    // A valid call still works afterwards.
    h.call("aten::linear.out", &[x, w, none, out, out]).unwrap();
}

/// Naive batched matmul over row-major operands: x [b, m, k], y [b, k, n].
fn bmm_ref(x: &[f32], y: &[f32], b: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0f64; b * m * n];
    for bb in 0..b {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for kk in 0..k {
                    s += x[bb * m * k + i * k + kk] as f64 * y[bb * k * n + kk * n + j] as f64;
                }
                out[bb * m * n + i * n + j] = s;
            }
        }
    }
    out
}

#[test]
fn mm_addmm_bmm() {
    let mut h = Harness::with_pool(ThreadPool::new(2).unwrap());
    let (m, k, n) = (5, 7, 9);
    let x = rand_vec(m * k, 1);
    let y = rand_vec(k * n, 2);
    let xi = h.tensor(&[m, k], &x);
    let yi = h.tensor(&[k, n], &y);
    let out = h.out(ScalarType::Float, &[m, n]);
    h.call("aten::mm.out", &[xi, yi, out, out]).unwrap();
    let want = bmm_ref(&x, &y, 1, m, k, n);
    assert_close(&h.read::<f32>(out), &want, k, "mm");
    // addmm with a broadcast row and beta/alpha.
    let c = rand_vec(n, 3);
    let ci = h.tensor(&[n], &c);
    let beta = h.double(0.5);
    let alpha = h.int(2);
    h.call("aten::addmm.out", &[ci, xi, yi, beta, alpha, out, out])
        .unwrap();
    let want2: Vec<f64> = want
        .iter()
        .enumerate()
        .map(|(i, &v)| 2.0 * v + 0.5 * c[i % n] as f64)
        .collect();
    assert_close(&h.read::<f32>(out), &want2, k, "addmm");
    // beta = 0 ignores self, even NaN.
    let cn = h.tensor(&[m, n], &vec![f32::NAN; m * n]);
    let zero = h.double(0.0);
    let one = h.int(1);
    h.call("aten::addmm.out", &[cn, xi, yi, zero, one, out, out])
        .unwrap();
    assert_close(&h.read::<f32>(out), &want, k, "addmm beta=0");
    // bmm.
    let b = 3;
    let bx = rand_vec(b * m * k, 4);
    let by = rand_vec(b * k * n, 5);
    let bxi = h.tensor(&[b, m, k], &bx);
    let byi = h.tensor(&[b, k, n], &by);
    let bo = h.out(ScalarType::Float, &[b, m, n]);
    h.call("aten::bmm.out", &[bxi, byi, bo, bo]).unwrap();
    assert_close(&h.read::<f32>(bo), &bmm_ref(&bx, &by, b, m, k, n), k, "bmm");
    // Bad calls.
    assert!(h.call("aten::mm.out", &[xi, xi, out, out]).is_err());
    assert!(h.call("aten::bmm.out", &[xi, yi, out, out]).is_err());
    assert!(h.call("aten::bmm.out", &[bxi, bxi, bo, bo]).is_err());
    let cbad = h.tensor(&[2], &[0f32; 2]);
    assert!(
        h.call("aten::addmm.out", &[cbad, xi, yi, beta, alpha, out, out])
            .is_err()
    );
    let yd = h.tensor(&[k, n], &vec![0f64; k * n]);
    assert!(h.call("aten::mm.out", &[xi, yd, out, out]).is_err());
}

#[test]
fn f64_products() {
    let mut h = Harness::new();
    let x = h.tensor(&[2, 2], &[1f64, 2., 3., 4.]);
    let y = h.tensor(&[2, 2], &[5f64, 6., 7., 8.]);
    let out = h.out(ScalarType::Double, &[2, 2]);
    h.call("aten::mm.out", &[x, y, out, out]).unwrap();
    assert_eq!(h.read::<f64>(out), vec![19., 22., 43., 50.]);
    let c = h.tensor(&[2], &[1f64, -1.]);
    let beta = h.int(2);
    let alpha = h.double(0.5);
    h.call("aten::addmm.out", &[c, x, y, beta, alpha, out, out])
        .unwrap();
    assert_eq!(h.read::<f64>(out), vec![11.5, 9., 23.5, 23.]);
}

#[test]
fn matmul_ranks() {
    let mut h = Harness::new();
    let v = h.tensor(&[3], &[1f32, 2., 3.]);
    let m = h.tensor(&[3, 2], &[1f32, 2., 3., 4., 5., 6.]);
    let o0 = h.out(ScalarType::Float, &[]);
    h.call("aten::matmul.out", &[v, v, o0, o0]).unwrap();
    assert_eq!(h.read::<f32>(o0), vec![14.]);
    let o1 = h.out(ScalarType::Float, &[2]);
    h.call("aten::matmul.out", &[v, m, o1, o1]).unwrap();
    assert_eq!(h.read::<f32>(o1), vec![22., 28.]);
    let mt = h.tensor(&[2, 3], &[1f32, 3., 5., 2., 4., 6.]);
    h.call("aten::matmul.out", &[mt, v, o1, o1]).unwrap();
    assert_eq!(h.read::<f32>(o1), vec![22., 28.]);
    // Broadcast batch: [2, 1, 2, 3] x [4, 3, 2] -> [2, 4, 2, 2].
    let xb = rand_vec(12, 1);
    let yb = rand_vec(24, 2);
    let xi = h.tensor(&[2, 1, 2, 3], &xb);
    let yi = h.tensor(&[4, 3, 2], &yb);
    let ob = h.out(ScalarType::Float, &[2, 4, 2, 2]);
    h.call("aten::matmul.out", &[xi, yi, ob, ob]).unwrap();
    let got = h.read::<f32>(ob);
    for b0 in 0..2 {
        for b1 in 0..4 {
            let want = bmm_ref(&xb[b0 * 6..b0 * 6 + 6], &yb[b1 * 6..b1 * 6 + 6], 1, 2, 3, 2);
            assert_close(
                &got[(b0 * 4 + b1) * 4..(b0 * 4 + b1 + 1) * 4],
                &want,
                3,
                "matmul batch",
            );
        }
    }
    let bad = h.tensor(&[4], &[0f32; 4]);
    assert!(h.call("aten::matmul.out", &[v, bad, o0, o0]).is_err());
    let s = h.tensor(&[], &[1f32]);
    assert!(h.call("aten::matmul.out", &[s, v, o0, o0]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn bmm_matches_reference(b in 0usize..4, m in 0usize..20, k in 0usize..40, n in 0usize..40, threads in 1usize..3, seed in any::<u64>()) {
        let x = rand_vec(b * m * k, seed);
        let y = rand_vec(b * k * n, seed ^ 7);
        let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
        let xi = h.tensor(&[b, m, k], &x);
        let yi = h.tensor(&[b, k, n], &y);
        let out = h.out(ScalarType::Float, &[b, m, n]);
        h.call("aten::bmm.out", &[xi, yi, out, out]).unwrap();
        assert_close(&h.read::<f32>(out), &bmm_ref(&x, &y, b, m, k, n), k, "bmm");
    }
}
