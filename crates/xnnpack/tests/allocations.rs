//! After warm-up, executing a delegate makes no heap allocation: values, shapes and
//! im2col blocks come from the temp allocator. One test in its own binary, so no other
//! test's allocations are counted.

mod common;

use common::*;
use etch_format::ScalarType;
use etch_kernels::testing::Harness;
use etch_memory::allocator::CachingAllocator;
use etch_memory::counting::{CountingAllocator, count_allocations};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn execute_does_not_allocate_after_warm_up() {
    let file = linear_program();
    let handle = init_linear(&file);
    let mut h = Harness::new();
    h.temp = Some(Box::new(CachingAllocator::new(1 << 20)));
    let x: Vec<f32> = (0..16).map(|i| i as f32 / 8.0 - 1.0).collect();
    let xi = h.tensor(&[2, 8], &x);
    let one = h.tensor::<f32>(&[], &[1.0]);
    let yi = h.out(ScalarType::Float, &[2, 4]);
    for _ in 0..2 {
        run(&mut h, handle.as_ref(), &[xi, one, yi]).unwrap();
    }
    let (result, counts) = count_allocations(|| {
        for _ in 0..10 {
            run(&mut h, handle.as_ref(), &[xi, one, yi])?;
        }
        Ok::<(), etch_kernels::KernelError>(())
    });
    result.unwrap();
    assert_eq!(counts.allocations, 0, "{counts:?}");
}
