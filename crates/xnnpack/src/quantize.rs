//! The dynamically quantized linear path (8da4w / 8da8w) as the interpreter stores it:
//! a qdint8 value occupies its arena slot as int8 rows of stride
//! [`qd8_row_stride`]`(row)` (packed four to an f32 word), followed by one
//! `(dequantization scale, zero point)` pair per row. The arithmetic itself, XNNPACK's
//! per-token quantization and the int8 products, is `etch_linalg::quant`.

use etch_kernels::{KernelError, ThreadPool};
use etch_linalg::quant::{Qd8Rows, Qd8Weights, gemm_qd8, gemm_qd8_scratch_len_for, qd8_row_stride};

fn short(what: &str) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {what}: operand too short"))
}

fn linalg(e: etch_linalg::LinalgError) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {e}"))
}

/// f32 words holding the int8 codes of `rows` rows of `row` values.
pub fn code_words(rows: usize, row: usize) -> Option<usize> {
    Some(rows.checked_mul(qd8_row_stride(row))?.div_ceil(4))
}

/// Arena elements of a qdint8 value of `rows` rows of `row` values.
pub fn slot_len(rows: usize, row: usize) -> Option<usize> {
    code_words(rows, row)?.checked_add(rows.checked_mul(2)?)
}

/// `FullyConnected` qdint8 x quantized weights, `m` rows.
#[allow(clippy::too_many_arguments)]
pub fn fully_connected_qd8(
    pool: &ThreadPool,
    m: usize,
    w: &Qd8Weights,
    x: &[f32],
    bias: Option<&[f32]>,
    min: f32,
    max: f32,
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), KernelError> {
    let words = code_words(m, w.k()).ok_or_else(|| short("quantized fully connected"))?;
    if x.len() < words + 2 * m {
        return Err(short("quantized fully connected"));
    }
    let (codes, params) = x.split_at(words);
    let rows = Qd8Rows {
        m,
        q: bytemuck::cast_slice(codes),
        params: &params[..2 * m],
    };
    let need = gemm_qd8_scratch_len_for(m, w, pool.threads());
    let scratch = scratch
        .get_mut(..need)
        .ok_or_else(|| short("GEMM scratch"))?;
    gemm_qd8(pool, &rows, w, bias, (min, max), out, scratch).map_err(linalg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::convert::quantize_rows;

    #[test]
    fn quantized_product_approximates_the_float_one() {
        let k = 64;
        let x: Vec<f32> = (0..k).map(|i| (i as f32 - 30.0) / 17.0).collect();
        let mut slot = vec![0f32; slot_len(1, k).unwrap()];
        quantize_rows(k, &x, &mut slot).unwrap();
        let values: Vec<i8> = (0..2 * k).map(|i| ((i * 5) % 15) as i8 - 8).collect();
        let scales = [0.01f32, 0.02, 0.03, 0.04];
        let w =
            Qd8Weights::from_int4(2, k, 32, &scales, |j, c| (values[j * k + c] + 8) as u8).unwrap();
        let mut out = [0f32; 2];
        let mut scratch = vec![0f32; etch_linalg::quant::gemm_qd8_scratch_len(1, &w)];
        fully_connected_qd8(
            &ThreadPool::serial(),
            1,
            &w,
            &slot,
            Some(&[0.5, -0.5]),
            f32::NEG_INFINITY,
            f32::INFINITY,
            &mut out,
            &mut scratch,
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
