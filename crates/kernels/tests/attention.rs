//! The llama attention kernels against a naive f64 reference: `custom_sdpa.out`,
//! `sdpa_with_kv_cache.out` and `custom_quantized_sdpa.out`, over random shapes
//! (sequence lengths, start positions, GQA ratios 1-4, odd head dims), masks, causal
//! flags, dtypes and thread counts, plus the argument checks.

use etch_base::{ScalarType, ShapeDynamism};
use etch_kernels::testing::Harness;
use etch_kernels::{EValue, KernelError, Tensor, ThreadPool};
use half::{bf16, f16};
use proptest::prelude::*;

/// A small deterministic generator (xorshift64*), so cases are cheap to build.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

/// Sizes of one attention case; tensors are `[B, S, H, D]` unless `seq_dim2`.
#[derive(Debug, Clone, Copy)]
struct Case {
    batch: usize,
    q_len: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    kv_len: usize,
    start_pos: usize,
    causal: bool,
    masked: bool,
    scale: Option<f64>,
    threads: usize,
    seed: u64,
}

/// Attention in f64. `q` is `[B, S_q, H_q, D]`, `k`/`v` `[B, S_kv, H_kv, D]` (or with S and
/// H swapped when `seq_dim2`), `mask` `[S_q, S_kv]`. Output in q's layout.
fn reference(
    c: &Case,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: Option<&[f64]>,
    seq_dim2: bool,
) -> Vec<f64> {
    let (b_n, sq, hq, hkv, d, skv) = (
        c.batch, c.q_len, c.q_heads, c.kv_heads, c.head_dim, c.kv_len,
    );
    let n_keys = if mask.is_some() {
        skv
    } else {
        c.start_pos + sq
    };
    let scale = c.scale.unwrap_or(1.0 / (d as f64).sqrt());
    let qi = |b: usize, i: usize, h: usize| {
        if seq_dim2 {
            ((b * hq + h) * sq + i) * d
        } else {
            ((b * sq + i) * hq + h) * d
        }
    };
    let ki = |b: usize, j: usize, h: usize| {
        if seq_dim2 {
            ((b * hkv + h) * skv + j) * d
        } else {
            ((b * skv + j) * hkv + h) * d
        }
    };
    let mut out = vec![0f64; b_n * sq * hq * d];
    let mut s = vec![0f64; n_keys];
    for b in 0..b_n {
        for i in 0..sq {
            for h in 0..hq {
                let hk = h / (hq / hkv);
                let qrow = &q[qi(b, i, h)..qi(b, i, h) + d];
                for (j, sj) in s.iter_mut().enumerate() {
                    let krow = &k[ki(b, j, hk)..ki(b, j, hk) + d];
                    let mut x = scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>();
                    if let Some(m) = mask {
                        x += m[i * skv + j];
                    }
                    if c.causal && j > c.start_pos + i {
                        x = f64::NEG_INFINITY;
                    }
                    *sj = x;
                }
                let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let sum: f64 = w.iter().sum();
                let o = &mut out[qi(b, i, h)..qi(b, i, h) + d];
                for (j, wj) in w.iter().enumerate() {
                    let vrow = &v[ki(b, j, hk)..ki(b, j, hk) + d];
                    for (x, y) in o.iter_mut().zip(vrow) {
                        *x += wj / sum * y;
                    }
                }
                if mx == f64::NEG_INFINITY {
                    o.fill(f64::NAN);
                }
            }
        }
    }
    out
}

fn shapes(c: &Case) -> ([usize; 4], [usize; 4]) {
    (
        [c.batch, c.q_len, c.q_heads, c.head_dim],
        [c.batch, c.kv_len, c.kv_heads, c.head_dim],
    )
}

/// A random mask with some -inf entries, never a fully masked row.
fn random_mask(rng: &mut Rng, c: &Case) -> Vec<f32> {
    let mut m = rng.vec(c.q_len * c.kv_len);
    for (i, x) in m.iter_mut().enumerate() {
        if rng.below(5) == 0 && i % c.kv_len != 0 {
            *x = f32::NEG_INFINITY;
        } else {
            *x *= 2.0;
        }
    }
    m
}

/// An element type the attention tests run in, with its tolerance.
trait TestFloat: etch_kernels::Element {
    /// Absolute tolerance of outputs in [-1, 1].
    const TOL: f64;
}

