//! Measurements of what the hardware allows, to put etch's figures in proportion:
//! a STREAM-like triad for memory bandwidth and an FMA loop for f32 compute peak.

use std::time::Instant;

use rayon::prelude::*;

/// `n` f32 equal to `value` in anonymous memory advised to use transparent huge pages
/// (Linux), as etch keeps a program's weights: the bandwidth figures then measure the
/// memory, not TLB misses.
pub struct HugeArray(memmap2::MmapMut);

impl HugeArray {
    pub fn filled(n: usize, value: f32) -> HugeArray {
        let map = memmap2::MmapMut::map_anon(n * 4).expect("anonymous map");
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let mut a = HugeArray(map);
        a.as_mut_slice().fill(value);
        a
    }

    pub fn as_slice(&self) -> &[f32] {
        bytemuck::cast_slice(&self.0)
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
}

/// Best-of-`reps` bandwidth of `a[i] = b[i] + s * c[i]` over `n` f32 elements per array,
/// in bytes per second (12 bytes move per element), on `threads` threads.
pub fn triad_bandwidth(n: usize, reps: usize, threads: usize) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool");
    let mut a = HugeArray::filled(n, 0.0);
    let b = HugeArray::filled(n, 1.0);
    let c = HugeArray::filled(n, 2.0);
    let (a, b, c) = (a.as_mut_slice(), b.as_slice(), c.as_slice());
    let chunk = 1 << 16;
    let mut best = f64::MAX;
    pool.install(|| {
        for _ in 0..reps {
            let start = Instant::now();
            a.par_chunks_mut(chunk)
                .zip(b.par_chunks(chunk))
                .zip(c.par_chunks(chunk))
                .for_each(|((a, b), c)| {
                    for ((x, y), z) in a.iter_mut().zip(b).zip(c) {
                        *x = y + 3.0 * z;
                    }
                });
            best = best.min(start.elapsed().as_secs_f64());
        }
    });
    std::hint::black_box(&a);
    (12 * n) as f64 / best
}

/// Best-of-`reps` read-only bandwidth: the sum of `n` f32 elements, in bytes per second,
/// on `threads` threads. A decode step only reads its weights, so this is its real bound
/// (the triad also writes, and a write costs a read for ownership besides).
pub fn read_bandwidth(n: usize, reps: usize, threads: usize) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool");
    let b = HugeArray::filled(n, 1.5);
    let b = b.as_slice();
    let chunk = 1 << 16;
    let mut best = f64::MAX;
    let mut total = 0f32;
    pool.install(|| {
        for _ in 0..reps {
            let start = Instant::now();
            total += b
                .par_chunks(chunk)
                .map(|c| {
                    // 8 independent partial sums, so that the adds vectorise.
                    let mut acc = [0f32; 8];
                    for block in c.chunks_exact(8) {
                        for (a, v) in acc.iter_mut().zip(block) {
                            *a += v;
                        }
                    }
                    acc.iter().sum::<f32>()
                })
                .sum::<f32>();
            best = best.min(start.elapsed().as_secs_f64());
        }
    });
    std::hint::black_box(total);
    (4 * n) as f64 / best
}

/// f32 FLOP/s of independent fused multiply-adds on `threads` threads (2 FLOPs each).
pub fn fma_peak(threads: usize) -> f64 {
    let iters = 20_000_000usize;
    let start = Instant::now();
    let total: f32 = (0..threads)
        .into_par_iter()
        .map(|t| fma_loop(iters, t as f32))
        .sum();
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(total);
    (threads * iters * LANES * 2) as f64 / secs
}

/// Independent accumulators: enough to hide FMA latency on 2 FMA ports x 16 lanes.
const LANES: usize = 128;

/// Which FMA loop [`fma_peak_of`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FmaWidth {
    /// 256-bit AVX2 FMAs (8 lanes).
    Avx2,
    /// 512-bit AVX-512 FMAs (16 lanes).
    Avx512,
}

/// f32 FLOP/s of independent fused multiply-adds of one register width on `threads`
/// threads, or `None` when the CPU lacks it.
pub fn fma_peak_of(width: FmaWidth, threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        let ok = match width {
            FmaWidth::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            FmaWidth::Avx512 => is_x86_feature_detected!("avx512f"),
        };
        if !ok {
            return None;
        }
        let iters = 20_000_000usize;
        let start = Instant::now();
        let total: f32 = (0..threads)
            .into_par_iter()
            .map(|t| match width {
                // SAFETY: AVX2 and FMA were detected above.
                FmaWidth::Avx2 => unsafe { fma_loop_avx2(iters, t as f32) },
                // SAFETY: AVX-512F was detected above.
                FmaWidth::Avx512 => unsafe { fma_loop_avx512_explicit(iters, t as f32) },
            })
            .sum();
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(total);
        Some((threads * iters * LANES * 2) as f64 / secs)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (width, threads);
        None
    }
}

/// 16 independent 16-lane FMA chains (256 lanes; the step count is scaled so that the
/// FLOPs match [`LANES`] lanes per iteration).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_loop_avx512_explicit(iters: usize, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    let x = _mm512_set1_ps(0.999_999);
    let y = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_set1_ps(seed); 16];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = _mm512_add_ps(*a, _mm512_set1_ps(i as f32 * 1e-3));
    }
    let steps = iters * LANES / 256;
    for _ in 0..steps {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, x, y);
        }
    }
    let mut sum = _mm512_setzero_ps();
    for a in acc {
        sum = _mm512_add_ps(sum, a);
    }
    _mm512_reduce_add_ps(sum)
}

fn fma_loop(iters: usize, seed: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { fma_loop_avx512(iters, seed) };
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { fma_loop_avx2(iters, seed) };
        }
    }
    fma_loop_generic(iters, seed)
}

#[inline(always)]
fn fma_loop_generic(iters: usize, seed: f32) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = seed + i as f32 * 1e-3;
    }
    let (x, y) = (0.999_999f32, 1e-7f32);
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = a.mul_add(x, y);
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_loop_avx512(iters: usize, seed: f32) -> f32 {
    fma_loop_generic(iters, seed)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_loop_avx2(iters: usize, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    // 12 independent 8-lane chains: FMA latency (4-5 cycles) times throughput (up to
    // 2 per cycle) needs at least 10 in flight; 12 leaves room and fits 16 registers.
    let x = _mm256_set1_ps(0.999_999);
    let y = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(seed); 12];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = _mm256_add_ps(*a, _mm256_set1_ps(i as f32 * 1e-3));
    }
    // The whole loop body is register-only; the iteration count matches LANES = 128
    // f32 lanes per iteration (12 x 8 = 96 here, so run 4/3 as many iterations).
    let steps = iters * LANES / 96;
    for _ in 0..steps {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, x, y);
        }
    }
    let mut lanes = [0f32; 8];
    let mut sum = _mm256_setzero_ps();
    for a in acc {
        sum = _mm256_add_ps(sum, a);
    }
    // SAFETY: `lanes` holds exactly 8 f32, the width of one unaligned 256-bit store.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    lanes.iter().sum()
}
