//! The f32 GEMM and GEMV of every instruction set this CPU has, side by side (AVX-512
//! against AVX2 against the scalar twin), at LLM linear-layer shapes.
//!
//! Prefill (`m` rows) reports flop/s as criterion "elements"; decode (one row against a
//! `[n, k]` weight, as it is or packed once) reports weight bytes per second. Run with
//! `cargo bench -p etch-linalg --bench gemm_isa -- --warm-up-time 1 --measurement-time 3`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etch_linalg::{GemmF32, Isa, PackedB, RhsF32, ThreadPool, gemm_f32_with};

mod common;
use common::data;

fn bench(c: &mut Criterion) {
    let fast: Vec<Isa> = Isa::available()
        .iter()
        .copied()
        .filter(|i| *i != Isa::Scalar)
        .collect();
    for threads in [1usize, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        // Prefill: 128 tokens through a 2048 -> 2048 linear layer.
        let (m, n, k) = (128usize, 2048usize, 2048usize);
        let x = data(m * k, 1);
        let w = data(n * k, 2);
        let mut out = vec![0f32; m * n];
        let mut g = c.benchmark_group(format!("gemm_f32_{m}x{n}x{k}_t{threads}"));
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        for &isa in &fast {
            let p = GemmF32 {
                m,
                n,
                k,
                a: &x,
                lda: k,
                b: RhsF32::NK(&w),
                bias: None,
                clamp: None,
            };
            let mut scratch = vec![0f32; p.scratch_len(threads) * 2];
            g.bench_function(isa.name(), |b| {
                b.iter(|| gemm_f32_with(&pool, isa, &p, &mut out, &mut scratch).unwrap())
            });
            let packed = PackedB::pack(isa, &w, n, k, true).unwrap();
            let p = GemmF32 {
                b: RhsF32::Packed(&packed),
                ..p
            };
            g.bench_function(format!("{}_packed", isa.name()), |b| {
                b.iter(|| gemm_f32_with(&pool, isa, &p, &mut out, &mut scratch).unwrap())
            });
        }
        g.finish();
        // Decode: one token through a 2048 -> 8192 layer (64 MiB of f32 weights).
        let (n, k) = (8192usize, 2048usize);
        let x = data(k, 3);
        let w = data(n * k, 4);
        let mut out = vec![0f32; n];
        let mut g = c.benchmark_group(format!("gemv_f32_{n}x{k}_t{threads}"));
        g.throughput(Throughput::Bytes((n * k * 4) as u64));
        for &isa in &fast {
            let p = GemmF32 {
                m: 1,
                n,
                k,
                a: &x,
                lda: k,
                b: RhsF32::NK(&w),
                bias: None,
                clamp: None,
            };
            let mut scratch = vec![0f32; k];
            // Packed once (the XNNPACK delegate's fully-connected weights): each thread
            // streams one contiguous run of panels, on huge pages.
            let packed = PackedB::pack(isa, &w, n, k, true).unwrap();
            for (name, b) in [
                (isa.name().to_string(), RhsF32::NK(&w)),
                (format!("{}_packed", isa.name()), RhsF32::Packed(&packed)),
            ] {
                let p = GemmF32 { b, ..p };
                g.bench_function(name, |bench| {
                    bench.iter(|| gemm_f32_with(&pool, isa, &p, &mut out, &mut scratch).unwrap())
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
