//! The f32 vector operations the x86-64 kernels are written with, at two widths:
//! [`Wide`] (16 lanes of AVX-512 F) and [`Narrow`] (8 lanes of AVX2 with FMA). A kernel
//! body generic over [`Vector`] is written once and compiled for each width inside a
//! `#[target_feature]` entry point, which its callers reach through a [`crate::CpuSupport`]
//! proof: the methods are `#[inline(always)]` so that they take on the entry point's
//! instruction set.

use std::any::TypeId;
use std::arch::x86_64::*;

use half::{bf16, f16};

use crate::gemm::WeightElem;

/// The f32 vector operations of one width.
///
/// # Safety
/// Every method may run only on a CPU with the width's instructions (AVX-512 F, or AVX2
/// with FMA, and F16C for [`Vector::load_weights`] of f16): the kernels' entry points
/// check that with a [`crate::CpuSupport`]. Pointer reads and writes are the callers'
/// to keep in bounds.
pub(crate) trait Vector: Copy {
    /// Lanes of a vector.
    const LANES: usize;
    /// A lane mask.
    type Mask: Copy;
    /// Every lane `x`.
    unsafe fn splat(x: f32) -> Self;
    /// `LANES` values from `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// `LANES` weights from `p`, widened to f32 (f32, f16 and bf16 with vector
    /// instructions, any other type lane by lane).
    unsafe fn load_weights<W: WeightElem>(p: *const W) -> Self;
    /// The lanes to `p`.
    unsafe fn store(self, p: *mut f32);
    /// `self + other`.
    unsafe fn add(self, other: Self) -> Self;
    /// `self * w + acc`, rounded once.
    unsafe fn fmadd(self, w: Self, acc: Self) -> Self;
    /// `min(hi, max(lo, self))`: NaN and a signed zero equal to a bound kept, as
    /// `output_clamp`.
    unsafe fn clamp(self, lo: Self, hi: Self) -> Self;
    /// The sum of the lanes.
    unsafe fn reduce_add(self) -> f32;
    /// The mask of the lanes whose bits are set in `lanes`.
    unsafe fn mask(lanes: u16) -> Self::Mask;
    /// The lanes of `m` from `p` (those lanes must be readable), 0 elsewhere.
    unsafe fn load_masked(p: *const f32, m: Self::Mask) -> Self;
    /// The first `lanes` lanes to `p` (those must be writable).
    unsafe fn store_first(self, p: *mut f32, lanes: usize);
    /// The first `lanes` (at most `LANES`) lanes from `p` (those must be readable), 0
    /// in the others.
    #[inline(always)]
    unsafe fn load_first(p: *const f32, lanes: usize) -> Self {
        unsafe { Self::load_masked(p, Self::mask(((1u32 << lanes) - 1) as u16)) }
    }
    /// Lanes 0, 2, 4, .. of `a` then of `b`.
    unsafe fn evens(a: Self, b: Self) -> Self;
    /// Lanes 1, 3, 5, .. of `a` then of `b`.
    unsafe fn odds(a: Self, b: Self) -> Self;
    /// `rows` (at most 8) stored transposed: lane `l` of `rows[r]` to address
    /// `out + l * stride + r`, for the first `lanes` lanes (those addresses must be
    /// writable). Lane by lane through the stack, unless a width has a faster way.
    #[inline(always)]
    unsafe fn store_transposed(rows: &[Self], out: *mut f32, stride: usize, lanes: usize) {
        let mut sums = [[0f32; 16]; 8];
        for (row, v) in sums.iter_mut().zip(rows) {
            // SAFETY: a row of `sums` holds 16 >= LANES values.
            unsafe { v.store(row.as_mut_ptr()) };
        }
        for l in 0..lanes.min(Self::LANES) {
            for (r, row) in sums.iter().take(rows.len()).enumerate() {
                // SAFETY: the caller's promise.
                unsafe { *out.add(l * stride + r) = row[l] };
            }
        }
    }
}

/// 16 lanes of AVX-512 F.
#[derive(Clone, Copy)]
pub(crate) struct Wide(__m512);

/// 8 lanes of AVX2 with FMA.
#[derive(Clone, Copy)]
pub(crate) struct Narrow(__m256);

