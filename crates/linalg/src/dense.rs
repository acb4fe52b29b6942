//! Scalar reference matrix products over row-major slices with leading dimensions,
//! used by the XNNPACK delegate until it moves onto the shared packed GEMM. Every
//! index is checked by slicing (a short operand panics in debug tests only through
//! the callers' own checks: the functions return `false` instead of reading out of
//! bounds).

/// A row-major matrix view: element `(i, j)` at `i * ld + j`.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Row stride (elements).
    pub ld: usize,
}

fn fits(len: usize, rows: usize, cols: usize, ld: usize) -> bool {
    rows == 0
        || cols == 0
        || (rows - 1)
            .checked_mul(ld)
            .and_then(|r| r.checked_add(cols))
            .is_some_and(|need| need <= len)
}

/// `c[i, j] = clamp(sum_k a[i, k] * b[j, k] + bias[j], min, max)` for `i < m`, `j < n`:
/// B is `[n, k]` (output-channel rows, the layout of a linear layer's weight).
/// Returns `false` (and writes nothing) when an operand is too short.
#[allow(clippy::too_many_arguments)]
pub fn matmul_nt(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    bias: Option<&[f32]>,
    c: &mut [f32],
    ldc: usize,
    min: f32,
    max: f32,
) -> bool {
    if !fits(a.data.len(), m, k, a.ld)
        || !fits(b.data.len(), n, k, b.ld)
        || !fits(c.len(), m, n, ldc)
        || bias.is_some_and(|b| b.len() < n)
    {
        return false;
    }
    for i in 0..m {
        let arow = &a.data[i * a.ld..i * a.ld + k];
        let crow = &mut c[i * ldc..i * ldc + n];
        for (j, out) in crow.iter_mut().enumerate() {
            let brow = &b.data[j * b.ld..j * b.ld + k];
            let mut acc = [0f32; 8];
            let mut ac = arow.chunks_exact(8);
            let mut bc = brow.chunks_exact(8);
            for (x, w) in (&mut ac).zip(&mut bc) {
                for l in 0..8 {
                    acc[l] = x[l].mul_add(w[l], acc[l]);
                }
            }
            let mut s: f32 = acc.iter().sum();
            for (x, w) in ac.remainder().iter().zip(bc.remainder()) {
                s = x.mul_add(*w, s);
            }
            if let Some(bias) = bias {
                s += bias[j];
            }
            *out = s.max(min).min(max);
        }
    }
    true
}

/// `c[i, j] = sum_k a[i, k] * b[k, j]`: B is `[k, n]`. Returns `false` when an operand
/// is too short.
pub fn matmul_nn(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
) -> bool {
    if !fits(a.data.len(), m, k, a.ld)
        || !fits(b.data.len(), k, n, b.ld)
        || !fits(c.len(), m, n, ldc)
    {
        return false;
    }
    for i in 0..m {
        let crow = &mut c[i * ldc..i * ldc + n];
        crow.fill(0.0);
        for kk in 0..k {
            let x = a.data[i * a.ld + kk];
            let brow = &b.data[kk * b.ld..kk * b.ld + n];
            for (o, &w) in crow.iter_mut().zip(brow) {
                *o = x.mul_add(w, *o);
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
        fn nt_matches_nn_on_the_transpose(m in 1usize..6, n in 1usize..7, k in 1usize..20, seed in 0u32..1000) {
            let a: Vec<f32> = (0..m * k).map(|i| ((i as u32 * 7 + seed) % 13) as f32 - 6.0).collect();
            let b: Vec<f32> = (0..n * k).map(|i| ((i as u32 * 5 + seed) % 11) as f32 - 5.0).collect();
            let mut bt = vec![0f32; k * n];
            for j in 0..n { for kk in 0..k { bt[kk * n + j] = b[j * k + kk]; } }
            let mut c1 = vec![0f32; m * n];
            let mut c2 = vec![0f32; m * n];
            let ok = matmul_nt(m, n, k, Mat { data: &a, ld: k }, Mat { data: &b, ld: k }, None, &mut c1, n, f32::NEG_INFINITY, f32::INFINITY);
            prop_assert!(ok);
            let ok = matmul_nn(m, n, k, Mat { data: &a, ld: k }, Mat { data: &bt, ld: n }, &mut c2, n);
            prop_assert!(ok);
            prop_assert_eq!(c1, c2);
        }
    }

    #[test]
    fn short_operands_are_refused() {
        let a = [1.0f32; 3];
        let mut c = [0f32; 4];
        assert!(!matmul_nt(
            2,
            2,
            2,
            Mat { data: &a, ld: 2 },
            Mat { data: &a, ld: 2 },
            None,
            &mut c,
            2,
            0.0,
            1.0
        ));
    }
}
