//! Sums of consecutive runs (`etch_linalg::runs::sum_runs`) at the global average
//! pooling of MobileNetV2 (1280 planes of 7x7) and ResNet-18 (512 planes of 7x7), one
//! thread, each ISA of the dispatch table. Run with
//! `cargo bench -p etch-linalg --bench runs -- --warm-up-time 1 --measurement-time 3`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etch_linalg::Isa;
use etch_linalg::runs::sum_runs;

mod common;
use common::data;

fn bench(c: &mut Criterion) {
    for (name, runs, run) in [("mobilenet_v2", 1280, 49), ("resnet18", 512, 49)] {
        let input = data(runs * run, 1);
        let mut sums = vec![0f32; runs];
        let mut group = c.benchmark_group(format!("sum_runs_{name}_{runs}x{run}"));
        group.throughput(Throughput::Elements((runs * run) as u64));
        for &isa in Isa::available() {
            group.bench_function(isa.name(), |b| {
                b.iter(|| sum_runs(isa, &input, run, &mut sums))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
