//! Elementwise functions computed the way XNNPACK computes them on this CPU, not
//! correctly rounded: the official runtime's XNNPACK delegate uses hardware estimates
//! refined by Newton steps, and a result one ulp away from theirs can flip the rounding
//! of a dynamically quantized activation downstream (an 8da4w LLM then drifts from the
//! official tokens). Each function picks the estimate instruction XNNPACK's config
//! picks for the same CPU (google/XNNPACK `src/configs/unary-elementwise-config.c`,
//! `init_f32_rsqrt_config_impl`, default "inconsistent arithmetic" choice).

use crate::Isa;

/// `out[i] = 1 / sqrt(x[i])` as XNNPACK's f32 reciprocal-square-root kernel computes it
/// on `isa`: on AVX-512 `vrsqrt14ps` and on AVX2 `vrsqrtps`, each refined by one
/// Newton step in XNNPACK's operation order (`src/f32-vrsqrt/simd-rsqrt.c.in`), 0 for
/// +inf; elsewhere the correctly rounded `1 / sqrt(x)` (XNNPACK's sqrt-based kernels).
pub fn rsqrt(isa: Isa, x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let (x, out) = (&x[..n], &mut out[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(t) | Isa::Avx512Vnni(t) => x86::rsqrt_avx512(t, x, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => x86::rsqrt_avx(t, x, out),
        _ => rsqrt_scalar(x, out),
    }
}

/// `out[i] = 1 / (1 + exp(-x[i]))` as XNNPACK's f32 sigmoid kernel computes it on
/// `isa`. On AVX-512 that kernel (google/XNNPACK
/// `src/f32-vsigmoid/gen/f32-vsigmoid-avx512f-rr2-lut32-p2-perm2-scalef-div-u64.c`)
/// evaluates `e = exp(-|x|)` from a 32-entry table of `2^(i/32)`, a two-constant
/// range reduction and a degree-2 polynomial, scales with `vscalefps`, and returns
/// `e / (e + 1)`, or `1 - e / (e + 1)` for non-negative `x`; this reproduces it
/// operation for operation. Elsewhere: the correctly rounded function.
pub fn sigmoid(isa: Isa, x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let (x, out) = (&x[..n], &mut out[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(t) | Isa::Avx512Vnni(t) => x86::sigmoid_avx512(t, x, out),
        _ => sigmoid_scalar(x, out),
    }
}

/// The correctly rounded sigmoid.
pub fn sigmoid_scalar(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = 1.0 / (1.0 + (-v).exp());
    }
}

/// `2^(i/32)` rounded to f32, `i` in `0..32` (the sigmoid kernel's table).
#[cfg(target_arch = "x86_64")]
fn exp2_table() -> &'static [f32; 32] {
    static TABLE: std::sync::OnceLock<[f32; 32]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|i| (i as f64 / 32.0).exp2() as f32))
}

/// The correctly rounded twin.
pub fn rsqrt_scalar(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = 1.0 / v.sqrt();
    }
}

