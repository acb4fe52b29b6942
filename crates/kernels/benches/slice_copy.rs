//! `aten::slice_copy.Tensor_out` serial against parallel at RoPE shapes. Run with
//! `cargo bench -p etch-kernels --bench slice_copy -- --warm-up-time 1 --measurement-time 3`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etch_base::ScalarType;
use etch_kernels::ThreadPool;
use etch_kernels::testing::Harness;

/// Benchmarks slicing `sizes` along `dim` (start, end, step) with 1 and all threads.
fn bench(
    c: &mut Criterion,
    name: &str,
    sizes: &[usize],
    dim: usize,
    start: i64,
    end: Option<i64>,
    step: i64,
) {
    let n: usize = sizes.iter().product();
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut g = c.benchmark_group(name);
    let mut out_sizes = sizes.to_vec();
    let stop = end.unwrap_or(sizes[dim] as i64);
    out_sizes[dim] = ((stop - start) as usize).div_ceil(step as usize);
    let out_bytes: usize = out_sizes.iter().product::<usize>() * 4;
    g.throughput(Throughput::Bytes(out_bytes as u64));
    let threads = etch_kernels::default_threads();
    for (label, pool) in [
        ("serial", ThreadPool::serial()),
        ("parallel", ThreadPool::new(threads).unwrap()),
    ] {
        let mut h = Harness::with_pool(pool);
        let xi = h.tensor(sizes, &x);
        let d = h.int(dim as i64);
        let s = h.int(start);
        let e = match end {
            Some(v) => h.int(v),
            None => h.none(),
        };
        let st = h.int(step);
        let out = h.out(ScalarType::Float, &out_sizes);
        g.bench_function(format!("{label}/{}t", h.pool.threads()), |b| {
            b.iter(|| {
                h.call("aten::slice_copy.Tensor_out", &[xi, d, s, e, st, out, out])
                    .unwrap()
            })
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    // RoPE even/odd split of q: [1, S=128, H=9, D/2=32, 2], last dim, step 2.
    bench(
        c,
        "rope_split_1x128x9x32x2_step2",
        &[1, 128, 9, 32, 2],
        4,
        0,
        None,
        2,
    );
    // Contiguous half of the last dim (step 1: one memcpy per row).
    bench(
        c,
        "rope_half_1x128x9x64_step1",
        &[1, 128, 9, 64],
        3,
        0,
        Some(32),
        1,
    );
    // The RoPE table [max_seq=2048, D/2=32] sliced by rows [start, start+128).
    bench(
        c,
        "rope_table_2048x32_rows128",
        &[2048, 32],
        0,
        100,
        Some(228),
        1,
    );
}

criterion_group!(slice_copy, benches);
criterion_main!(slice_copy);