/// `LANES` weights of a type without a vector conversion, widened one by one.
///
/// # Safety
/// `p` must point at `N` readable elements.
#[inline(always)]
unsafe fn widened<W: WeightElem, const N: usize>(p: *const W) -> [f32; N] {
    // SAFETY: l < N elements from p (the caller's promise).
    std::array::from_fn(|l| unsafe { *p.add(l) }.to_f32())
}

/// The methods of [`Vector`] that the two widths write alike but for the names of
/// their intrinsics: `splat`, `load`, `load_weights`, `store`, `add`, `fmadd` and
/// `clamp`, expanded inside a width's `impl Vector`. `load_halves` reads `lanes` 16-bit
/// values (through a pointer of the integer vector type it names), which f16 widens
/// with `f16_to_f32` and bf16 with `u16_to_u32`, a 16-bit `shift_left` and
/// `bits_to_f32`.
macro_rules! lane_wise_methods {
    (
        lanes: $lanes:literal,
        splat: $splat:ident,
        load: $load:ident,
        store: $store:ident,
        add: $add:ident,
        fmadd: $fmadd:ident,
        min: $min:ident,
        max: $max:ident,
        load_halves: $load_halves:ident as $halves_ptr:ty,
        f16_to_f32: $f16_to_f32:ident,
        u16_to_u32: $u16_to_u32:ident,
        shift_left: $shift_left:ident,
        bits_to_f32: $bits_to_f32:ident,
    ) => {
        // SAFETY (every method): as for the impl that expands this, the trait's contract
        // that the CPU has the width's instructions; pointers are the callers' to keep in
        // bounds.
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Self(unsafe { $splat(x) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Self(unsafe { $load(p) })
        }
        #[inline(always)]
        unsafe fn load_weights<W: WeightElem>(p: *const W) -> Self {
            unsafe {
                if TypeId::of::<W>() == TypeId::of::<f32>() {
                    Self::load(p as *const f32)
                } else if TypeId::of::<W>() == TypeId::of::<f16>() {
                    Self($f16_to_f32($load_halves(p as $halves_ptr)))
                } else if TypeId::of::<W>() == TypeId::of::<bf16>() {
                    let h = $u16_to_u32($load_halves(p as $halves_ptr));
                    Self($bits_to_f32($shift_left::<16>(h)))
                } else {
                    Self::load(widened::<W, $lanes>(p).as_ptr())
                }
            }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { $store(p, self.0) }
        }
        #[inline(always)]
        unsafe fn add(self, other: Self) -> Self {
            Self(unsafe { $add(self.0, other.0) })
        }
        #[inline(always)]
        unsafe fn fmadd(self, w: Self, acc: Self) -> Self {
            Self(unsafe { $fmadd(self.0, w.0, acc.0) })
        }
        #[inline(always)]
        unsafe fn clamp(self, lo: Self, hi: Self) -> Self {
            Self(unsafe { $min(hi.0, $max(lo.0, self.0)) })
        }
    };
}

// SAFETY (every method of both impls): the trait's contract, that the CPU has the
// width's instructions; pointer reads and writes are the callers' to keep in bounds,
// and masked-off lanes are neither read nor written.
impl Vector for Wide {
    const LANES: usize = 16;
    type Mask = __mmask16;
    lane_wise_methods! {
        lanes: 16,
        splat: _mm512_set1_ps,
        load: _mm512_loadu_ps,
        store: _mm512_storeu_ps,
        add: _mm512_add_ps,
        fmadd: _mm512_fmadd_ps,
        min: _mm512_min_ps,
        max: _mm512_max_ps,
        load_halves: _mm256_loadu_si256 as *const __m256i,
        f16_to_f32: _mm512_cvtph_ps,
        u16_to_u32: _mm512_cvtepu16_epi32,
        shift_left: _mm512_slli_epi32,
        bits_to_f32: _mm512_castsi512_ps,
    }
    #[inline(always)]
    unsafe fn reduce_add(self) -> f32 {
        unsafe { _mm512_reduce_add_ps(self.0) }
    }
    #[inline(always)]
    unsafe fn mask(lanes: u16) -> __mmask16 {
        lanes
    }
    #[inline(always)]
    unsafe fn load_masked(p: *const f32, m: __mmask16) -> Self {
        Wide(unsafe { _mm512_maskz_loadu_ps(m, p) })
    }
    #[inline(always)]
    unsafe fn store_first(self, p: *mut f32, lanes: usize) {
        let m = ((1u32 << lanes) - 1) as __mmask16;
        unsafe { _mm512_mask_storeu_ps(p, m, self.0) }
    }
    #[inline(always)]
    unsafe fn evens(a: Self, b: Self) -> Self {
        unsafe {
            let idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            Wide(_mm512_permutex2var_ps(a.0, idx, b.0))
        }
    }
    #[inline(always)]
    unsafe fn odds(a: Self, b: Self) -> Self {
        unsafe {
            let idx = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
            Wide(_mm512_permutex2var_ps(a.0, idx, b.0))
        }
    }
    /// An 8x16 transpose in registers (missing rows zero): two rounds of unpacks make,
    /// in each 128-bit block `j`, channel `4j + i`'s rows 0-3 (`u[i]`) and 4-7
    /// (`u[4 + i]`); a two-source permute pairs them into channels `i`, `4 + i`,
    /// `8 + i`, `12 + i`, eight rows each; each half is one masked store.
    #[inline(always)]
    unsafe fn store_transposed(rows: &[Self], out: *mut f32, stride: usize, lanes: usize) {
        let n = rows.len().min(8);
        unsafe {
            let a: [__m512; 8] = std::array::from_fn(|r| match rows.get(r) {
                Some(v) if r < n => v.0,
                _ => _mm512_setzero_ps(),
            });
            // t[2p], t[2p + 1]: the low and high unpacks of rows 2p and 2p + 1.
            let t: [__m512d; 8] = std::array::from_fn(|i| {
                let (x, y) = (a[i & !1], a[i | 1]);
                _mm512_castps_pd(match i % 2 {
                    0 => _mm512_unpacklo_ps(x, y),
                    _ => _mm512_unpackhi_ps(x, y),
                })
            });
            // u[4h + j]: channel 4b + j of rows 4h .. 4h + 4 in block b, from the 64-bit
            // halves of t[4h + j / 2] and t[4h + j / 2 + 2].
            let u: [__m512; 8] = std::array::from_fn(|i| {
                let (x, y) = (t[(i & !3) + (i % 4) / 2], t[(i & !3) + (i % 4) / 2 + 2]);
                _mm512_castpd_ps(match i % 2 {
                    0 => _mm512_unpacklo_pd(x, y),
                    _ => _mm512_unpackhi_pd(x, y),
                })
            });
            let first_blocks =
                _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
            let last_blocks =
                _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
            let low = ((1u32 << n) - 1) as __mmask16;
            let high = low << 8;
            for i in 0..4 {
                let pairs = [
                    _mm512_permutex2var_ps(u[i], first_blocks, u[4 + i]),
                    _mm512_permutex2var_ps(u[i], last_blocks, u[4 + i]),
                ];
                for (half, pair) in pairs.into_iter().enumerate() {
                    // Channel `c` in the low half, `c + 4` in the high half (stored
                    // from 8 lanes before its row: lanes 0-7 are masked off).
                    let c = 8 * half + i;
                    if c < lanes {
                        _mm512_mask_storeu_ps(out.wrapping_add(c * stride), low, pair);
                    }
                    if c + 4 < lanes {
                        let at = out.wrapping_add((c + 4) * stride).wrapping_sub(8);
                        _mm512_mask_storeu_ps(at, high, pair);
                    }
                }
            }
        }
    }
}

impl Vector for Narrow {
    const LANES: usize = 8;
    type Mask = __m256i;
    lane_wise_methods! {
        lanes: 8,
        splat: _mm256_set1_ps,
        load: _mm256_loadu_ps,
        store: _mm256_storeu_ps,
        add: _mm256_add_ps,
        fmadd: _mm256_fmadd_ps,
        min: _mm256_min_ps,
        max: _mm256_max_ps,
        load_halves: _mm_loadu_si128 as *const __m128i,
        f16_to_f32: _mm256_cvtph_ps,
        u16_to_u32: _mm256_cvtepu16_epi32,
        shift_left: _mm256_slli_epi32,
        bits_to_f32: _mm256_castsi256_ps,
    }
    #[inline(always)]
    unsafe fn reduce_add(self) -> f32 {
        unsafe {
            let s = _mm_add_ps(
                _mm256_castps256_ps128(self.0),
                _mm256_extractf128_ps::<1>(self.0),
            );
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }
    }
    #[inline(always)]
    unsafe fn mask(lanes: u16) -> __m256i {
        unsafe {
            let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
            let set = _mm256_and_si256(_mm256_set1_epi32(lanes as i32), bit);
            _mm256_cmpeq_epi32(set, bit)
        }
    }
    #[inline(always)]
    unsafe fn load_masked(p: *const f32, m: __m256i) -> Self {
        Narrow(unsafe { _mm256_maskload_ps(p, m) })
    }
    #[inline(always)]
    unsafe fn store_first(self, p: *mut f32, lanes: usize) {
        unsafe { _mm256_maskstore_ps(p, Self::mask((1u16 << lanes) - 1), self.0) }
    }
    #[inline(always)]
    unsafe fn evens(a: Self, b: Self) -> Self {
        unsafe {
            // a0 a2 b0 b2 | a4 a6 b4 b6, then the 64-bit pairs in order 0, 2, 1, 3.
            let mixed = _mm256_shuffle_ps::<0b10_00_10_00>(a.0, b.0);
            Narrow(_mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(
                _mm256_castps_pd(mixed),
            )))
        }
    }
    #[inline(always)]
    unsafe fn odds(a: Self, b: Self) -> Self {
        unsafe {
            let mixed = _mm256_shuffle_ps::<0b11_01_11_01>(a.0, b.0);
            Narrow(_mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(
                _mm256_castps_pd(mixed),
            )))
        }
    }
}

