//! f32 elementwise throughput at 1M elements: same-shape `mul`/`add` and the LLM
//! broadcasts, serial and on a pool. Throughput counts bytes read plus bytes written.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etch_base::ScalarType;
use etch_kernels::ThreadPool;
use etch_kernels::testing::Harness;

const N: usize = 1 << 20;

struct Case {
    name: &'static str,
    op: &'static str,
    a: &'static [usize],
    b: &'static [usize],
    alpha: bool,
}

const CASES: &[Case] = &[
    Case {
        name: "mul_same",
        op: "aten::mul.out",
        a: &[N],
        b: &[N],
        alpha: false,
    },
    Case {
        name: "add_same",
        op: "aten::add.out",
        a: &[N],
        b: &[N],
        alpha: true,
    },
    Case {
        name: "mul_row_bcast_[1,1024,1024]x[1024]",
        op: "aten::mul.out",
        a: &[1, 1024, 1024],
        b: &[1024],
        alpha: false,
    },
    Case {
        name: "mul_rope_[1,256,16,256]x[1,256,1,256]",
        op: "aten::mul.out",
        a: &[1, 256, 16, 256],
        b: &[1, 256, 1, 256],
        alpha: false,
    },
    Case {
        name: "add_scalar_tensor_[1,1M,1]+[]",
        op: "aten::add.out",
        a: &[1, N, 1],
        b: &[],
        alpha: true,
    },
];

fn bench(c: &mut Criterion) {
    let threads = etch_kernels::default_threads();
    for (label, pool_threads) in [("serial", 1), ("pool", threads)] {
        let mut group = c.benchmark_group(format!("elementwise_f32_{label}"));
        for case in CASES {
            let pool = ThreadPool::new(pool_threads).expect("pool");
            let mut h = Harness::with_pool(pool);
            let na: usize = case.a.iter().product();
            let nb: usize = case.b.iter().product();
            let va: Vec<f32> = (0..na).map(|i| (i % 97) as f32 * 0.01).collect();
            let vb: Vec<f32> = (0..nb).map(|i| (i % 89) as f32 * 0.02).collect();
            let a = h.tensor(case.a, &va);
            let b = h.tensor(case.b, &vb);
            let out = h.out(ScalarType::Float, case.a);
            let args: Vec<usize> = if case.alpha {
                let one = h.int(1);
                vec![a, b, one, out, out]
            } else {
                vec![a, b, out, out]
            };
            group.throughput(Throughput::Bytes(((na * 2 + nb) * 4) as u64));
            group.bench_function(case.name, |bch| {
                bch.iter(|| h.call(case.op, &args).expect("kernel"))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