/// One Newton step for `1/sqrt(x)` from the estimate `y`, in XNNPACK's order (separate
/// multiplies and subtractions, no fused multiply-add), and 0 for `x = +inf`.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86 estimates only
fn newton_step(x: f32, y: f32) -> f32 {
    let t1 = y * y;
    let t2 = x * t1;
    let t3 = t2 - 1.0;
    let t4 = 0.5 * y;
    let t5 = t3 * t4;
    let y = y - t5;
    if x == f32::INFINITY { 0.0 } else { y }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::newton_step;
    use crate::CpuSupport;

    pub(super) fn rsqrt_avx512(_proof: CpuSupport, x: &[f32], out: &mut [f32]) {
        // SAFETY: the proof says the CPU has AVX-512 F.
        unsafe { rsqrt_avx512_impl(x, out) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn rsqrt_avx512_impl(x: &[f32], out: &mut [f32]) {
        let (one, half, inf) = (
            _mm512_set1_ps(1.0),
            _mm512_set1_ps(0.5),
            _mm512_set1_ps(f32::INFINITY),
        );
        let mut xs = x.chunks_exact(16);
        let mut os = out.chunks_exact_mut(16);
        for (xc, oc) in (&mut xs).zip(&mut os) {
            // SAFETY: both chunks hold 16 f32.
            unsafe {
                let vx = _mm512_loadu_ps(xc.as_ptr());
                let y = _mm512_rsqrt14_ps(vx);
                let t1 = _mm512_mul_ps(y, y);
                let t2 = _mm512_mul_ps(vx, t1);
                let t3 = _mm512_sub_ps(t2, one);
                let t4 = _mm512_mul_ps(half, y);
                let t5 = _mm512_mul_ps(t3, t4);
                let y = _mm512_sub_ps(y, t5);
                let is_inf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(inf, vx);
                let y = _mm512_maskz_mov_ps(!is_inf, y);
                _mm512_storeu_ps(oc.as_mut_ptr(), y);
            }
        }
        for (o, &v) in os.into_remainder().iter_mut().zip(xs.remainder()) {
            // The same estimate on one lane (AVX-512 F is this function's feature).
            let y = _mm_cvtss_f32(_mm_rsqrt14_ss(_mm_setzero_ps(), _mm_set_ss(v)));
            *o = newton_step(v, y);
        }
    }

    pub(super) fn sigmoid_avx512(_proof: CpuSupport, x: &[f32], out: &mut [f32]) {
        // SAFETY: the proof says the CPU has AVX-512 F.
        unsafe { sigmoid_avx512_impl(x, out, super::exp2_table()) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn sigmoid16(vx: __m512, lo: __m512, hi: __m512) -> __m512 {
        let sign = _mm512_set1_epi32(i32::MIN);
        let magic = _mm512_set1_ps(f32::from_bits(0x48c0_0000)); // 1.5 * 2^18
        let log2e = _mm512_set1_ps(f32::from_bits(0x3fb8_aa3b));
        let minus_ln2_hi = _mm512_set1_ps(-f32::from_bits(0x3f31_7218));
        let minus_ln2_lo = _mm512_set1_ps(f32::from_bits(0x3102_e308));
        let c2 = _mm512_set1_ps(0.5);
        let c1 = _mm512_set1_ps(f32::from_bits(0x3f80_007b));
        let one = _mm512_set1_ps(1.0);
        // z = -|x|; n = round(z * log2(e), to 1/32) held in the magic-biased mantissa.
        let z = _mm512_castsi512_ps(_mm512_or_epi32(_mm512_castps_si512(vx), sign));
        let n = _mm512_fmadd_ps(z, log2e, magic);
        let l = _mm512_permutex2var_ps(lo, _mm512_castps_si512(n), hi);
        let n = _mm512_sub_ps(n, magic);
        let t = _mm512_fmadd_ps(n, minus_ln2_hi, z);
        let t = _mm512_fmadd_ps(n, minus_ln2_lo, t);
        let p = _mm512_fmadd_ps(t, c2, c1);
        let t = _mm512_mul_ps(t, l);
        let p = _mm512_fmadd_ps(t, p, l);
        let e = _mm512_scalef_ps(p, n);
        let f = _mm512_div_ps(e, _mm512_add_ps(e, one));
        let non_negative = _mm512_testn_epi32_mask(_mm512_castps_si512(vx), sign);
        _mm512_mask_sub_ps(f, non_negative, one, f)
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn sigmoid_avx512_impl(x: &[f32], out: &mut [f32], table: &[f32; 32]) {
        // SAFETY: the table holds 32 f32.
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_ps(table.as_ptr()),
                _mm512_loadu_ps(table.as_ptr().add(16)),
            )
        };
        let mut xs = x.chunks_exact(16);
        let mut os = out.chunks_exact_mut(16);
        for (xc, oc) in (&mut xs).zip(&mut os) {
            // SAFETY: both chunks hold 16 f32.
            unsafe {
                let y = sigmoid16(_mm512_loadu_ps(xc.as_ptr()), lo, hi);
                _mm512_storeu_ps(oc.as_mut_ptr(), y);
            }
        }
        let (xr, or) = (xs.remainder(), os.into_remainder());
        if !xr.is_empty() {
            // The tail through the same lanes (as XNNPACK's masked tail).
            let mut buf = [0f32; 16];
            buf[..xr.len()].copy_from_slice(xr);
            // SAFETY: buf holds 16 f32.
            unsafe {
                let y = sigmoid16(_mm512_loadu_ps(buf.as_ptr()), lo, hi);
                _mm512_storeu_ps(buf.as_mut_ptr(), y);
            }
            or.copy_from_slice(&buf[..xr.len()]);
        }
    }

    pub(super) fn rsqrt_avx(_proof: CpuSupport, x: &[f32], out: &mut [f32]) {
        // SAFETY: the proof says the CPU has AVX2 (and so AVX).
        unsafe { rsqrt_avx_impl(x, out) }
    }

    #[target_feature(enable = "avx")]
    unsafe fn rsqrt_avx_impl(x: &[f32], out: &mut [f32]) {
        let (one, half, inf) = (
            _mm256_set1_ps(1.0),
            _mm256_set1_ps(0.5),
            _mm256_set1_ps(f32::INFINITY),
        );
        let mut xs = x.chunks_exact(8);
        let mut os = out.chunks_exact_mut(8);
        for (xc, oc) in (&mut xs).zip(&mut os) {
            // SAFETY: both chunks hold 8 f32.
            unsafe {
                let vx = _mm256_loadu_ps(xc.as_ptr());
                let y = _mm256_rsqrt_ps(vx);
                let t1 = _mm256_mul_ps(y, y);
                let t2 = _mm256_mul_ps(vx, t1);
                let t3 = _mm256_sub_ps(t2, one);
                let t4 = _mm256_mul_ps(half, y);
                let t5 = _mm256_mul_ps(t3, t4);
                let y = _mm256_sub_ps(y, t5);
                let is_inf = _mm256_cmp_ps::<_CMP_EQ_OQ>(inf, vx);
                _mm256_storeu_ps(oc.as_mut_ptr(), _mm256_andnot_ps(is_inf, y));
            }
        }
        for (o, &v) in os.into_remainder().iter_mut().zip(xs.remainder()) {
            // The same estimate on one lane.
            let y = _mm_cvtss_f32(_mm_rsqrt_ss(_mm_set_ss(v)));
            *o = newton_step(v, y);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_on_every_isa_is_close_to_the_exact_value() {
        let x: Vec<f32> = (-2000..2000)
            .map(|i| i as f32 * 0.011)
            .chain([0.0, -0.0, 80.0, -80.0])
            .collect();
        let mut want = vec![0f32; x.len()];
        sigmoid_scalar(&x, &mut want);
        for &isa in Isa::available() {
            let mut got = vec![0f32; x.len()];
            sigmoid(isa, &x, &mut got);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 3e-7 + 2e-6 * w,
                    "{}: sigmoid({}) = {g}, want {w}",
                    isa.name(),
                    x[i]
                );
            }
        }
    }

    #[test]
    fn every_isa_is_within_a_few_ulps_of_the_exact_value() {
        let x: Vec<f32> = (0..1000)
            .map(|i| 1e-6 * 1.037f32.powi(i))
            .chain([f32::INFINITY, 0.0, 1.0, 4.0])
            .collect();
        let mut want = vec![0f32; x.len()];
        rsqrt_scalar(&x, &mut want);
        for &isa in Isa::available() {
            let mut got = vec![0f32; x.len()];
            rsqrt(isa, &x, &mut got);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                if x[i] == f32::INFINITY {
                    assert_eq!(g, 0.0, "{}: rsqrt(inf)", isa.name());
                } else if x[i] == 0.0 {
                    // XNNPACK's Newton step turns the estimate's inf into NaN (0 x inf).
                    assert!(
                        g.is_nan() || g == f32::INFINITY,
                        "{}: rsqrt(0) = {g}",
                        isa.name()
                    );
                } else {
                    assert!(
                        (g - w).abs() <= 4e-7 * w,
                        "{}: rsqrt({}) = {g}, want {w}",
                        isa.name(),
                        x[i]
                    );
                }
            }
        }
    }
}
