//! etch's numeric kernel library: plain functions over slices and strided views, with
//! no knowledge of operators, and one table of the best kernels for this CPU.
//!
//! * [`gemm`]: the packed f32 GEMM (f16/bf16 operands widened on packing) and the
//!   matrix-vector dot-product rows; [`gemm_f32`] is the entry point for callers
//!   outside the matmul ops.
//! * [`Isa`], [`CpuSupport`], [`dispatch`]: which instruction set each kernel family
//!   uses, decided once at start-up (AVX-512, AVX2+FMA, NEON, or the scalar twin).
//! * [`attention`]: the inner loops of attention (query-key dot products, exp with
//!   sum, value multiply-adds), dispatched on the table's attention slot.
//! * [`ThreadPool`]: the one thread pool of etch, which the kernels split work over.
//! * NHWC image kernels (used by the XNNPACK delegate, and next by the portable
//!   convolution ops): [`conv`] (im2col, depthwise, transposed, a direct reference),
//!   [`pool`] (max, average, global average), [`resize`] (bilinear); [`conv_nchw`]
//!   holds the NCHW twins the portable `convolution` op runs on; [`dense`] holds
//!   scalar reference matrix products.
//!
//! `unsafe` lives here (SIMD intrinsics) and in etch-memory only: every SIMD function
//! is reached through an [`Isa`] value whose [`CpuSupport`] proves the CPU has its
//! instructions, and each has a safe scalar twin that the tests compare it with.
//!
//! # The f32 GEMM
//!
//! `out[m, n] = clamp(A[m, k] · B + bias)`, with `B` a PyTorch linear weight `[n, k]`
//! ([`RhsF32::NK`]), a `[k, n]` matrix ([`RhsF32::KN`]), or packed once at load time
//! ([`PackedB`], [`RhsF32::Packed`]). The caller owns the scratch (from its temp
//! allocator): [`GemmF32::scratch_len`] says how much.
//!
//! ```
//! use etch_linalg::{GemmF32, PackedB, RhsF32, ThreadPool, gemm_f32};
//!
//! let pool = ThreadPool::new(2)?;
//! // A fully-connected layer: 2 inputs of 3 features, 4 outputs.
//! let input = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0f32];
//! let weight = [
//!     1.0, 0.0, 0.0, // output 0 = feature 0
//!     0.0, 1.0, 0.0, // output 1 = feature 1
//!     0.0, 0.0, 1.0, // output 2 = feature 2
//!     1.0, 1.0, 1.0f32, // output 3 = their sum
//! ];
//! let bias = [0.5f32; 4];
//! let packed = PackedB::from_nk(&weight, 4, 3)?; // once, at init
//! let fc = GemmF32 {
//!     m: 2,
//!     n: 4,
//!     k: 3,
//!     a: &input,
//!     lda: 3,
//!     b: RhsF32::Packed(&packed),
//!     bias: Some(&bias),
//!     clamp: Some((0.0, 10.0)),
//! };
//! let mut scratch = vec![0f32; fc.scratch_len(pool.threads())]; // the temp allocator's
//! let mut out = [0f32; 8];
//! gemm_f32(&pool, &fc, &mut out, &mut scratch)?;
//! assert_eq!(out, [1.5, 2.5, 3.5, 6.5, 4.5, 5.5, 6.5, 10.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod approx;
pub mod attention;
pub mod conv;
pub mod conv_nchw;
mod copy;
pub mod dense;
pub mod elementwise;
mod error;
pub mod gemm;
mod isa;
pub mod layout;
pub mod pool;
pub mod quant;
pub mod resize;
pub mod runs;
#[cfg(target_arch = "x86_64")]
mod simd_x86;
#[cfg(test)]
mod test_util;
mod threadpool;

pub use error::LinalgError;
pub use gemm::{
    GemmF32, PackedB, RhsF32, gemm_f32, gemm_f32_rows_alone, gemm_f32_with, output_clamp,
};
pub use isa::{CpuSupport, Dispatch, Isa, dispatch};
pub use threadpool::{GRAIN_SIZE, PIN_THREADS_ENV, ThreadPool, ThreadPoolError, default_threads};
