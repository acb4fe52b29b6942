//! Prints this machine's memory bandwidth (STREAM-like triad, and read-only) and f32 FMA peak (compiler's best, explicit AVX2, explicit AVX-512) as JSON.
//!
//! `cargo run --release -p etch-bench --bin hwlimits [-- THREADS]`

fn main() {
    let threads = std::env::args()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // 3 arrays of 64 Mi floats (768 MiB): far beyond any cache.
    let n = 64 << 20;
    let bw = etch_bench::triad_bandwidth(n, 5, threads);
    let read = etch_bench::read_bandwidth(2 * n, 5, threads);
    let flops = etch_bench::fma_peak(threads);
    let gflops = |w| etch_bench::fma_peak_of(w, threads).map(|f| f / 1e9);
    let avx2 = gflops(etch_bench::FmaWidth::Avx2);
    let avx512 = gflops(etch_bench::FmaWidth::Avx512);
    println!(
        "{}",
        serde_json::json!({
            "threads": threads,
            "triad_bytes_per_second": bw,
            "triad_gb_per_second": bw / 1e9,
            "read_bytes_per_second": read,
            "read_gb_per_second": read / 1e9,
            "fma_f32_flops": flops,
            "fma_f32_gflops": flops / 1e9,
            "fma_f32_avx2_gflops": avx2,
            "fma_f32_avx512_gflops": avx512,
        })
    );
}
