//! How a qdint8 value (the dynamically quantized linear path of 8da4w / 8da8w exports)
//! occupies its arena slot: int8 rows of stride [`qd8_row_stride`]`(row)` (packed four
//! to an f32 word), followed by one `(dequantization scale, zero point)` pair per row.
//! The arithmetic itself, XNNPACK's per-token quantization and the int8 products, is
//! `etch_linalg::quant` (called by the `Convert` and `FullyConnected` nodes).

use etch_linalg::quant::qd8_row_stride;

/// f32 words holding the int8 codes of `rows` rows of `row` values.
pub fn code_words(rows: usize, row: usize) -> Option<usize> {
    Some(rows.checked_mul(qd8_row_stride(row))?.div_ceil(4))
}

/// Arena elements of a qdint8 value of `rows` rows of `row` values.
pub fn slot_len(rows: usize, row: usize) -> Option<usize> {
    code_words(rows, row)?.checked_add(rows.checked_mul(2)?)
}
