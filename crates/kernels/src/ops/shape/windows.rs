//! Copies of two more strided views: `diagonal_copy` (a diagonal of every matrix
//! spanned by two dims) and `unfold_copy` (every window of `size` elements taken
//! `step` apart along one dim). Each is a source layout for the gather-copy engine.

use crate::ops::shape::common::{
    Strided, copy_tensor, copy_tensor_cast, require_contiguous, require_copy_pair,
};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::diagonal_copy.out", diagonal_copy);
    r.register("aten::unfold_copy.out", unfold_copy);
}

op_args! {
    /// `diagonal_copy.out(Tensor self, int offset=0, int dim1=0, int dim2=1, *,
    /// Tensor(a!) out)`: the input without `dim1` and `dim2`, then the diagonal
    /// `offset` of the matrices they span as the last dim (above the main diagonal
    /// when positive).
    struct DiagonalArgs = "aten::diagonal_copy.out" {
        input: Tensor,
        offset: i64,
        dim1: i64,
        dim2: i64,
        out: OutArg,
    } returns 1
}

/// As upstream: rank >= 2, two distinct dims (negative counts from the end), the out
/// tensor of the input's dtype. An offset past the matrix gives an empty diagonal.
fn diagonal_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let DiagonalArgs {
        input,
        offset,
        dim1,
        dim2,
        out,
    } = DiagonalArgs::unpack(a)?;
    let rank = input.rank();
    if rank < 2 {
        return Err(KernelError::invalid(format!(
            "diagonal_copy needs a tensor of rank >= 2, got rank {rank}"
        )));
    }
    let (d1, d2) = (input.normalize_dim(dim1)?, input.normalize_dim(dim2)?);
    if d1 == d2 {
        return Err(KernelError::invalid(format!(
            "diagonal_copy: dim1 ({dim1}) and dim2 ({dim2}) name the same dim"
        )));
    }
    let (rows, cols) = (input.sizes()[d1] as i128, input.sizes()[d2] as i128);
    let off = offset as i128;
    // Rows start at max(-offset, 0), columns at max(offset, 0).
    let (row0, col0) = (off.min(0).unsigned_abs(), off.max(0) as u128);
    let len = (rows - row0 as i128).min(cols - col0 as i128).max(0) as usize;
    let mut sizes = [0usize; MAX_RANK];
    let mut strides = [0usize; MAX_RANK];
    let mut n = 0;
    for d in (0..rank).filter(|&d| d != d1 && d != d2) {
        sizes[n] = input.sizes()[d];
        strides[n] = input.strides()[d];
        n += 1;
    }
    let (s1, s2) = (input.strides()[d1], input.strides()[d2]);
    sizes[n] = len;
    strides[n] = s1 + s2;
    let start = if len == 0 {
        0
    } else {
        // Both fit: the diagonal's first element is inside the input.
        row0 as usize * s1 + col0 as usize * s2
    };
    let sizes = &sizes[..=n];
    let layout = Strided::new(sizes, &strides[..=n])?;
    require_copy_pair(&input, &out.tensor())?;
    let o = out.resize(a, sizes)?;
    copy_tensor(ctx, &input, &o, start, &layout)
}

op_args! {
    /// `unfold_copy.out(Tensor self, int dimension, int size, int step, *, Tensor(a!)
    /// out)`: dim `dimension` becomes the count of windows, `(n - size) / step + 1`, and
    /// a new last dim of `size` holds each window's elements.
    struct UnfoldArgs = "aten::unfold_copy.out" {
        input: Tensor,
        dimension: i64,
        size: i64,
        step: i64,
        out: OutArg,
    } returns 1
}

