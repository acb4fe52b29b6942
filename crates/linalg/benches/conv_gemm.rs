//! The im2col GEMM of ResNet-18's convolutions (224x224 input), one thread: each
//! distinct layer as `gemm_im2col` over its phase planes (the portable `convolution`
//! operator's path), in multiply-adds per second as criterion "elements", so that a
//! layer's figure compares with the machine's FMA peak (`hwlimits`). Then MobileNetV2's
//! largest pointwise (1x1) convolutions, a plain GEMM over the input planes with a bias
//! and ReLU6 as the operator runs them, on one thread and on two (`t1`, `t2`), also with
//! the filter read from outside the core's caches (`cold_filter_t1`, `cold_filter_t2`), and
//! on planes up to 28x28 the channels-in-lanes kernel (`lanes_t1`, `lanes_t2`; `lanes` for
//! ResNet-18's layers, the filter stored input-channel major as folded at load). Run with
//! `cargo bench -p etch-linalg --bench conv_gemm -- --warm-up-time 1 --measurement-time 3`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use etch_linalg::conv::ConvGeometry;
use etch_linalg::conv_nchw::{self, Im2col};
use etch_linalg::gemm::{self, Elems, Gemm, MatRef};
use etch_linalg::{ThreadPool, dispatch};

mod common;
use common::data;

/// (input size, input channels, output channels, kernel, stride, padding) of each
/// distinct ResNet-18 layer, then MobileNetV2's stem.
const LAYERS: [(usize, usize, usize, usize, usize, usize); 9] = [
    (224, 3, 64, 7, 2, 3),
    (56, 64, 64, 3, 1, 1),
    (56, 64, 128, 3, 2, 1),
    (28, 128, 128, 3, 1, 1),
    (28, 128, 256, 3, 2, 1),
    (14, 256, 256, 3, 1, 1),
    (14, 256, 512, 3, 2, 1),
    (7, 512, 512, 3, 1, 1),
    (224, 3, 32, 3, 2, 1),
];

fn view(data: &[f32], rows: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        data: Elems::F32(data),
        offset: 0,
        rows,
        cols,
        rs: cols,
        cs: 1,
    }
}

/// A convolution's product `filter · image`, plus a bias per output channel (row),
/// clamped into `clamp`.
fn convolution<'a>(
    filter: MatRef<'a>,
    image: MatRef<'a>,
    bias: &'a [f32],
    clamp: (f32, f32),
) -> Gemm<'a> {
    let bias = MatRef {
        data: Elems::F32(bias),
        offset: 0,
        rows: filter.rows,
        cols: image.cols,
        rs: 1,
        cs: 0,
    };
    Gemm {
        a: filter,
        b: image,
        alpha: 1.0,
        addend: Some((bias, 1.0)),
        clamp: Some(clamp),
    }
}

fn bench(c: &mut Criterion) {
    let pool = ThreadPool::new(1).expect("a thread pool");
    let isa = dispatch().gemm;
    for (size, c_in, c_out, k, stride, pad) in LAYERS {
        let g =
            ConvGeometry::same_on_both_axes((size, size), (k, k), (stride, pad), (1, c_in, c_out));
        let (patch, px) = (g.patch_len(), g.out_pixels());
        let input = data(c_in * size * size, 1);
        let filter = data(c_out * patch, 2);
        let bias = data(c_out, 3);
        let product = convolution(
            view(&filter, c_out, patch),
            view(&[], patch, px),
            &bias,
            (0.0, f32::INFINITY),
        );
        let mut scratch = vec![0f32; gemm::im2col_scratch_len(isa, &product, 1)];
        let mut phases = vec![0f32; Im2col::phase_split_len(&g)];
        let mut output = vec![0f32; c_out * px];
        let mut group = c.benchmark_group(format!(
            "conv_{size}x{size}x{c_in}_to_{c_out}_k{k}_s{stride}"
        ));
        group.throughput(Throughput::Elements((c_out * px * patch) as u64));
        group.bench_function("gemm_im2col", |b| {
            b.iter(|| {
                let image =
                    Im2col::phase_split(&pool, &g, &input, &mut phases).expect("planes fit");
                gemm::gemm_im2col(&pool, isa, &product, &image, &mut output, &mut scratch)
                    .expect("a valid product");
            })
        });
        if conv_nchw::has_channels_in_lanes(isa) {
            let filter_t = input_major(&filter, c_out);
            let mut lanes_scratch = vec![0f32; conv_nchw::channels_in_lanes_scratch_len(&g, 1)];
            let operands = (&input[..], &filter_t[..], &bias[..]);
            group.bench_function("lanes", |b| {
                b.iter(|| {
                    lanes(
                        &pool,
                        &g,
                        operands,
                        f32::INFINITY,
                        &mut output,
                        &mut lanes_scratch,
                    )
                })
            });
        }
        group.finish();
    }
}

