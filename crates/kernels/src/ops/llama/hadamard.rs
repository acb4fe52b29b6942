//! `llama::fast_hadamard_transform.out`: the Walsh-Hadamard rotation SpinQuant exports
//! apply to activations, along the last dim of an f32 tensor.
//!
//! The last dim `n` is a power of two, or 28 times one. For `n = 2^k` every row is
//! transformed by radix-2 butterflies and scaled by `1 / sqrt(2^k)`. For `n = 28 * 2^k`
//! a row is read as a `[28, 2^k]` matrix: each of its 28 rows is transformed and scaled
//! as above, then each of its `2^k` columns is multiplied by the 28x28 Hadamard matrix
//! below, unscaled (the official kernel does not divide by `sqrt(28)`, so neither does
//! this one).

use etch_base::ScalarType;

use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError};

op_args! {
    /// `fast_hadamard_transform.out(Tensor mat, *, Tensor(a!) out) -> Tensor(a!)`.
    struct FastHadamardArgs = "llama::fast_hadamard_transform.out" {
        mat: crate::Tensor,
        out: OutArg,
    } returns 1
}

/// The Williamson-type Hadamard matrix of order 28 that SpinQuant and QuaRot rotate
/// with (`had.28.will` of N. J. A. Sloane's library of Hadamard matrices), one row per
/// string, `+` for 1 and `-` for -1.
const HADAMARD_28: [&str; 28] = [
    "+------++----++-+--+-+--++--",
    "-+-----+++-----+-+--+-+--++-",
    "--+-----+++---+-+-+----+--++",
    "---+-----+++---+-+-+-+--+--+",
    "----+-----+++---+-+-+++--+--",
    "-----+-----++++--+-+--++--+-",
    "------++----++-+--+-+--++--+",
    "--++++-+-------++--+++-+--+-",
    "---++++-+-----+-++--+-+-+--+",
    "+---+++--+----++-++--+-+-+--",
    "++---++---+----++-++--+-+-+-",
    "+++---+----+----++-++--+-+-+",
    "++++--------+-+--++-++--+-+-",
    "-++++--------+++--++--+--+-+",
    "-+-++-++--++--+--------++++-",
    "+-+-++--+--++--+--------++++",
    "-+-+-++--+--++--+----+---+++",
    "+-+-+-++--+--+---+---++---++",
    "++-+-+-++--+------+--+++---+",
    "-++-+-+-++--+------+-++++---",
    "+-++-+---++--+------+-++++--",
    "-++--++-+-++-+++----++------",
    "+-++--++-+-++-+++-----+-----",
    "++-++---+-+-++-+++-----+----",
    "-++-++-+-+-+-+--+++-----+---",
    "--++-++++-+-+----+++-----+--",
    "+--++-+-++-+-+----+++-----+-",
    "++--++-+-++-+-+----++------+",
];

pub(crate) fn fast_hadamard_transform_out(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    let FastHadamardArgs { mat, out } = FastHadamardArgs::unpack(a)?;
    let out = out.resize(a, mat.sizes())?;
    for (name, t) in [("mat", &mat), ("out", &out)] {
        if t.dtype() != ScalarType::Float {
            return Err(KernelError::UnsupportedDtype {
                dtype: t.dtype(),
                what: "fast_hadamard_transform (f32 only)",
            });
        }
        if !t.is_contiguous() {
            return Err(KernelError::invalid(format!(
                "fast_hadamard_transform: {name} must be in contiguous dim order"
            )));
        }
    }
    if mat.rank() == 0 || mat.numel() == 0 {
        return Ok(());
    }
    let n = mat.sizes()[mat.rank() - 1];
    let (blocks, width) = if n % 28 == 0 { (28, n / 28) } else { (1, n) };
    if !width.is_power_of_two() {
        return Err(KernelError::invalid(format!(
            "fast_hadamard_transform: the last dim ({n}) must be a power of two or 28 times one"
        )));
    }
    let src = ctx.read::<f32>(&mat)?;
    let dst = ctx.write::<f32>(&out)?;
    let numel = mat.numel();
    let (Some(src), Some(dst)) = (src.get(..numel), dst.get_mut(..numel)) else {
        return Err(KernelError::invalid(
            "fast_hadamard_transform: tensor storage is shorter than its shape",
        ));
    };
    dst.copy_from_slice(src);
    let per_row = n.saturating_mul(width.ilog2() as usize + 28);
    let min_rows = (crate::GRAIN_SIZE / per_row.max(1)).max(1);
    ctx.pool().for_each_chunk_mut(dst, n, min_rows, |_, row| {
        for block in row.chunks_exact_mut(width) {
            walsh_hadamard(block);
        }
        if blocks == 28 {
            multiply_columns_by_hadamard_28(row, width);
        }
    });
    Ok(())
}

