//! The dynamically quantized linear path (8da4w / 8da8w): per-token int8 quantization of
//! activations with XNNPACK's arithmetic, and the qd8 x {qb4w, qc4w, qc8w} fully
//! connected product.
//!
//! A qdint8 value lives in the arena as `rows x row` quantized values (stored as f32
//! integers) followed by one `(dequantization scale, zero point)` pair per row.

use etch_kernels::{KernelError, ThreadPool};

use crate::plan::QuantizedWeights;

fn short(what: &str) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {what}: operand too short"))
}

/// XNNPACK's `xnn_qd8_asymmetric_quantization_params` (google/XNNPACK
/// `src/xnnpack/quantization.h`): the quantization scale (`255 / (rmax - rmin)`, with
/// the range widened to include 0) and the nudged zero point, rounded with `lrintf`.
pub fn qd8_params(min: f32, max: f32) -> (f32, f32) {
    let (qmin, qmax) = (-128f32, 127f32);
    let rmin = min.min(0.0);
    let rmax = max.max(0.0);
    let scale = if rmin == rmax {
        1.0
    } else {
        (qmax - qmin) / (rmax - rmin)
    };
    let dmin = rmin * scale;
    let dmax = rmax * scale;
    let zp = if (qmin + dmin) + (qmax + dmax) > 0.0 {
        qmin - dmin
    } else {
        qmax - dmax
    };
    let zp = zp.clamp(qmin, qmax).round_ties_even();
    (scale, zp)
}

/// Quantizes rows of `row` values: `q = clamp(rint(x * scale) + zp, -128, 127)`; the
/// row's pair is `(1 / scale, zp)` (the f32-qd8 convert of `src/operator-run.c`).
pub fn quantize_rows(row: usize, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    let rows = x.len() / row;
    let (q, params) = out.split_at_mut(rows * row);
    if params.len() < 2 * rows {
        return Err(short("quantize"));
    }
    for ((xs, qs), p) in x
        .chunks_exact(row)
        .zip(q.chunks_exact_mut(row))
        .zip(params.chunks_exact_mut(2))
    {
        let (lo, hi) = xs
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            });
        let (scale, zp) = qd8_params(lo, hi);
        for (d, &v) in qs.iter_mut().zip(xs) {
            *d = ((v * scale).round_ties_even() + zp).clamp(-128.0, 127.0);
        }
        p[0] = 1.0 / scale;
        p[1] = zp;
    }
    Ok(())
}

/// `out[m, n] = clamp(sum over blocks (sum_k (q - zp) w) * scale[n, block] * deq_m +
/// bias[n])`. Block sums are exact in f32 (|q - zp| <= 255, |w| <= 128, blocks of at
/// most 32 x 8 for 4-bit; 8-bit channels sum in i32).
#[allow(clippy::too_many_arguments)]
pub fn fully_connected_qd8(
    pool: &ThreadPool,
    m: usize,
    w: &QuantizedWeights,
    x: &[f32],
    bias: Option<&[f32]>,
    min: f32,
    max: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let (n, k, block) = (w.n, w.k, w.block.max(1));
    let blocks = k.div_ceil(block);
    if x.len() < m * k + 2 * m
        || out.len() < m * n
        || w.values.len() < n * k
        || w.scales.len() < n * blocks
    {
        return Err(short("quantized fully connected"));
    }
    let (q, params) = x.split_at(m * k);
    let out = &mut out[..m * n];
    let cols = n.div_ceil(pool.threads()).max(1);
    for r in 0..m {
        let qr = &q[r * k..(r + 1) * k];
        let (deq, zp) = (params[2 * r], params[2 * r + 1]);
        let zp = zp as i32;
        let row = &mut out[r * n..(r + 1) * n];
        pool.for_each_chunk_mut(row, cols, 1, |t, chunk| {
            let j0 = t * cols;
            for (jj, o) in chunk.iter_mut().enumerate() {
                let j = j0 + jj;
                let wr = &w.values[j * k..(j + 1) * k];
                let mut acc = 0f32;
                for b in 0..blocks {
                    let (s, e) = (b * block, ((b + 1) * block).min(k));
                    let mut isum = 0i32;
                    for (&qv, &wv) in qr[s..e].iter().zip(&wr[s..e]) {
                        isum += (qv as i32 - zp) * i32::from(wv);
                    }
                    acc += isum as f32 * w.scales[j * blocks + b];
                }
                let b = bias.and_then(|b| b.get(j)).copied().unwrap_or(0.0);
                *o = (acc * deq + b).max(min).min(max);
            }
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_follow_xnnpack() {
        // [0, 255] maps to scale 1, zero point -128.
        assert_eq!(qd8_params(0.0, 255.0), (1.0, -128.0));
        // Symmetric range: zero point near 0.
        let (s, zp) = qd8_params(-1.0, 1.0);
        assert!((s - 127.5).abs() < 1e-4);
        assert!(zp == 0.0 || zp == -1.0 || zp == 1.0);
        // A constant row: scale 1.
        assert_eq!(qd8_params(0.0, 0.0).0, 1.0);
    }

    #[test]
    fn quantized_product_approximates_the_float_one() {
        let k = 64;
        let x: Vec<f32> = (0..k).map(|i| (i as f32 - 30.0) / 17.0).collect();
        let mut qx = vec![0f32; k + 2];
        quantize_rows(k, &x, &mut qx).unwrap();
        let values: Vec<i8> = (0..2 * k).map(|i| ((i * 5) % 15) as i8 - 8).collect();
        let scales = vec![0.01f32, 0.02, 0.03, 0.04];
        let w = QuantizedWeights {
            n: 2,
            k,
            block: 32,
            values: values.clone(),
            scales: scales.clone(),
        };
        let mut out = [0f32; 2];
        fully_connected_qd8(
            &ThreadPool::serial(),
            1,
            &w,
            &qx,
            Some(&[0.5, -0.5]),
            f32::NEG_INFINITY,
            f32::INFINITY,
            &mut out,
        )
        .unwrap();
        for j in 0..2 {
            let want: f32 = (0..k)
                .map(|c| x[c] * values[j * k + c] as f32 * scales[j * 2 + c / 32])
                .sum::<f32>()
                + [0.5, -0.5][j];
            assert!((out[j] - want).abs() < 0.02, "{out:?} vs {want}");
        }
    }
}
