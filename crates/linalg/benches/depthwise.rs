//! The depthwise plane kernel at MobileNetV2's 3x3 depthwise layers (224x224 input), one
//! thread: `default` is what `PlaneConv` runs with its preferred scratch (the polyphase
//! kernel, or with AVX2 or AVX-512 a direct kernel: the flat one for rows at most half a
//! vector wide, with AVX-512 the narrow-rows, phase, phase-rows and wide-rows ones for
//! the 3x3 layers they take, the square-filter one for the others), `no_scratch` what it runs
//! with none (the row kernel, or again the direct one), in multiply-adds per
//! second as criterion "elements". Run with
//! `cargo bench -p etch-linalg --bench depthwise -- --warm-up-time 1 --measurement-time 3`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etch_linalg::conv::ConvGeometry;
use etch_linalg::conv_nchw::{
    LANES_DEPTHWISE_PLANES, LanesDepthwise, PlaneConv, plane_scratch_len,
};

mod common;
use common::data;

/// (input size, channels, stride) of each distinct depthwise layer.
const LAYERS: [(usize, usize, usize); 10] = [
    (112, 32, 1),
    (112, 96, 2),
    (56, 144, 1),
    (56, 144, 2),
    (28, 192, 1),
    (28, 192, 2),
    (14, 384, 1),
    (14, 576, 1),
    (14, 576, 2),
    (7, 960, 1),
];

fn bench(c: &mut Criterion) {
    for (size, channels, stride) in LAYERS {
        let g =
            ConvGeometry::same_on_both_axes((size, size), (3, 3), (stride, 1), (channels, 1, 1));
        let out = g.out_h;
        let input = data(channels * size * size, 1);
        let filter = data(channels * 9, 2);
        let mut output = vec![0f32; channels * out * out];
        let mut group = c.benchmark_group(format!("depthwise_{size}x{size}x{channels}_s{stride}"));
        group.throughput(Throughput::Elements((channels * out * out * 9) as u64));
        for (name, scratch_len) in [("default", plane_scratch_len(&g)), ("no_scratch", 0)] {
            let mut scratch = vec![0f32; scratch_len];
            let conv = PlaneConv::new(&g, scratch_len);
            group.bench_function(name, |b| {
                b.iter(|| {
                    for (ch, o) in output.chunks_exact_mut(out * out).enumerate() {
                        let x = &input[ch * size * size..][..size * size];
                        let w = &filter[ch * 9..][..9];
                        assert!(conv.run(x, w, (0.5, None), o, &mut scratch));
                    }
                })
            });
        }
        let planes = LANES_DEPTHWISE_PLANES;
        let many = ConvGeometry {
            groups: planes,
            ..g
        };
        if let Some(lanes) = LanesDepthwise::new(etch_linalg::dispatch().gemm, &many) {
            let mut scratch = vec![0f32; lanes.scratch_len()];
            let bias = vec![0.5f32; channels];
            group.bench_function("lanes", |b| {
                b.iter(|| {
                    assert!(lanes.run(
                        (&input, &filter, Some(&bias)),
                        None,
                        &mut output,
                        &mut scratch
                    ))
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