/// The transpose of 16 rows of 16 values: vector `c` of the result holds value `c`
/// of each row, row `r` in lane `r`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn transpose_16x16(rows: [__m512; 16]) -> [__m512; 16] {
    // Pairs of rows interleaved within each 128-bit chunk q: `pairs[2i]` holds
    // rows 2i, 2i+1 at values 4q and 4q+1, `pairs[2i + 1]` at 4q+2 and 4q+3.
    let mut pairs = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        pairs[2 * i] = _mm512_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
        pairs[2 * i + 1] = _mm512_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
    }
    // Quads: `quads[4k + c]` holds rows 4k..4k+4 at value 4q + c in chunk q.
    let mut quads = [_mm512_setzero_ps(); 16];
    for k in 0..4 {
        let (lo_a, hi_a) = (pairs[4 * k], pairs[4 * k + 1]);
        let (lo_b, hi_b) = (pairs[4 * k + 2], pairs[4 * k + 3]);
        let pd = |a: __m512, b: __m512, high: bool| {
            let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
            let v = if high {
                _mm512_unpackhi_pd(a, b)
            } else {
                _mm512_unpacklo_pd(a, b)
            };
            _mm512_castpd_ps(v)
        };
        quads[4 * k] = pd(lo_a, lo_b, false);
        quads[4 * k + 1] = pd(lo_a, lo_b, true);
        quads[4 * k + 2] = pd(hi_a, hi_b, false);
        quads[4 * k + 3] = pd(hi_a, hi_b, true);
    }
    // A 4x4 transpose of 128-bit chunks for each c: value 4q + c of every row is
    // chunk q of quads[c], quads[4 + c], quads[8 + c], quads[12 + c].
    let mut columns = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let (v0, v1, v2, v3) = (quads[c], quads[4 + c], quads[8 + c], quads[12 + c]);
        let x0 = _mm512_shuffle_f32x4::<0x44>(v0, v1);
        let x1 = _mm512_shuffle_f32x4::<0xEE>(v0, v1);
        let x2 = _mm512_shuffle_f32x4::<0x44>(v2, v3);
        let x3 = _mm512_shuffle_f32x4::<0xEE>(v2, v3);
        columns[c] = _mm512_shuffle_f32x4::<0x88>(x0, x2);
        columns[4 + c] = _mm512_shuffle_f32x4::<0xDD>(x0, x2);
        columns[8 + c] = _mm512_shuffle_f32x4::<0x88>(x1, x3);
        columns[12 + c] = _mm512_shuffle_f32x4::<0xDD>(x1, x3);
    }
    columns
}

/// The 16-lane mask of the first `n` lanes (all 16 for `n >= 16`).
#[inline(always)]
pub(crate) fn first_lanes(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}
