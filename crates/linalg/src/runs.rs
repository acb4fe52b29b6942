//! Sums of consecutive runs of f32 values (a mean over a tensor's last dims: global
//! average pooling of NCHW planes), each summed left to right from 0 in f32, the order
//! of the portable reduction, so every ISA gives the same bits.
//!
//! With AVX-512, sixteen runs are summed at once, lane `r` holding run `r`'s sum: step
//! `j` gathers value `j` of each run (the runs lie `run` apart) and adds it, so each sum
//! still takes its values in order.

use crate::Isa;

/// `out[i] = ((0 + data[i*run]) + data[i*run + 1]) + ...` over the run's `run` values,
/// for each of `out`'s runs.
///
/// # Panics
/// When `data` holds fewer than `out.len() * run` values.
pub fn sum_runs(isa: Isa, data: &[f32], run: usize, out: &mut [f32]) {
    let data = &data[..out.len() * run];
    #[cfg(target_arch = "x86_64")]
    if isa.avx512().is_some() && run > 0 && i32::try_from(16 * run).is_ok() {
        let whole = out.len() / 16 * 16;
        let (head, tail) = out.split_at_mut(whole);
        // SAFETY: AVX-512 F was detected (`isa.avx512()`); `head` holds whole groups
        // of 16 runs whose values lie inside `data` (sliced to `out.len() * run`
        // above), every gather offset below `16 * run`, which fits an i32.
        unsafe { x86::sum_sixteen_runs(&data[..whole * run], run, head) };
        sum_runs_scalar(&data[whole * run..], run, tail);
        return;
    }
    let _ = isa;
    sum_runs_scalar(data, run, out);
}

/// [`sum_runs`] one run at a time: the scalar twin.
pub fn sum_runs_scalar(data: &[f32], run: usize, out: &mut [f32]) {
    if run == 0 {
        out.fill(0.0);
        return;
    }
    for (o, values) in out.iter_mut().zip(data.chunks_exact(run)) {
        *o = values.iter().fold(0.0, |s, &v| s + v);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        _mm512_add_ps, _mm512_i32gather_ps, _mm512_mullo_epi32, _mm512_set1_epi32,
        _mm512_setr_epi32, _mm512_setzero_ps, _mm512_storeu_ps,
    };

    /// [`super::sum_runs`] over whole groups of 16 runs.
    ///
    /// # Safety
    /// AVX-512 F; `out.len()` a multiple of 16, `data` at least `out.len() * run`
    /// values, and `16 * run` fits an i32.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_sixteen_runs(data: &[f32], run: usize, out: &mut [f32]) {
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let offsets = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(run as i32));
        for (group, sums) in out.chunks_exact_mut(16).enumerate() {
            let base = &data[group * 16 * run..(group + 1) * 16 * run];
            let mut acc = _mm512_setzero_ps();
            for j in 0..run {
                // SAFETY: lane r reads base[r * run + j], inside `base` (16 runs of
                // `run` values) since j < run.
                let values = unsafe { _mm512_i32gather_ps::<4>(offsets, base.as_ptr().add(j)) };
                acc = _mm512_add_ps(acc, values);
            }
            // SAFETY: `sums` holds 16 values.
            unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), acc) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every instruction set gives the scalar twin's bits.
        #[test]
        fn sums_match_the_scalar_twin(runs in 0usize..70, run in 0usize..80, seed in 0u32..100) {
            let data: Vec<f32> = (0..runs * run)
                .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) >> 8) as f32 / 1e5 - 80.0)
                .collect();
            let mut want = vec![f32::NAN; runs];
            sum_runs_scalar(&data, run, &mut want);
            for &isa in Isa::available() {
                let mut got = vec![f32::NAN; runs];
                sum_runs(isa, &data, run, &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    prop_assert_eq!(g.to_bits(), w.to_bits(), "{:?} run {}", isa, i);
                }
            }
        }
    }
}
