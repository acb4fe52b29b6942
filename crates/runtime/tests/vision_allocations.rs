//! After warm-up, executing portable (undelegated) vision programs makes no heap
//! allocation: convolution im2col and GEMM packing, pooling and upsampling scratch all
//! come from the temp allocator. One test in its own binary, so no other test's
//! allocations are counted.

use std::path::PathBuf;

use etch_memory::counting::CountingAllocator;
use etch_runtime::npy::read_npy_file;
use etch_runtime::{Module, Value};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// `name`'s forward on a pool of `threads`, inputs set and warmed up by two runs.
fn warm_module(name: &str, threads: usize) -> Module {
    let dir = fixtures();
    let mut module = Module::from_path(dir.join(format!("{name}.pte")))
        .threads(threads)
        .build()
        .expect("load");
    let input = read_npy_file(&dir.join(name).join("call0.in0.npy")).expect("input");
    let method = module.method_mut("forward").expect("method");
    method.set_inputs(&[Value::Tensor(input)]).expect("inputs");
    for _ in 0..2 {
        method.execute().expect("warm-up");
    }
    module
}

#[test]
fn vision_programs_do_not_allocate_after_warm_up() {
    assert!(CountingAllocator::is_installed());
    // ResNet (convolution, batch norm, max pooling), MobileNetV2 (depthwise), U-Net
    // (transposed convolution, bilinear upsampling). Every module (and its pool) stays
    // alive until the end, so no pool's threads start or stop while counting.
    let mut modules = Vec::new();
    // The XNNPACK-delegated files of the same families: the delegate's convolutions
    // (GEMM on packed filters, im2col, depthwise) take their scratch from the context.
    for name in [
        "vision_resnet",
        "vision_mobilenet_v2",
        "vision_unet",
        "xnn_resnet",
        "xnn_mobilenet_v2",
        "xnn_unet",
        "xnn_vit",
    ] {
        for threads in [1, 2] {
            modules.push((name, threads, warm_module(name, threads)));
        }
    }
    for (name, threads, module) in &mut modules {
        let method = module.method_mut("forward").expect("method");
        // The counts are process-wide (the pool's workers allocate on other threads), so
        // a thread of the harness or another module's pool settling can add a stray
        // allocation to one trial; an allocation made by `execute` shows in every trial.
        let mut counts = Default::default();
        for _trial in 0..5 {
            let before = CountingAllocator::global_counts();
            for _ in 0..3 {
                method.execute().expect("execute");
            }
            counts = CountingAllocator::global_counts().since(&before);
            if counts.allocations == 0 {
                break;
            }
        }
        assert_eq!(
            counts.allocations, 0,
            "{name}, {threads} threads: {counts:?}"
        );
    }
}