/// As upstream: `0 <= size <= ` the dim's size, `step > 0`, and the values cast to
/// the out tensor's dtype. A 0-d input is refused (upstream reads a size it does not
/// have).
fn unfold_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let UnfoldArgs {
        input,
        dimension,
        size,
        step,
        out,
    } = UnfoldArgs::unpack(a)?;
    let rank = input.rank();
    if rank == 0 || rank >= MAX_RANK {
        return Err(KernelError::invalid(format!(
            "unfold_copy of a tensor of rank {rank} (1 to {} supported)",
            MAX_RANK - 1
        )));
    }
    let dim = input.normalize_dim(dimension)?;
    let n = input.sizes()[dim];
    if size < 0 || size as u64 > n as u64 {
        return Err(KernelError::invalid(format!(
            "unfold_copy: size {size} is outside 0..={n}, the size of dim {dim}"
        )));
    }
    if step <= 0 {
        return Err(KernelError::invalid(format!(
            "unfold_copy: step is {step} but must be > 0"
        )));
    }
    let (size, step) = (size as usize, usize::try_from(step).unwrap_or(usize::MAX));
    let windows = (n - size) / step + 1;
    let mut sizes = [0usize; MAX_RANK];
    let mut strides = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(input.sizes());
    strides[..rank].copy_from_slice(input.strides());
    let stride = input.strides()[dim];
    sizes[dim] = windows;
    strides[dim] = if windows > 1 {
        stride
            .checked_mul(step)
            .ok_or_else(|| KernelError::invalid(format!("unfold_copy: step {step} overflows")))?
    } else {
        0
    };
    sizes[rank] = size;
    strides[rank] = stride;
    let sizes = &sizes[..=rank];
    let layout = Strided::new(sizes, &strides[..=rank])?;
    require_contiguous(&input, "input")?;
    require_contiguous(&out.tensor(), "out")?;
    let o = out.resize(a, sizes)?;
    copy_tensor_cast(ctx, &input, &o, 0, &layout, "unfold_copy")
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::testing::{Harness, ravel, unravel};

    /// `diagonal` element by element: out[rest.., k] = in[.., row0 + k at d1, col0 + k
    /// at d2, ..].
    fn diagonal_ref(
        data: &[f32],
        sizes: &[usize],
        offset: i64,
        d1: usize,
        d2: usize,
    ) -> (Vec<usize>, Vec<f32>) {
        let (row0, col0) = ((-offset).max(0) as usize, offset.max(0) as usize);
        let len = (sizes[d1] as i64 - row0 as i64)
            .min(sizes[d2] as i64 - col0 as i64)
            .max(0) as usize;
        let mut out_sizes: Vec<usize> = (0..sizes.len())
            .filter(|&d| d != d1 && d != d2)
            .map(|d| sizes[d])
            .collect();
        out_sizes.push(len);
        let numel: usize = out_sizes.iter().product();
        let vals = (0..numel)
            .map(|f| {
                let o = unravel(f, &out_sizes);
                let k = o[o.len() - 1];
                let mut rest = o[..o.len() - 1].iter();
                let idx: Vec<usize> = (0..sizes.len())
                    .map(|d| {
                        if d == d1 {
                            row0 + k
                        } else if d == d2 {
                            col0 + k
                        } else {
                            *rest.next().unwrap()
                        }
                    })
                    .collect();
                data[ravel(&idx, sizes)]
            })
            .collect();
        (out_sizes, vals)
    }

    fn run_diagonal(sizes: &[usize], offset: i64, dim1: i64, dim2: i64) {
        let rank = sizes.len();
        let n: usize = sizes.iter().product();
        let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let (d1, d2) = (
            dim1.rem_euclid(rank as i64) as usize,
            dim2.rem_euclid(rank as i64) as usize,
        );
        let (want_sizes, want) = diagonal_ref(&data, sizes, offset, d1, d2);
        let mut h = Harness::new();
        let x = h.tensor(sizes, &data);
        let (o, a, b) = (h.int(offset), h.int(dim1), h.int(dim2));
        let bound: Vec<usize> = want_sizes.iter().map(|&s| s.max(4)).collect();
        let out = h.out(ScalarType::Float, &bound);
        h.call("aten::diagonal_copy.out", &[x, o, a, b, out, out])
            .unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), want_sizes.as_slice());
        assert_eq!(h.read::<f32>(out), want, "{sizes:?} {offset} {dim1} {dim2}");
    }

    #[test]
    fn diagonal_copy_matches_the_elementwise_rule() {
        run_diagonal(&[3, 4], 0, 0, 1);
        run_diagonal(&[3, 4], 2, 0, 1);
        run_diagonal(&[3, 4], -1, 0, 1);
        run_diagonal(&[3, 4], 5, 0, 1);
        run_diagonal(&[3, 4], -3, 1, 0);
        run_diagonal(&[2, 3, 4], 1, -1, 0);
        run_diagonal(&[2, 3, 4, 2], -1, 2, 1);
    }

    #[test]
    fn diagonal_copy_refuses_bad_arguments() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 2], &[1.0f32, 2.0, 3.0, 4.0]);
        let v = h.tensor(&[2], &[1.0f32, 2.0]);
        let (zero, one, two, mone) = (h.int(0), h.int(1), h.int(2), h.int(-2));
        let out = h.out(ScalarType::Float, &[2]);
        let op = "aten::diagonal_copy.out";
        // The same dim twice (-2 is 0), a dim out of range, rank 1, another dtype.
        assert!(h.call(op, &[x, zero, zero, mone, out, out]).is_err());
        assert!(h.call(op, &[x, zero, zero, two, out, out]).is_err());
        assert!(h.call(op, &[v, zero, zero, one, out, out]).is_err());
        let iout = h.out(ScalarType::Int, &[2]);
        assert!(h.call(op, &[x, zero, zero, one, iout, iout]).is_err());
        h.call(op, &[x, zero, zero, one, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1.0, 4.0]);
    }

    /// `unfold` element by element: out[.., w at dim, .., j] = in[.., w * step + j, ..].
    fn unfold_ref(
        data: &[i32],
        sizes: &[usize],
        dim: usize,
        size: usize,
        step: usize,
    ) -> (Vec<usize>, Vec<i32>) {
        let mut out_sizes = sizes.to_vec();
        out_sizes[dim] = (sizes[dim] - size) / step + 1;
        out_sizes.push(size);
        let numel: usize = out_sizes.iter().product();
        let vals = (0..numel)
            .map(|f| {
                let o = unravel(f, &out_sizes);
                let mut idx = o[..sizes.len()].to_vec();
                idx[dim] = o[dim] * step + o[sizes.len()];
                data[ravel(&idx, sizes)]
            })
            .collect();
        (out_sizes, vals)
    }

    proptest! {
        #[test]
        fn unfold_copy_matches_the_elementwise_rule(
            sizes in prop::collection::vec(1usize..5, 1..4),
            dim_seed in 0usize..8,
            size_seed in 0usize..8,
            step in 1usize..4,
        ) {
            let dim = dim_seed % sizes.len();
            let size = size_seed % (sizes[dim] + 1);
            let n: usize = sizes.iter().product();
            let data: Vec<i32> = (0..n as i32).map(|i| i * 7 - 20).collect();
            let (want_sizes, want) = unfold_ref(&data, &sizes, dim, size, step);
            let mut h = Harness::new();
            let x = h.tensor(&sizes, &data);
            let (d, s, st) = (h.int(dim as i64 - sizes.len() as i64), h.int(size as i64), h.int(step as i64));
            let out = h.out(ScalarType::Int, &want_sizes);
            h.call("aten::unfold_copy.out", &[x, d, s, st, out, out]).unwrap();
            prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), want_sizes.clone());
            prop_assert_eq!(h.read::<i32>(out), want);
        }
    }

    #[test]
    fn unfold_copy_casts_and_refuses_bad_arguments() {
        let mut h = Harness::new();
        let x = h.tensor(&[5], &[0.5f32, 1.5, 2.5, 3.5, 4.5]);
        let (zero, two, three, six, mone) = (h.int(0), h.int(2), h.int(3), h.int(6), h.int(-1));
        let out = h.out(ScalarType::Long, &[2, 2]);
        let op = "aten::unfold_copy.out";
        h.call(op, &[x, zero, two, three, out, out]).unwrap();
        assert_eq!(h.read::<i64>(out), vec![0, 1, 3, 4]);
        // size past the dim, a negative size, step 0, a 0-d input.
        assert!(h.call(op, &[x, zero, six, two, out, out]).is_err());
        assert!(h.call(op, &[x, zero, mone, two, out, out]).is_err());
        assert!(h.call(op, &[x, zero, two, zero, out, out]).is_err());
        let s = h.tensor(&[], &[1.0f32]);
        let o1 = h.out(ScalarType::Float, &[1]);
        assert!(h.call(op, &[s, zero, zero, two, o1, o1]).is_err());
    }
}
