//! Memory-layout changes between channels-first (NCHW) and channels-last (NHWC)
//! images: a batch of 2-d transposes, blocked so that both sides are read and written
//! in cache-line runs.
//!
//! An NHWC image is the matrix `[H·W, C]` and its NCHW form the matrix `[C, H·W]`, so
//! both directions are [`transpose_batched`] with the two extents swapped:
//!
//! ```
//! use etch_linalg::layout::transpose_batched;
//!
//! // One 2x2 image with 3 channels, channels last: pixel-major.
//! let nhwc = [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23];
//! let mut nchw = [0; 12];
//! assert!(transpose_batched(&nhwc, &mut nchw, 1, 4, 3)); // [H*W, C] -> [C, H*W]
//! assert_eq!(nchw, [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]);
//! ```

/// Side of the square tiles the transpose walks (elements).
const TILE: usize = 16;

/// Writes, for every batch `b`, the transpose of the row-major matrix
/// `src[b]: [rows, cols]` into `dst[b]: [cols, rows]`.
///
/// Returns `false` (and writes nothing) when either slice is not exactly
/// `batch * rows * cols` long, or that product overflows.
pub fn transpose_batched<T: Copy>(
    src: &[T],
    dst: &mut [T],
    batch: usize,
    rows: usize,
    cols: usize,
) -> bool {
    let Some(len) = batch.checked_mul(rows).and_then(|n| n.checked_mul(cols)) else {
        return false;
    };
    if src.len() != len || dst.len() != len {
        return false;
    }
    if len == 0 {
        return true;
    }
    let plane = rows * cols;
    for (s, d) in src.chunks_exact(plane).zip(dst.chunks_exact_mut(plane)) {
        for r0 in (0..rows).step_by(TILE) {
            let r1 = (r0 + TILE).min(rows);
            for c0 in (0..cols).step_by(TILE) {
                let c1 = (c0 + TILE).min(cols);
                for r in r0..r1 {
                    let row = &s[r * cols..][c0..c1];
                    for (c, &v) in (c0..c1).zip(row) {
                        d[c * rows + r] = v;
                    }
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_the_index_definition(batch in 0usize..3, rows in 0usize..40, cols in 0usize..40) {
            let len = batch * rows * cols;
            let src: Vec<u32> = (0..len as u32).collect();
            let mut dst = vec![u32::MAX; len];
            prop_assert!(transpose_batched(&src, &mut dst, batch, rows, cols));
            for b in 0..batch {
                for r in 0..rows {
                    for c in 0..cols {
                        prop_assert_eq!(dst[(b * cols + c) * rows + r], src[(b * rows + r) * cols + c]);
                    }
                }
            }
            // Twice is the identity.
            let mut back = vec![0u32; len];
            prop_assert!(transpose_batched(&dst, &mut back, batch, cols, rows));
            prop_assert_eq!(back, src);
        }
    }

    #[test]
    fn wrong_lengths_are_refused() {
        let src = [1f32; 6];
        let mut dst = [0f32; 5];
        assert!(!transpose_batched(&src, &mut dst, 1, 2, 3));
        assert!(dst.iter().all(|&v| v == 0.0));
        assert!(!transpose_batched(&src, &mut [0f32; 6], usize::MAX, 2, 3));
    }
}
