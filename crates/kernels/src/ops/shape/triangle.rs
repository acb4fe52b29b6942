//! `tril.out`: the lower triangle of each matrix of a batch (the last two dims), every
//! other element zero. `diagonal` shifts the boundary: 0 keeps the main diagonal and
//! what is below it, `k > 0` also `k` diagonals above, `k < 0` drops `-k` below.

use etch_base::ScalarType;

use crate::ops::shape::common::{require_copy_pair, with_bits_type};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Registry, Tensor};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::tril.out", tril);
}

op_args! {
    /// `tril.out(Tensor self, int diagonal=0, *, Tensor(a!) out)`.
    struct TrilArgs = "aten::tril.out" {
        input: Tensor,
        diagonal: i64,
        out: OutArg,
    } returns 1
}

/// The dtypes upstream's `tril` accepts: real (with half and bfloat16) and bool.
fn tril_dtype(t: ScalarType) -> bool {
    use ScalarType::*;
    t.is_floating_point() || matches!(t, Byte | Char | Short | Int | Long | Bool)
}

fn tril(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let TrilArgs {
        input,
        diagonal,
        out,
    } = TrilArgs::unpack(a)?;
    let rank = input.rank();
    if rank < 2 {
        return Err(KernelError::invalid(format!(
            "tril needs at least 2 dims, got a tensor of rank {rank}"
        )));
    }
    if !tril_dtype(input.dtype()) {
        return Err(KernelError::invalid(format!(
            "tril does not support dtype {}",
            input.dtype()
        )));
    }
    require_copy_pair(&input, &out.tensor())?;
    let out = out.resize(a, input.sizes())?;
    require_copy_pair(&input, &out)?;
    let numel = input.numel();
    if numel == 0 {
        return Ok(());
    }
    let rows = input.sizes()[rank - 2];
    let cols = input.sizes()[rank - 1];
    with_bits_type!(input.dtype().element_size(), T => {
        let x = ctx.read_raw::<T>(&input)?;
        let o = ctx.write_raw::<T>(&out)?;
        if x.len() < numel || o.len() < numel {
            return Err(KernelError::invalid("tril: tensor storage is too small"));
        }
        let zero = <T as bytemuck::Zeroable>::zeroed();
        let rows_of = x[..numel].chunks_exact(cols).zip(o[..numel].chunks_exact_mut(cols));
        for (r, (src, dst)) in rows_of.enumerate() {
            let keep = kept_columns(r % rows, diagonal, cols);
            dst[..keep].copy_from_slice(&src[..keep]);
            dst[keep..].fill(zero);
        }
        Ok(())
    })
}

/// How many leading columns of row `row` lie on or below diagonal `diagonal`:
/// those `j` with `j <= row + diagonal`, at most `cols`.
fn kept_columns(row: usize, diagonal: i64, cols: usize) -> usize {
    let last = (row as i64).saturating_add(diagonal);
    if last < 0 {
        0
    } else {
        usize::try_from(last).map_or(cols, |l| l.saturating_add(1).min(cols))
    }
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;

    use crate::testing::Harness;

    /// `tril` of a row-major batch of `rows x cols` matrices, computed element by
    /// element.
    fn reference(data: &[f32], rows: usize, cols: usize, diagonal: i64) -> Vec<f32> {
        data.iter()
            .enumerate()
            .map(|(i, &v)| {
                let (r, c) = ((i / cols) % rows, i % cols);
                if (c as i64) - (r as i64) <= diagonal {
                    v
                } else {
                    0.0
                }
            })
            .collect()
    }

    #[test]
    fn tril_matches_the_elementwise_rule() {
        for sizes in [
            vec![3usize, 4],
            vec![2, 4, 3],
            vec![2, 1, 5, 5],
            vec![1, 0, 3],
        ] {
            let n: usize = sizes.iter().product();
            let data: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
            let (rows, cols) = (sizes[sizes.len() - 2], sizes[sizes.len() - 1]);
            for diagonal in [-7i64, -2, -1, 0, 1, 2, 9, i64::MIN, i64::MAX] {
                let mut h = Harness::new();
                let x = h.tensor(&sizes, &data);
                let d = h.int(diagonal);
                let out = h.out(ScalarType::Float, &sizes);
                h.call("aten::tril.out", &[x, d, out, out]).unwrap();
                assert_eq!(
                    h.read::<f32>(out),
                    reference(&data, rows, cols, diagonal),
                    "{sizes:?} {diagonal}"
                );
            }
        }
    }

    #[test]
    fn tril_of_bool_and_int_and_its_errors() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 2], &[5i64, 6, 7, 8]);
        let d = h.int(0);
        let out = h.out(ScalarType::Long, &[2, 2]);
        h.call("aten::tril.out", &[x, d, out, out]).unwrap();
        assert_eq!(h.read::<i64>(out), [5, 0, 7, 8]);
        let b = h.tensor_raw(ScalarType::Bool, &[2, 2], &[1, 1, 1, 1]);
        let bout = h.out(ScalarType::Bool, &[2, 2]);
        let up = h.int(-1);
        h.call("aten::tril.out", &[b, up, bout, bout]).unwrap();
        assert_eq!(h.read_bytes(bout), [0, 0, 1, 0]);
        // Rank 1, a dtype mismatch and a wrong-shaped out are refused.
        let v = h.tensor(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let vout = h.out(ScalarType::Float, &[4]);
        assert!(h.call("aten::tril.out", &[v, d, vout, vout]).is_err());
        let wrong = h.out(ScalarType::Int, &[2, 2]);
        assert!(h.call("aten::tril.out", &[x, d, wrong, wrong]).is_err());
        let f = h.tensor(&[2, 2], &[1.0; 4]);
        let small = h.out(ScalarType::Float, &[1, 2]);
        assert!(h.call("aten::tril.out", &[f, d, small, small]).is_err());
    }
}
