//! `aten::linear.out` at LLM shapes: etch's kernel (through the registry) against the
//! `gemm` crate and a naive loop.
//!
//! Decode (one token) reports weight bytes per second; prefill reports flop/s (the
//! "elements" criterion prints are flops). The weights sit on transparent huge pages
//! for every contender, as the runner loads a program's weights. Run with
//! `cargo bench -p etch-kernels --bench matmul -- --warm-up-time 1 --measurement-time 3`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etch_base::ScalarType;
use etch_kernels::ThreadPool;
use etch_kernels::testing::Harness;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0 - 0.5
        })
        .collect()
}

/// out[m, n] = Σ_k x[m, k] · w[n, k], the plain way.
fn naive(x: &[f32], w: &[f32], out: &mut [f32], m: usize, n: usize, k: usize) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f32;
            for kk in 0..k {
                s += x[i * k + kk] * w[j * k + kk];
            }
            out[i * n + j] = s;
        }
    }
}

fn gemm_crate(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    par: gemm::Parallelism,
) {
    // SAFETY: x is m x k row-major, w is n x k row-major (read as its k x n transpose:
    // row stride 1, column stride k) and out is m x n row-major; all slices have
    // exactly those lengths.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

fn bench_shape(c: &mut Criterion, name: &str, m: usize, k: usize, n: usize, with_naive: bool) {
    let threads = etch_kernels::default_threads();
    let x = data(m * k, 1);
    let w_vec = data(n * k, 2);
    let w_shared = etch_memory::SharedBytes::copy_to_huge_pages(bytemuck::cast_slice(&w_vec))
        .expect("huge-page weights");
    let w: &[f32] = bytemuck::cast_slice(w_shared.as_slice());
    let mut g = c.benchmark_group(name);
    if m == 1 {
        g.throughput(Throughput::Bytes((n * k * 4) as u64));
    } else {
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
    }
    for t in [1, threads] {
        let mut h = Harness::with_pool(ThreadPool::new(t).unwrap());
        let xi = h.tensor(&[1, m, k], &x);
        // Weights on huge pages, as `LoadMode::HugePages` (the runner's default) puts
        // a program's weights.
        let wi = h.tensor_huge_pages(&[n, k], w);
        let none = h.none();
        let out = h.out(ScalarType::Float, &[1, m, n]);
        g.bench_function(format!("etch/{t}t"), |b| {
            b.iter(|| {
                h.call("aten::linear.out", &[xi, wi, none, out, out])
                    .unwrap()
            })
        });
    }
    let mut out = vec![0f32; m * n];
    g.bench_function("gemm-crate/1t", |b| {
        b.iter(|| gemm_crate(&x, w, &mut out, m, n, k, gemm::Parallelism::None))
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    g.bench_function(format!("gemm-crate/{threads}t"), |b| {
        b.iter(|| {
            pool.install(|| gemm_crate(&x, w, &mut out, m, n, k, gemm::Parallelism::Rayon(threads)))
        })
    });
    if with_naive {
        g.bench_function("naive/1t", |b| b.iter(|| naive(&x, w, &mut out, m, n, k)));
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    bench_shape(c, "linear_decode_1x576x1536", 1, 576, 1536, true);
    bench_shape(c, "linear_decode_1x576x49152", 1, 576, 49152, true);
    bench_shape(c, "linear_prefill_128x576x1536", 128, 576, 1536, true);
}

criterion_group!(matmul, benches);
criterion_main!(matmul);