/// The channels-in-lanes convolution of `g` (filter input-channel major), a bias per
/// output channel, clamped into `0 ..= hi`.
fn lanes(
    pool: &ThreadPool,
    g: &ConvGeometry,
    (input, filter, bias): (&[f32], &[f32], &[f32]),
    hi: f32,
    output: &mut [f32],
    scratch: &mut [f32],
) -> bool {
    let isa = dispatch().gemm;
    let epilogue = (Some(bias), Some((0.0, hi)));
    conv_nchw::conv_channels_in_lanes(pool, isa, g, (input, filter), epilogue, output, scratch)
}

/// `filter` (`[c_out, depth]`) stored input-channel major, `[depth, c_out]`.
fn input_major(filter: &[f32], c_out: usize) -> Vec<f32> {
    let depth = filter.len() / c_out;
    (0..filter.len())
        .map(|i| filter[(i % c_out) * depth + i / c_out])
        .collect()
}

/// (spatial size, input channels, output channels) of MobileNetV2's pointwise layers:
/// expanding and projecting, from the largest planes to the smallest.
const POINTWISE: [(usize, usize, usize); 11] = [
    (112, 32, 16),
    (112, 16, 96),
    (56, 24, 144),
    (56, 144, 24),
    (28, 192, 32),
    (28, 32, 192),
    (14, 384, 64),
    (14, 64, 384),
    (7, 960, 160),
    (7, 160, 960),
    (7, 960, 320),
];

fn bench_pointwise(c: &mut Criterion) {
    let isa = dispatch().gemm;
    for (size, c_in, c_out) in POINTWISE {
        let px = size * size;
        let input = data(c_in * px, 1);
        let filter = data(c_out * c_in, 2);
        let bias = data(c_out, 3);
        let product = convolution(
            view(&filter, c_out, c_in),
            view(&input, c_in, px),
            &bias,
            (0.0, 6.0),
        );
        let mut output = vec![0f32; c_out * px];
        let mut group = c.benchmark_group(format!("pointwise_{size}x{size}x{c_in}_to_{c_out}"));
        group.throughput(Throughput::Elements((c_out * px * c_in) as u64));
        let mut cold: Vec<Vec<f32>> = (0..8).map(|_| vec![0f32; c_out * px]).collect();
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads).expect("a thread pool");
            let mut scratch = vec![0f32; gemm::scratch_len(isa, &product, threads)];
            group.bench_function(format!("t{threads}"), |b| {
                b.iter(|| {
                    pool.install_hot(|| {
                        gemm::gemm(&pool, isa, &product, &mut output, &mut scratch)
                            .expect("a valid product")
                    })
                })
            });
            // Many products inside one entry to the pool, as in a forward pass: the
            // workers poll between them instead of waking up for each.
            group.bench_function(format!("in_pass_t{threads}"), |b| {
                b.iter_custom(|iters| {
                    pool.install_hot(|| {
                        let start = std::time::Instant::now();
                        for _ in 0..iters {
                            gemm::gemm(&pool, isa, &product, &mut output, &mut scratch)
                                .expect("a valid product");
                        }
                        start.elapsed()
                    })
                })
            });
            // The filter read from outside the core's caches, as in a forward pass, where
            // every layer's weights were last read a whole call ago: a different copy
            // each time, 24 MiB in all.
            let copies = (24 << 20) / (4 * filter.len()).max(1) + 1;
            let filters: Vec<Vec<f32>> = (0..copies)
                .map(|i| data(c_out * c_in, 2 + i as u32))
                .collect();
            let mut f = 0;
            group.bench_function(format!("cold_filter_t{threads}"), |b| {
                b.iter(|| {
                    f = (f + 1) % filters.len();
                    let product = convolution(
                        view(&filters[f], c_out, c_in),
                        view(&input, c_in, px),
                        &bias,
                        (0.0, 6.0),
                    );
                    pool.install_hot(|| {
                        gemm::gemm(&pool, isa, &product, &mut output, &mut scratch)
                            .expect("a valid product")
                    })
                })
            });
            // The output channels in the lanes, the filter stored input-channel major
            // (as folded at load for small planes).
            if conv_nchw::has_channels_in_lanes(isa) && size <= 28 {
                let filter_t = input_major(&filter, c_out);
                let g =
                    ConvGeometry::same_on_both_axes((size, size), (1, 1), (1, 0), (1, c_in, c_out));
                let mut lanes_scratch =
                    vec![0f32; conv_nchw::channels_in_lanes_scratch_len(&g, threads)];
                let operands = (&input[..], &filter_t[..], &bias[..]);
                group.bench_function(format!("lanes_t{threads}"), |b| {
                    b.iter(|| {
                        pool.install_hot(|| {
                            lanes(&pool, &g, operands, 6.0, &mut output, &mut lanes_scratch)
                        })
                    })
                });
            }
            let mut i = 0;
            group.bench_function(format!("cold_t{threads}"), |b| {
                b.iter(|| {
                    i = (i + 1) % cold.len();
                    let out = &mut cold[i];
                    pool.install_hot(|| {
                        gemm::gemm(&pool, isa, &product, out, &mut scratch)
                            .expect("a valid product")
                    })
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench, bench_pointwise);
criterion_main!(benches);