impl TestFloat for f32 {
    const TOL: f64 = 5e-5;
}

impl TestFloat for f16 {
    const TOL: f64 = 2e-3;
}

impl TestFloat for bf16 {
    const TOL: f64 = 1.2e-2;
}

fn harness(threads: usize) -> Harness {
    Harness::with_pool(ThreadPool::new(threads).unwrap())
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}: element {i}: got {g}, want NaN");
        } else {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what}: element {i}: got {g}, want {w}"
            );
        }
    }
}

/// The `attn_mask`, `dropout_p` (0), `is_causal` and `scale` arguments of case `c`.
fn attention_options(h: &mut Harness, c: &Case, mask: Option<&[f32]>) -> [usize; 4] {
    let mi = match mask {
        Some(m) => h.tensor(&[c.q_len, c.kv_len], m),
        None => h.none(),
    };
    let drop = h.double(0.0);
    let causal = h.bool(c.causal);
    let scale = match c.scale {
        Some(s) => h.double(s),
        None => h.none(),
    };
    [mi, drop, causal, scale]
}

/// Runs `custom_sdpa.out` on a case in dtype `E` and checks it against the reference.
fn check_custom_sdpa<E: TestFloat>(c: &Case) {
    let mut rng = Rng::new(c.seed);
    let (qs, ks) = shapes(c);
    let round = |x: Vec<f32>| x.into_iter().map(E::from_f32).collect::<Vec<E>>();
    let q = round(rng.vec(qs.iter().product()));
    let k = round(rng.vec(ks.iter().product()));
    let v = round(rng.vec(ks.iter().product()));
    let mask = c.masked.then(|| random_mask(&mut rng, c));
    let widen = |x: &[E]| x.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
    let mask64 = mask
        .as_ref()
        .map(|m| m.iter().map(|&x| x as f64).collect::<Vec<f64>>());
    let want = reference(
        c,
        &widen(&q),
        &widen(&k),
        &widen(&v),
        mask64.as_deref(),
        false,
    );

    let mut h = harness(c.threads);
    let (qi, ki, vi) = (h.tensor(&qs, &q), h.tensor(&ks, &k), h.tensor(&ks, &v));
    let sp = h.int(c.start_pos as i64);
    let [mi, drop, causal, scale] = attention_options(&mut h, c, mask.as_deref());
    // A dynamic out with a larger bound: the kernel must resize it.
    let out = h.out(E::DTYPE, &[c.batch, c.q_len + 3, c.q_heads, c.head_dim]);
    h.call(
        "llama::custom_sdpa.out",
        &[qi, ki, vi, sp, mi, drop, causal, scale, out, out],
    )
    .unwrap();
    assert_eq!(h.tensor_meta(out).sizes(), &qs);
    let got = widen(&h.read::<E>(out));
    assert_close(&got, &want, E::TOL, &format!("{} {c:?}", E::DTYPE));
}