/// The normalized transform of `v` (its length a power of two), in place.
fn walsh_hadamard(v: &mut [f32]) {
    let n = v.len();
    if n <= 1 {
        return;
    }
    let mut step = 1;
    while step < n {
        for pair in v.chunks_exact_mut(2 * step) {
            let (lo, hi) = pair.split_at_mut(step);
            for (x, y) in lo.iter_mut().zip(hi.iter_mut()) {
                let (a, b) = (*x, *y);
                *x = a + b;
                *y = a - b;
            }
        }
        step *= 2;
    }
    // 1 / sqrt(2^k) = 2^-(k/2), times 1/sqrt(2) for odd k.
    let k = n.trailing_zeros();
    let mut scale = 1.0 / (1u64 << (k / 2)) as f32;
    if k % 2 == 1 {
        scale /= std::f32::consts::SQRT_2;
    }
    v.iter_mut().for_each(|x| *x *= scale);
}

/// Multiplies every column of `row` read as `[28, width]` by [`HADAMARD_28`].
fn multiply_columns_by_hadamard_28(row: &mut [f32], width: usize) {
    let mut column = [0.0f32; 28];
    for c in 0..width {
        for (i, x) in column.iter_mut().enumerate() {
            *x = row[i * width + c];
        }
        for (i, signs) in HADAMARD_28.iter().enumerate() {
            let mut acc = 0.0f32;
            for (&s, &x) in signs.as_bytes().iter().zip(&column) {
                if s == b'+' {
                    acc += x;
                } else {
                    acc -= x;
                }
            }
            row[i * width + c] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_28_matrix_is_hadamard() {
        let sign = |i: usize, j: usize| {
            if HADAMARD_28[i].as_bytes()[j] == b'+' {
                1
            } else {
                -1
            }
        };
        for (i, row) in HADAMARD_28.iter().enumerate() {
            assert_eq!(row.len(), 28);
            for j in 0..28 {
                let dot: i32 = (0..28).map(|k| sign(i, k) * sign(j, k)).sum();
                assert_eq!(dot, if i == j { 28 } else { 0 }, "rows {i} and {j}");
            }
        }
    }

    #[test]
    fn a_last_dim_of_the_wrong_size_or_dtype_is_refused() {
        use crate::testing::Harness;
        use etch_base::ScalarType;
        let run = |sizes: &[usize], dtype: ScalarType| {
            let mut h = Harness::new();
            let n: usize = sizes.iter().product();
            let x = h.tensor_raw(dtype, sizes, &vec![0u8; n * dtype.element_size()]);
            let out = h.out(dtype, sizes);
            h.call("llama::fast_hadamard_transform.out", &[x, out, out])
                .map_err(|e| e.to_string())
        };
        let err = run(&[2, 12], ScalarType::Float).unwrap_err();
        assert!(err.contains("power of two or 28 times one"), "{err}");
        let err = run(&[2, 8], ScalarType::Int).unwrap_err();
        assert!(err.contains("f32 only"), "{err}");
        assert!(run(&[2, 56], ScalarType::Float).is_ok());
    }

    #[test]
    fn the_transform_is_orthonormal_and_its_own_inverse() {
        for n in [1usize, 2, 8, 32, 128] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0).collect();
            let mut y = x.clone();
            walsh_hadamard(&mut y);
            let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
            assert!(
                (norm(&x) - norm(&y)).abs() <= 1e-4 * norm(&x).max(1.0),
                "n {n}"
            );
            walsh_hadamard(&mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= 1e-5, "n {n}: {a} vs {b}");
            }
        }
    }
}
