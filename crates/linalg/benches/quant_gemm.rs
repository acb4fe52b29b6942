//! The qd8 x int4 product (8da4w linear layers) on every instruction set of this CPU,
//! at SmolLM2-135M shapes: decode (one token) against the 576 -> 1536 MLP layer and the
//! 576 -> 49152 output layer, prefill (128 tokens) against 576 -> 1536; and one token
//! against 576 -> 196608 (56 MB of codes, more than the caches: the memory-streaming
//! rate of the best kernel, what a decoded token's layers see).
//!
//! Decode reports weight bytes (4-bit codes) per second, prefill int8 multiply-adds per
//! second, as criterion "elements". Run with
//! `cargo bench -p etch-linalg --bench quant_gemm -- --warm-up-time 1 --measurement-time 3`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etch_linalg::quant::{
    Qd8Rows, Qd8Weights, gemm_qd8_scratch_len, gemm_qd8_with, qd8_row_stride, quantize_qd8,
};
use etch_linalg::{Isa, ThreadPool};

mod common;
use common::data;

fn bench(c: &mut Criterion) {
    for threads in [1usize, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        for (m, n, k) in [
            (1usize, 1536usize, 576usize),
            (1, 49152, 576),
            (1, 196608, 576),
            (128, 1536, 576),
        ] {
            let scales = vec![0.01f32; n * k / 32];
            let w = Qd8Weights::from_int4(n, k, 32, &scales, |j, c| ((j * 7 + c * 3) % 16) as u8)
                .unwrap();
            let x = data(m * k, 1);
            let mut q = vec![0i8; m * qd8_row_stride(k)];
            let mut params = vec![0f32; 2 * m];
            quantize_qd8(&x, k, &mut q, &mut params).unwrap();
            let rows = Qd8Rows {
                m,
                q: &q,
                params: &params,
            };
            let mut out = vec![0f32; m * n];
            let mut scratch = vec![0f32; gemm_qd8_scratch_len(m, &w)];
            let mut g = c.benchmark_group(format!("qd8_qb4w_{m}x{n}x{k}_t{threads}"));
            g.throughput(Throughput::Elements(if m == 1 {
                (n * k / 2) as u64
            } else {
                (m * n * k) as u64
            }));
            for &isa in Isa::available() {
                if (isa == Isa::Scalar && (m > 1 || n > 2048)) || (n > 49152 && isa != Isa::best())
                {
                    continue;
                }
                g.bench_function(isa.name(), |b| {
                    b.iter(|| {
                        gemm_qd8_with(
                            isa,
                            &pool,
                            &rows,
                            &w,
                            None,
                            (f32::NEG_INFINITY, f32::INFINITY),
                            &mut out,
                            &mut scratch,
                        )
                        .unwrap()
                    })
                });
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