prop_compose! {
    fn case()(
        batch in 1usize..3,
        kv_heads in 1usize..4,
        ratio in 1usize..5,
        head_dim in prop::sample::select(vec![1usize, 4, 7, 8, 16, 33, 64]),
        q_len in prop_oneof![3 => 1usize..4, 2 => 4usize..20, 1 => 20usize..70],
        start_pos in prop_oneof![2 => 0usize..4, 2 => 4usize..40, 1 => 100usize..300],
        extra in prop_oneof![0usize..3, 3usize..40],
        causal in any::<bool>(),
        masked in prop::bool::weighted(0.3),
        scale in prop::option::weighted(0.2, 0.05f64..0.5),
        threads in 1usize..4,
        seed in any::<u64>(),
    ) -> Case {
        Case {
            batch, q_len, q_heads: kv_heads * ratio, kv_heads, head_dim,
            kv_len: start_pos + q_len + extra, start_pos,
            causal: causal && !masked, masked, scale, threads, seed,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn custom_sdpa_f32_matches_reference(c in case()) {
        check_custom_sdpa::<f32>(&c);
    }

    #[test]
    fn custom_sdpa_f16_matches_reference(c in case()) {
        check_custom_sdpa::<f16>(&c);
    }

    #[test]
    fn custom_sdpa_bf16_matches_reference(c in case()) {
        check_custom_sdpa::<bf16>(&c);
    }

    #[test]
    fn sdpa_with_kv_cache_matches_update_then_attend(c in case()) {
        check_sdpa_with_kv_cache(&c);
    }

    #[test]
    fn quantized_sdpa_matches_dequantized_reference(c in case(), seq_dim2 in any::<bool>()) {
        check_quantized(&c, seq_dim2);
    }
}

fn base_case() -> Case {
    Case {
        batch: 1,
        q_len: 1,
        q_heads: 9,
        kv_heads: 3,
        head_dim: 64,
        kv_len: 2048,
        start_pos: 2000,
        causal: true,
        masked: false,
        scale: None,
        threads: 2,
        seed: 7,
    }
}

#[test]
fn decode_with_long_cache_splits_keys() {
    // 9 query heads over 3 KV heads and 2 or 4 threads: fewer items than threads x 2,
    // so keys are split across tasks and merged.
    for (threads, start_pos) in [(1, 2047), (2, 2047), (4, 1500), (3, 130), (2, 0)] {
        let c = Case {
            threads,
            start_pos,
            ..base_case()
        };
        check_custom_sdpa::<f32>(&c);
        check_custom_sdpa::<bf16>(&c);
    }
    let c = Case {
        kv_heads: 1,
        q_heads: 4,
        batch: 2,
        threads: 4,
        start_pos: 700,
        ..base_case()
    };
    check_custom_sdpa::<f32>(&c);
    let c = Case {
        causal: false,
        masked: true,
        threads: 3,
        ..base_case()
    };
    check_custom_sdpa::<f32>(&c);
}

#[test]
fn prefill_blocks() {
    for threads in [1, 2, 3] {
        let c = Case {
            q_len: 128,
            start_pos: 0,
            kv_len: 300,
            threads,
            ..base_case()
        };
        check_custom_sdpa::<f32>(&c);
        let c = Case {
            q_len: 100,
            start_pos: 150,
            kv_len: 260,
            threads,
            head_dim: 33,
            ..base_case()
        };
        check_custom_sdpa::<f32>(&c);
        check_custom_sdpa::<f16>(&c);
    }
}

#[test]
fn unit_and_empty_dims() {
    for c in [
        Case {
            q_len: 1,
            start_pos: 0,
            kv_len: 1,
            q_heads: 1,
            kv_heads: 1,
            head_dim: 1,
            ..base_case()
        },
        Case {
            batch: 0,
            kv_len: 8,
            start_pos: 2,
            ..base_case()
        },
        Case {
            q_len: 0,
            kv_len: 8,
            start_pos: 2,
            ..base_case()
        },
        Case {
            head_dim: 0,
            kv_len: 8,
            start_pos: 2,
            ..base_case()
        },
        Case {
            q_heads: 0,
            kv_heads: 1,
            kv_len: 8,
            start_pos: 2,
            ..base_case()
        },
    ] {
        check_custom_sdpa::<f32>(&c);
    }
}

/// Arguments of a `custom_sdpa.out` call, editable before the call.
struct Call {
    h: Harness,
    args: [usize; 10],
}

impl Call {
    fn new(c: &Case) -> Self {
        let mut rng = Rng::new(c.seed);
        let (qs, ks) = shapes(c);
        let mut h = Harness::new();
        let q = h.tensor(&qs, &rng.vec(qs.iter().product()));
        let k = h.tensor(&ks, &rng.vec(ks.iter().product()));
        let v = h.tensor(&ks, &rng.vec(ks.iter().product()));
        let sp = h.int(c.start_pos as i64);
        let mask = h.none();
        let drop = h.double(0.0);
        let causal = h.bool(c.causal);
        let scale = h.none();
        let out = h.out(ScalarType::Float, &qs);
        Self {
            h,
            args: [q, k, v, sp, mask, drop, causal, scale, out, out],
        }
    }

    fn set(&mut self, i: usize, v: EValue) -> &mut Self {
        let idx = self.h.push(v);
        self.args[i] = idx;
        if i == 8 {
            self.args[9] = idx;
        }
        self
    }

    fn set_tensor<T: etch_kernels::Element>(
        &mut self,
        i: usize,
        sizes: &[usize],
        data: &[T],
    ) -> &mut Self {
        let idx = self.h.tensor(sizes, data);
        self.args[i] = idx;
        self
    }

    fn call(&mut self) -> Result<(), KernelError> {
        self.h.call("llama::custom_sdpa.out", &self.args)
    }
}

#[test]
fn custom_sdpa_bad_calls() {
    let c = Case {
        q_len: 2,
        kv_len: 8,
        start_pos: 3,
        head_dim: 4,
        q_heads: 4,
        kv_heads: 2,
        ..base_case()
    };
    assert!(Call::new(&c).call().is_ok());
    // mask together with is_causal
    let m = vec![0f32; 2 * 8];
    assert!(Call::new(&c).set_tensor(4, &[2, 8], &m).call().is_err());
    let nc = Case { causal: false, ..c };
    assert!(Call::new(&nc).set_tensor(4, &[2, 8], &m).call().is_ok());
    // mask of the wrong shape / rank / dtype
    assert!(
        Call::new(&nc)
            .set_tensor(4, &[2, 7], &m[..14])
            .call()
            .is_err()
    );
    assert!(Call::new(&nc).set_tensor(4, &[16], &m).call().is_err());
    assert!(
        Call::new(&nc)
            .set_tensor(4, &[2, 8], &[0f64; 16])
            .call()
            .is_err()
    );
    assert!(
        Call::new(&nc)
            .set_tensor(4, &[2, 8], &[0u8; 16])
            .call()
            .is_err()
    );
    // start_pos + S_q > S_kv, negative start_pos
    assert!(Call::new(&c).set(3, EValue::Int(7)).call().is_err());
    assert!(Call::new(&c).set(3, EValue::Int(6)).call().is_ok());
    assert!(Call::new(&c).set(3, EValue::Int(-1)).call().is_err());
    // H_q not a multiple of H_kv
    let g = Case { q_heads: 3, ..c };
    assert!(Call::new(&g).call().is_err());
    let g = Case {
        q_heads: 2,
        kv_heads: 4,
        ..c
    };
    assert!(Call::new(&g).call().is_err());
    // head dim mismatch, batch mismatch, k/v shape mismatch
    assert!(
        Call::new(&c)
            .set_tensor(1, &[1, 8, 2, 3], &[0f32; 48])
            .call()
            .is_err()
    );
    assert!(
        Call::new(&c)
            .set_tensor(1, &[2, 8, 2, 4], &[0f32; 128])
            .call()
            .is_err()
    );
    assert!(
        Call::new(&c)
            .set_tensor(2, &[1, 9, 2, 4], &[0f32; 72])
            .call()
            .is_err()
    );
    // rank
    assert!(
        Call::new(&c)
            .set_tensor(0, &[2, 4, 4], &[0f32; 32])
            .call()
            .is_err()
    );
    // dtypes: k in another dtype, int q, out dtype
    assert!(
        Call::new(&c)
            .set_tensor(1, &[1, 8, 2, 4], &[f16::ZERO; 64])
            .call()
            .is_err()
    );
    assert!(
        Call::new(&c)
            .set_tensor(0, &[1, 2, 4, 4], &[0i32; 32])
            .call()
            .is_err()
    );
    let mut call = Call::new(&c);
    let bad_out = call.h.out(ScalarType::Half, &[1, 2, 4, 4]);
    call.args[8] = bad_out;
    call.args[9] = bad_out;
    assert!(call.call().is_err());
    // an out too small to resize into
    let mut call = Call::new(&c);
    let small = call.h.out(ScalarType::Float, &[1, 1, 4, 4]);
    call.args[8] = small;
    call.args[9] = small;
    assert!(call.call().is_err());
    // argument kinds and count
    assert!(matches!(
        Call::new(&c).set(6, EValue::Int(1)).call(),
        Err(KernelError::Argument { .. })
    ));
    assert!(matches!(
        Call::new(&c).set(3, EValue::Double(1.0)).call(),
        Err(KernelError::Argument { .. })
    ));
    assert!(matches!(
        Call::new(&c).set(7, EValue::Bool(true)).call(),
        Err(KernelError::Argument { .. })
    ));
    let mut call = Call::new(&c);
    let args = call.args;
    assert!(matches!(
        call.h.call("llama::custom_sdpa.out", &args[..9]),
        Err(KernelError::OpArgCount { .. })
    ));
    // a non-contiguous key
    let mut call = Call::new(&c);
    let k = call.h.tensor_meta(call.args[1]);
    let perm = Tensor::with_layout(
        ScalarType::Float,
        k.sizes(),
        &[0, 2, 1, 3],
        ShapeDynamism::Static,
        k.data(),
    )
    .unwrap();
    call.set(1, EValue::Tensor(perm));
    assert!(call.call().is_err());
    // a tensor without data
    let mut call = Call::new(&c);
    let unbound = Tensor::new(ScalarType::Float, &[1, 8, 2, 4], None).unwrap();
    call.set(2, EValue::Tensor(unbound));
    assert!(matches!(call.call(), Err(KernelError::NoData)));
}

#[test]
fn fully_masked_rows_give_nan_without_panicking() {
    let c = Case {
        q_len: 2,
        kv_len: 6,
        start_pos: 0,
        causal: false,
        head_dim: 4,
        q_heads: 2,
        kv_heads: 1,
        ..base_case()
    };
    let mut call = Call::new(&c);
    let mut m = vec![0f32; 12];
    m[..6].fill(f32::NEG_INFINITY);
    call.set_tensor(4, &[2, 6], &m);
    call.call().unwrap();
    let out = call.args[8];
    let got = call.h.read::<f32>(out);
    // query 0 (both heads) is fully masked, query 1 is not
    assert!(got[..8].iter().all(|x| x.is_nan()));
    assert!(got[8..].iter().all(|x| x.is_finite()));
}

/// sdpa_with_kv_cache versus update_cache twice then custom_sdpa, on the same caches.
fn check_sdpa_with_kv_cache(c: &Case) {
    let mut rng = Rng::new(c.seed ^ 0xABCD);
    let (qs, ks) = shapes(c);
    let new = [c.batch, c.q_len, c.kv_heads, c.head_dim];
    let q = rng.vec(qs.iter().product());
    let k_new = rng.vec(new.iter().product());
    let v_new = rng.vec(new.iter().product());
    let kc = rng.vec(ks.iter().product());
    let vc = rng.vec(ks.iter().product());
    let mask = c.masked.then(|| random_mask(&mut rng, c));
    let run = |fused: bool| {
        let mut h = harness(c.threads);
        let (qi, ki, vi) = (
            h.tensor(&qs, &q),
            h.tensor(&new, &k_new),
            h.tensor(&new, &v_new),
        );
        let (kci, vci) = (h.tensor(&ks, &kc), h.tensor(&ks, &vc));
        let sp = h.int(c.start_pos as i64);
        let sl = h.int(c.q_len as i64);
        let [mi, drop, causal, scale] = attention_options(&mut h, c, mask.as_deref());
        let out = h.out(ScalarType::Float, &qs);
        if fused {
            h.call(
                "llama::sdpa_with_kv_cache.out",
                &[
                    qi, ki, vi, kci, vci, sp, sl, mi, drop, causal, scale, out, out,
                ],
            )
            .unwrap();
        } else {
            let placeholder = h.out(ScalarType::Float, &[1]);
            for (x, cache) in [(ki, kci), (vi, vci)] {
                h.call(
                    "llama::update_cache.out",
                    &[x, cache, sp, placeholder, placeholder],
                )
                .unwrap();
            }
            h.call(
                "llama::custom_sdpa.out",
                &[qi, kci, vci, sp, mi, drop, causal, scale, out, out],
            )
            .unwrap();
        }
        (h.read::<f32>(out), h.read::<f32>(kci), h.read::<f32>(vci))
    };
    let (fused, separate) = (run(true), run(false));
    assert_eq!(fused.1, separate.1, "key cache");
    assert_eq!(fused.2, separate.2, "value cache");
    let f: Vec<f64> = fused.0.iter().map(|&x| x as f64).collect();
    let s: Vec<f64> = separate.0.iter().map(|&x| x as f64).collect();
    assert_close(&f, &s, 1e-6, "sdpa_with_kv_cache");
}

#[test]
fn sdpa_with_kv_cache_rejects_before_writing() {
    let mut h = Harness::new();
    let q = h.tensor(&[1, 2, 2, 4], &[0.5f32; 16]);
    let k = h.tensor(&[1, 2, 1, 4], &[1f32; 8]);
    let v = h.tensor(&[1, 2, 1, 4], &[1f32; 8]);
    let kc = h.tensor(&[1, 4, 1, 4], &[0f32; 16]);
    let vc = h.tensor(&[1, 4, 1, 4], &[0f32; 16]);
    let none = h.none();
    let (drop, t, f) = (h.double(0.0), h.bool(true), h.bool(false));
    let out = h.out(ScalarType::Float, &[1, 2, 2, 4]);
    let call = |h: &mut Harness, sp: i64, sl: i64, mask: usize, causal: usize| {
        let (sp, sl) = (h.int(sp), h.int(sl));
        h.call(
            "llama::sdpa_with_kv_cache.out",
            &[q, k, v, kc, vc, sp, sl, mask, drop, causal, none, out, out],
        )
    };
    // start_pos + S > S_max
    assert!(call(&mut h, 3, 2, none, t).is_err());
    // seq_len too long
    assert!(call(&mut h, 1, 4, none, t).is_err());
    // negative start_pos / seq_len
    assert!(call(&mut h, -1, 2, none, t).is_err());
    assert!(call(&mut h, 0, -2, none, t).is_err());
    // mask with is_causal
    let m = h.tensor(&[2, 4], &[0f32; 8]);
    assert!(call(&mut h, 0, 2, m, t).is_err());
    assert!(
        h.read::<f32>(kc).iter().all(|&x| x == 0.0),
        "caches untouched"
    );
    assert!(h.read::<f32>(vc).iter().all(|&x| x == 0.0));
    assert!(call(&mut h, 2, 2, none, t).is_ok());
    assert_eq!(h.read::<f32>(kc)[8..], [1f32; 8]);
    assert!(call(&mut h, 0, 2, m, f).is_ok());
    // arg count
    assert!(matches!(
        h.call("llama::sdpa_with_kv_cache.out", &[q, k, v]),
        Err(KernelError::OpArgCount { .. })
    ));
}

/// Per-token asymmetric int8 quantization of rows of `width` (as the export does it).
fn quantize(x: &[f32], width: usize) -> (Vec<i8>, Vec<f32>, Vec<i8>) {
    let mut q = Vec::with_capacity(x.len());
    let (mut scales, mut zps) = (Vec::new(), Vec::new());
    for row in x.chunks(width) {
        let lo = row.iter().copied().fold(0f32, f32::min);
        let hi = row.iter().copied().fold(0f32, f32::max);
        let scale = ((hi - lo) / 255.0).max(1e-4);
        let zp = (-128.0 - lo / scale).round().clamp(-128.0, 127.0);
        q.extend(
            row.iter()
                .map(|&v| ((v / scale).round() + zp).clamp(-128.0, 127.0) as i8),
        );
        scales.push(scale);
        zps.push(zp as i8);
    }
    (q, scales, zps)
}

fn dequantize(q: &[i8], scales: &[f32], zps: &[i8], width: usize) -> Vec<f64> {
    q.chunks(width)
        .zip(scales.iter().zip(zps))
        .flat_map(|(row, (&s, &z))| row.iter().map(move |&x| (x as f64 - z as f64) * s as f64))
        .collect()
}

fn check_quantized(c: &Case, seq_dim2: bool) {
    let mut rng = Rng::new(c.seed ^ 0x5151);
    let d = c.head_dim.max(1);
    let (qs, ks) = shapes(c);
    let (qs, ks) = if seq_dim2 {
        ([qs[0], qs[2], qs[1], qs[3]], [ks[0], ks[2], ks[1], ks[3]])
    } else {
        (qs, ks)
    };
    let pq = |s: [usize; 4]| [s[0], s[1], s[2], 1];
    let (q, qsc, qzp) = quantize(&rng.vec(qs.iter().product()), d);
    let (k, ksc, kzp) = quantize(&rng.vec(ks.iter().product()), d);
    let (v, vsc, vzp) = quantize(&rng.vec(ks.iter().product()), d);
    let mask = c.masked.then(|| random_mask(&mut rng, c));
    let mask64 = mask
        .as_ref()
        .map(|m| m.iter().map(|&x| x as f64).collect::<Vec<f64>>());
    let want = reference(
        c,
        &dequantize(&q, &qsc, &qzp, d),
        &dequantize(&k, &ksc, &kzp, d),
        &dequantize(&v, &vsc, &vzp, d),
        mask64.as_deref(),
        seq_dim2,
    );
    let mut h = harness(c.threads);
    let (qi, ki, vi) = (h.tensor(&qs, &q), h.tensor(&ks, &k), h.tensor(&ks, &v));
    let params = [
        h.tensor(&pq(qs), &qzp),
        h.tensor(&pq(qs), &qsc),
        h.tensor(&pq(ks), &kzp),
        h.tensor(&pq(ks), &ksc),
        h.tensor(&pq(ks), &vzp),
        h.tensor(&pq(ks), &vsc),
    ];
    let sp = h.int(c.start_pos as i64);
    let [mi, drop, causal, scale] = attention_options(&mut h, c, mask.as_deref());
    let dim2 = h.bool(seq_dim2);
    let out = h.out(ScalarType::Float, &qs);
    let mut args = vec![qi, ki, vi, sp, mi, drop, causal, scale];
    args.extend(params);
    args.extend([dim2, out, out]);
    h.call("llama::custom_quantized_sdpa.out", &args).unwrap();
    let got: Vec<f64> = h.read::<f32>(out).iter().map(|&x| x as f64).collect();
    assert_close(
        &got,
        &want,
        5e-5,
        &format!("quantized {c:?} seq_dim2={seq_dim2}"),
    );
}

#[test]
fn quantized_decode_long_cache() {
    for threads in [1, 2, 4] {
        check_quantized(
            &Case {
                threads,
                ..base_case()
            },
            false,
        );
    }
    check_quantized(
        &Case {
            threads: 2,
            q_len: 40,
            start_pos: 100,
            kv_len: 200,
            ..base_case()
        },
        true,
    );
}

#[test]
fn quantized_bad_calls() {
    let mut h = Harness::new();
    let q = h.tensor(&[1, 1, 2, 4], &[1i8; 8]);
    let k = h.tensor(&[1, 4, 1, 4], &[1i8; 16]);
    let qz = h.tensor(&[1, 1, 2, 1], &[0i8; 2]);
    let qs = h.tensor(&[1, 1, 2, 1], &[0.1f32; 2]);
    let kz = h.tensor(&[1, 4, 1, 1], &[0i8; 4]);
    let ks = h.tensor(&[1, 4, 1, 1], &[0.1f32; 4]);
    let sp = h.int(1);
    let none = h.none();
    let (drop, t, f) = (h.double(0.0), h.bool(true), h.bool(false));
    let out = h.out(ScalarType::Float, &[1, 1, 2, 4]);
    let base = [
        q, k, k, sp, none, drop, t, none, qz, qs, kz, ks, kz, ks, f, out, out,
    ];
    assert!(h.call("llama::custom_quantized_sdpa.out", &base).is_ok());
    let got = h.read::<f32>(out);
    assert!(got.iter().all(|&x| (x - 0.1).abs() < 1e-6), "{got:?}");
    let with = |i: usize, v: usize| {
        let mut a = base;
        a[i] = v;
        a
    };
    // a missing qparam
    for i in 8..14 {
        assert!(
            h.call("llama::custom_quantized_sdpa.out", &with(i, none))
                .is_err(),
            "arg {i}"
        );
    }
    // swapped scale / zero point dtypes, wrong qparam shape
    assert!(
        h.call("llama::custom_quantized_sdpa.out", &with(8, qs))
            .is_err()
    );
    assert!(
        h.call("llama::custom_quantized_sdpa.out", &with(11, kz))
            .is_err()
    );
    assert!(
        h.call("llama::custom_quantized_sdpa.out", &with(9, ks))
            .is_err()
    );
    // float q, f16 out
    let fq = h.tensor(&[1, 1, 2, 4], &[1f32; 8]);
    assert!(
        h.call("llama::custom_quantized_sdpa.out", &with(0, fq))
            .is_err()
    );
    let hout = h.out(ScalarType::Half, &[1, 1, 2, 4]);
    let mut a = with(15, hout);
    a[16] = hout;
    assert!(h.call("llama::custom_quantized_sdpa.out", &a).is_err());
    // start_pos past the cache
    let far = h.int(4);
    assert!(
        h.call("llama::custom_quantized_sdpa.out", &with(3, far))
            .is_err()
    );
    // arg count
    assert!(matches!(
        h.call("llama::custom_quantized_sdpa.out", &base[..16]),
        Err(KernelError::OpArgCount { .. })
    ));
}
