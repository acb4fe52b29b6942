//! The attention kernels make no heap allocation once the temp allocator is warm: all
//! their scratch comes from it (a caching allocator or an arena here), and nothing on
//! the success path allocates.

use etch_base::ScalarType;
use etch_kernels::testing::Harness;
use etch_kernels::{Args, EValue, KernelContext, ThreadPool};
use etch_memory::allocator::{ArenaAllocator, CachingAllocator};
use etch_memory::counting::{CountingAllocator, count_allocations};
use etch_memory::{MemoryAllocator, TempScope};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

const MAX_CTX: usize = 512;

/// A decode step of a 9-head / 3-KV-head, D=64 layer: update both caches, attend with
/// `custom_sdpa`, then the same with an int8 cache and `custom_quantized_sdpa`.
struct Decode {
    h: Harness,
    start_pos: usize,
    update_k: [usize; 5],
    update_v: [usize; 5],
    sdpa: [usize; 10],
    qsdpa: [usize; 17],
}

fn decode() -> Decode {
    let mut h = Harness::new();
    let (hq, hkv, d) = (9, 3, 64);
    let q = h.tensor(&[1, 1, hq, d], &vec![0.1f32; hq * d]);
    let k = h.tensor(&[1, 1, hkv, d], &vec![0.2f32; hkv * d]);
    let v = h.tensor(&[1, 1, hkv, d], &vec![0.3f32; hkv * d]);
    let kc = h.tensor(&[1, MAX_CTX, hkv, d], &vec![0.5f32; MAX_CTX * hkv * d]);
    let vc = h.tensor(&[1, MAX_CTX, hkv, d], &vec![0.7f32; MAX_CTX * hkv * d]);
    let start_pos = h.int(0);
    let none = h.none();
    let drop = h.double(0.0);
    let causal = h.bool(true);
    let no = h.bool(false);
    let placeholder = h.out(ScalarType::Float, &[1]);
    let out = h.out(ScalarType::Float, &[1, 1, hq, d]);
    let i8s = |h: &mut Harness, sizes: &[usize]| {
        let n: usize = sizes.iter().product();
        h.tensor(sizes, &vec![3i8; n])
    };
    let qq = i8s(&mut h, &[1, 1, hq, d]);
    let qz = i8s(&mut h, &[1, 1, hq, 1]);
    let qs = h.tensor(&[1, 1, hq, 1], &[0.01f32; 9]);
    let kq = i8s(&mut h, &[1, MAX_CTX, hkv, d]);
    let kz = i8s(&mut h, &[1, MAX_CTX, hkv, 1]);
    let ks = h.tensor(&[1, MAX_CTX, hkv, 1], &vec![0.02f32; MAX_CTX * hkv]);
    let qout = h.out(ScalarType::Float, &[1, 1, hq, d]);
    Decode {
        start_pos,
        update_k: [k, kc, start_pos, placeholder, placeholder],
        update_v: [v, vc, start_pos, placeholder, placeholder],
        sdpa: [q, kc, vc, start_pos, none, drop, causal, none, out, out],
        qsdpa: [
            qq, kq, kq, start_pos, none, drop, causal, none, qz, qs, kz, ks, kz, ks, no, qout, qout,
        ],
        h,
    }
}

impl Decode {
    /// One decode step at `pos` through the harness.
    fn step(&mut self, pos: usize) {
        self.h.values[self.start_pos] = EValue::Int(pos as i64);
        let h = &mut self.h;
        h.call("llama::update_cache.out", &self.update_k).unwrap();
        h.call("llama::update_cache.out", &self.update_v).unwrap();
        h.call("llama::custom_sdpa.out", &self.sdpa).unwrap();
        h.call("llama::custom_quantized_sdpa.out", &self.qsdpa)
            .unwrap();
    }
}

fn steady_state_is_allocation_free(temp: Box<dyn MemoryAllocator>) {
    let mut dec = decode();
    dec.h.temp = Some(temp);
    // Warm-up: the caching allocator fills its size classes.
    for pos in 0..40 {
        dec.step(pos);
    }
    let ((), counts) = count_allocations(|| {
        for pos in 40..MAX_CTX {
            dec.step(pos);
        }
    });
    assert_eq!(counts.allocations, 0, "{counts:?}");
    assert_eq!(counts.deallocations, 0, "{counts:?}");
    let stats = dec.h.temp.as_ref().unwrap().stats();
    assert!(
        stats.allocations > 0,
        "scratch came from the temp allocator"
    );
}

#[test]
fn decode_with_caching_allocator_makes_no_heap_allocations() {
    assert!(CountingAllocator::is_installed());
    steady_state_is_allocation_free(Box::new(CachingAllocator::new(16 << 20)));
}

#[test]
fn decode_with_arena_makes_no_heap_allocations() {
    steady_state_is_allocation_free(Box::new(ArenaAllocator::with_capacity(4 << 20).unwrap()));
}

#[test]
fn threaded_decode_makes_no_heap_allocations_on_the_calling_worker() {
    // The kernels run inside the pool (as the runtime runs them), so parallel_for
    // splits work with the pool's own deques; count what this worker allocates.
    let mut dec = decode();
    let pool = ThreadPool::new(3).unwrap();
    let mut temp = CachingAllocator::new(16 << 20);
    let kernel = dec.h.registry.get("llama::custom_sdpa.out").unwrap();
    let Decode {
        h, sdpa, start_pos, ..
    } = &mut dec;
    let mut call = |pos: usize| {
        h.values[*start_pos] = EValue::Int(pos as i64);
        {
            let ctx = KernelContext::new(h.storage.access(), TempScope::new(Some(&temp)), &pool);
            let mut args = Args::new(&mut h.values, sdpa);
            kernel(&ctx, &mut args).unwrap();
        }
        temp.reset();
    };
    let counts = pool.install(|| {
        for pos in 0..64 {
            call(pos + 200);
        }
        count_allocations(|| {
            for pos in 264..MAX_CTX {
                call(pos);
            }
        })
        .1
    });
    assert_eq!(counts.allocations, 0, "{counts:?}");
}

#[test]
fn without_temp_allocator_scratch_falls_back_to_the_heap() {
    // Sanity check of the counter itself: no temp allocator, so scratch is heap.
    let mut dec = decode();
    dec.step(0);
    let ((), counts) = count_allocations(|| dec.step(1));
    assert!(counts.allocations > 0);
}
