//! Attention benchmarks: `llama::custom_sdpa.out` (etch, serial and on a thread pool)
//! against a naive implementation, for decode (1 query, 9 heads over 3 KV heads,
//! head dim 64, cache lengths 128, 512 and 2048) and a 128-token prefill. The temp
//! bytes each call takes are printed once per configuration.
//!
//! `cargo bench -p etch-kernels --bench attention -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use etch_base::ScalarType;
use etch_kernels::testing::Harness;
use etch_kernels::{ThreadPool, default_threads};
use etch_memory::allocator::ArenaAllocator;

const HQ: usize = 9;
const HKV: usize = 3;
const D: usize = 64;

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1 << 23) as f32 - 1.0
        })
        .collect()
}

struct Setup {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    q_len: usize,
    kv_len: usize,
    start_pos: usize,
}

fn setup(q_len: usize, keys: usize) -> Setup {
    Setup {
        q: data(q_len * HQ * D, 1),
        k: data(keys * HKV * D, 2),
        v: data(keys * HKV * D, 3),
        q_len,
        kv_len: keys,
        start_pos: keys - q_len,
    }
}

/// A harness holding one custom_sdpa call; returns it with its arguments.
fn etch_call(s: &Setup, threads: usize) -> (Harness, [usize; 10]) {
    let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
    h.temp = Some(Box::new(ArenaAllocator::with_capacity(64 << 20).unwrap()));
    let q = h.tensor(&[1, s.q_len, HQ, D], &s.q);
    let k = h.tensor(&[1, s.kv_len, HKV, D], &s.k);
    let v = h.tensor(&[1, s.kv_len, HKV, D], &s.v);
    let sp = h.int(s.start_pos as i64);
    let none = h.none();
    let drop = h.double(0.0);
    let causal = h.bool(true);
    let out = h.out(ScalarType::Float, &[1, s.q_len, HQ, D]);
    (h, [q, k, v, sp, none, drop, causal, none, out, out])
}

/// Textbook attention: scores, softmax, weighted sum, one (query, head) at a time.
fn naive(s: &Setup, scores: &mut [f32], out: &mut [f32]) {
    let scale = 1.0 / (D as f32).sqrt();
    for i in 0..s.q_len {
        let n_keys = s.start_pos + i + 1;
        for h in 0..HQ {
            let hk = h / (HQ / HKV);
            let q = &s.q[(i * HQ + h) * D..][..D];
            for (j, sc) in scores[..n_keys].iter_mut().enumerate() {
                let k = &s.k[(j * HKV + hk) * D..][..D];
                *sc = scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>();
            }
            let mx = scores[..n_keys]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for sc in &mut scores[..n_keys] {
                *sc = (*sc - mx).exp();
                sum += *sc;
            }
            let o = &mut out[(i * HQ + h) * D..][..D];
            o.fill(0.0);
            for (j, p) in scores[..n_keys].iter().enumerate() {
                let v = &s.v[(j * HKV + hk) * D..][..D];
                for (x, y) in o.iter_mut().zip(v) {
                    *x += p / sum * y;
                }
            }
        }
    }
}

fn bench_case(c: &mut Criterion, group: &str, q_len: usize, keys: usize) {
    let s = setup(q_len, keys);
    let mut g = c.benchmark_group(group);
    let mut thread_counts = vec![1];
    if default_threads() > 1 {
        thread_counts.push(default_threads());
    }
    for threads in thread_counts {
        let (mut h, args) = etch_call(&s, threads);
        h.call("llama::custom_sdpa.out", &args).unwrap();
        let temp = h.temp.as_ref().unwrap().stats().peak_bytes_live;
        eprintln!("{group}/etch-{threads}t/{keys}: temp bytes per call = {temp}");
        g.bench_with_input(
            BenchmarkId::new(format!("etch-{threads}t"), keys),
            &keys,
            |b, _| b.iter(|| h.call("llama::custom_sdpa.out", black_box(&args)).unwrap()),
        );
    }
    let mut scores = vec![0f32; keys];
    let mut out = vec![0f32; q_len * HQ * D];
    g.bench_with_input(BenchmarkId::new("naive", keys), &keys, |b, _| {
        b.iter(|| naive(black_box(&s), &mut scores, &mut out))
    });
    g.finish();
}

fn decode(c: &mut Criterion) {
    for keys in [128, 512, 2048] {
        bench_case(c, "decode", 1, keys);
    }
}

fn prefill(c: &mut Criterion) {
    bench_case(c, "prefill128", 128, 128);
}

criterion_group!(benches, decode, prefill);
criterion_main!(benches);
