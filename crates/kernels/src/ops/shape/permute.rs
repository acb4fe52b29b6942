//! Strided rearrangements: `permute_copy`, `transpose_copy`, `t_copy`, `expand_copy`,
//! `repeat` and `as_strided_copy`. Each builds a source layout (sizes and strides, 0 for broadcast
//! dims) and runs the shared gather-copy engine.

use crate::ops::shape::common::{MAX_DIMS, Strided, copy_tensor, require_copy_pair};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, Tensor, normalize_dim};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::permute_copy.out", permute_copy);
    r.register("aten::transpose_copy.int_out", transpose_copy);
    r.register("aten::t_copy.out", t_copy);
    r.register("aten::expand_copy.out", expand_copy);
    r.register("aten::repeat.out", repeat);
    r.register("aten::as_strided_copy.out", as_strided_copy);
}

/// Checks dtypes and layouts, resizes `out` to `sizes` and gathers `input` through
/// `layout` into it.
fn gather_into(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    out: OutArg,
    sizes: &[usize],
    layout: &Strided,
) -> Result<(), KernelError> {
    require_copy_pair(input, &out.tensor())?;
    let o = out.resize(a, sizes)?;
    copy_tensor(ctx, input, &o, 0, layout)
}

/// Out sizes and source strides of `input` with its dims reordered by `perm`.
fn permuted(input: &Tensor, perm: &[usize]) -> Result<([usize; MAX_RANK], Strided), KernelError> {
    let mut sizes = [0usize; MAX_RANK];
    let mut strides = [0usize; MAX_RANK];
    for (i, &p) in perm.iter().enumerate() {
        sizes[i] = input.sizes()[p];
        strides[i] = input.strides()[p];
    }
    let n = perm.len();
    Ok((sizes, Strided::new(&sizes[..n], &strides[..n])?))
}

op_args! {
    /// `permute_copy.out(Tensor self, int[] dims, *, Tensor(a!) out)`.
    struct PermuteArgs<'a> = "aten::permute_copy.out" {
        input: Tensor,
        dims: IntList<'a>,
        out: OutArg,
    } returns 1
}

fn permute_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let PermuteArgs {
        input,
        dims: list,
        out,
    } = PermuteArgs::unpack(a)?;
    let rank = input.rank();
    if list.len() != rank {
        return Err(KernelError::invalid(format!(
            "permute of rank {rank} with {} dims",
            list.len()
        )));
    }
    let mut perm = [0usize; MAX_RANK];
    let mut seen = [false; MAX_RANK];
    for (j, p) in perm.iter_mut().enumerate().take(rank) {
        let d = normalize_dim(list.get(j)?, rank)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(KernelError::invalid(format!("permute: dim {d} repeated")));
        }
        *p = d;
    }
    let (sizes, layout) = permuted(&input, &perm[..rank])?;
    gather_into(ctx, a, &input, out, &sizes[..rank], &layout)
}

op_args! {
    /// `transpose_copy.int_out(Tensor self, int dim0, int dim1, *, Tensor(a!) out)`.
    struct TransposeArgs = "aten::transpose_copy.int_out" {
        input: Tensor,
        dim0: i64,
        dim1: i64,
        out: OutArg,
    } returns 1
}

fn transpose_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let TransposeArgs {
        input,
        dim0,
        dim1,
        out,
    } = TransposeArgs::unpack(a)?;
    let rank = input.rank();
    let d0 = input.normalize_dim(dim0)?;
    let d1 = input.normalize_dim(dim1)?;
    let mut perm = [0usize; MAX_RANK];
    for (i, p) in perm.iter_mut().enumerate().take(rank) {
        *p = i;
    }
    if rank > 0 {
        perm.swap(d0, d1);
    }
    let (sizes, layout) = permuted(&input, &perm[..rank])?;
    gather_into(ctx, a, &input, out, &sizes[..rank], &layout)
}

op_args! {
    /// `t_copy.out(Tensor self, *, Tensor(a!) out)`: transposes a matrix; 0-d and 1-d
    /// tensors are copied.
    struct TArgs = "aten::t_copy.out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

fn t_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let TArgs { input, out } = TArgs::unpack(a)?;
    let perm: &[usize] = match input.rank() {
        0 => &[],
        1 => &[0],
        2 => &[1, 0],
        r => {
            return Err(KernelError::invalid(format!(
                "t() expects a tensor of at most 2 dims, got {r}"
            )));
        }
    };
    let (sizes, layout) = permuted(&input, perm)?;
    gather_into(ctx, a, &input, out, &sizes[..perm.len()], &layout)
}

op_args! {
    /// `expand_copy.out(Tensor self, SymInt[] size, *, bool implicit=False,
    /// Tensor(a!) out)`.
    struct ExpandArgs<'a> = "aten::expand_copy.out" {
        input: Tensor,
        size: IntList<'a>,
        implicit: bool,
        out: OutArg,
    } returns 1
}

fn expand_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ExpandArgs {
        input, size, out, ..
    } = ExpandArgs::unpack(a)?;
    let mut req = [0i64; MAX_RANK];
    let req = size.read_into(&mut req)?;
    let rank = input.rank();
    let n = req.len();
    if n < rank {
        return Err(KernelError::invalid(format!(
            "expand to {n} dims is fewer than the input's {rank}"
        )));
    }
    let lead = n - rank;
    let mut sizes = [0usize; MAX_RANK];
    let mut strides = [0usize; MAX_RANK];
    for (d, &r) in req.iter().enumerate() {
        if d < lead {
            if r < 0 {
                return Err(KernelError::invalid(format!(
                    "expand: size {r} is not allowed for a new leading dim"
                )));
            }
            sizes[d] = r as usize;
            continue;
        }
        let s = input.sizes()[d - lead];
        let want = if r == -1 {
            s
        } else if r < 0 {
            return Err(KernelError::invalid(format!("expand: invalid size {r}")));
        } else {
            r as usize
        };
        if want == s {
            sizes[d] = s;
            strides[d] = if s == 1 { 0 } else { input.strides()[d - lead] };
        } else if s == 1 {
            sizes[d] = want;
        } else {
            return Err(KernelError::invalid(format!(
                "expand: size {want} at dim {d} does not match the input's {s}"
            )));
        }
    }
    let layout = Strided::new(&sizes[..n], &strides[..n])?;
    gather_into(ctx, a, &input, out, &sizes[..n], &layout)
}

op_args! {
    /// `repeat.out(Tensor self, SymInt[] repeats, *, Tensor(a!) out)`.
    struct RepeatArgs<'a> = "aten::repeat.out" {
        input: Tensor,
        repeats: IntList<'a>,
        out: OutArg,
    } returns 1
}

fn repeat(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let RepeatArgs {
        input,
        repeats,
        out,
    } = RepeatArgs::unpack(a)?;
    let mut reps = [0i64; MAX_RANK];
    let reps = repeats.read_into(&mut reps)?;
    let rank = input.rank();
    let n = reps.len();
    if n < rank {
        return Err(KernelError::invalid(format!(
            "repeat with {n} counts for a tensor of rank {rank}"
        )));
    }
    let lead = n - rank;
    // Out dim d is (repeat r_d) x (input size s_d); as a gather it is two dims:
    // [r_d (stride 0), s_d (input stride)].
    let mut sizes = [0usize; MAX_RANK];
    let mut gsizes = [0usize; MAX_DIMS];
    let mut gstrides = [0usize; MAX_DIMS];
    for (d, &r) in reps.iter().enumerate() {
        if r < 0 {
            return Err(KernelError::invalid(format!("repeat: negative count {r}")));
        }
        let (s, st) = if d < lead {
            (1, 0)
        } else {
            (input.sizes()[d - lead], input.strides()[d - lead])
        };
        sizes[d] = (r as usize)
            .checked_mul(s)
            .ok_or_else(|| KernelError::invalid("repeat size overflows"))?;
        gsizes[2 * d] = r as usize;
        gsizes[2 * d + 1] = s;
        gstrides[2 * d + 1] = st;
    }
    let layout = Strided::new(&gsizes[..2 * n], &gstrides[..2 * n])?;
    gather_into(ctx, a, &input, out, &sizes[..n], &layout)
}

op_args! {
    /// `as_strided_copy.out(Tensor self, SymInt[] size, SymInt[] stride,
    /// SymInt? storage_offset=None, *, Tensor(a!) out)`: the elements of `self`'s
    /// (contiguous) data at `storage_offset + sum(i_d * stride_d)`; every one must lie
    /// inside it.
    struct AsStridedArgs<'a> = "aten::as_strided_copy.out" {
        input: Tensor,
        size: IntList<'a>,
        stride: IntList<'a>,
        storage_offset: Option<i64>,
        out: OutArg,
    } returns 1
}

fn as_strided_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let AsStridedArgs {
        input,
        size,
        stride,
        storage_offset,
        out,
    } = AsStridedArgs::unpack(a)?;
    let (mut sbuf, mut tbuf) = ([0i64; MAX_RANK], [0i64; MAX_RANK]);
    let size = size.read_into(&mut sbuf)?;
    let stride = stride.read_into(&mut tbuf)?;
    if size.len() != stride.len() {
        return Err(KernelError::invalid(format!(
            "as_strided: {} sizes and {} strides",
            size.len(),
            stride.len()
        )));
    }
    let n = size.len();
    let mut sizes = [0usize; MAX_RANK];
    let mut strides = [0usize; MAX_RANK];
    for d in 0..n {
        sizes[d] = usize::try_from(size[d])
            .map_err(|_| KernelError::invalid(format!("as_strided: negative size {}", size[d])))?;
        strides[d] = usize::try_from(stride[d]).map_err(|_| {
            KernelError::invalid(format!("as_strided: negative stride {}", stride[d]))
        })?;
    }
    let offset = usize::try_from(storage_offset.unwrap_or(0))
        .map_err(|_| KernelError::invalid("as_strided: negative storage offset"))?;
    let layout = Strided::new(&sizes[..n], &strides[..n])?;
    require_copy_pair(&input, &out.tensor())?;
    let o = out.resize(a, &sizes[..n])?;
    // The copy engine checks that every element read lies inside the input.
    copy_tensor(ctx, &input, &o, offset, &layout)
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ThreadPool;
    use crate::testing::{Harness, ravel, unravel};

    /// Element of `data` (row-major `sizes`) at multi-index `idx`.
    fn at(data: &[f32], sizes: &[usize], idx: &[usize]) -> f32 {
        data[ravel(idx, sizes)]
    }

    /// All multi-indices of `sizes` in row-major order.
    fn indices(sizes: &[usize]) -> Vec<Vec<usize>> {
        let n: usize = sizes.iter().product();
        (0..n).map(|f| unravel(f, sizes)).collect()
    }

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    #[test]
    fn transpose_and_t() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &iota(6));
        let out = h.out(ScalarType::Float, &[3, 2]);
        h.call("aten::t_copy.out", &[x, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![0., 3., 1., 4., 2., 5.]);
        let (d0, d1) = (h.int(-1), h.int(0));
        h.call("aten::transpose_copy.int_out", &[x, d0, d1, out, out])
            .unwrap();
        assert_eq!(h.read::<f32>(out), vec![0., 3., 1., 4., 2., 5.]);
        let v = h.tensor(&[3], &iota(3));
        let ov = h.out(ScalarType::Float, &[3]);
        h.call("aten::t_copy.out", &[v, ov, ov]).unwrap();
        assert_eq!(h.read::<f32>(ov), iota(3));
        let c = h.tensor(&[1, 1, 1], &[0f32]);
        let oc = h.out(ScalarType::Float, &[1, 1, 1]);
        assert!(h.call("aten::t_copy.out", &[c, oc, oc]).is_err());
        let bad = h.int(2);
        assert!(
            h.call("aten::transpose_copy.int_out", &[x, bad, d1, out, out])
                .is_err()
        );
    }

    #[test]
    fn permute_bad_calls() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &iota(6));
        let out = h.out(ScalarType::Float, &[3, 2]);
        for dims in [vec![0i64], vec![0, 0], vec![0, 2], vec![1, 0, 2]] {
            let l = h.int_list(&dims);
            assert!(
                h.call("aten::permute_copy.out", &[x, l, out, out]).is_err(),
                "{dims:?}"
            );
        }
        let l = h.int_list(&[1, 0]);
        let oi = h.out(ScalarType::Int, &[3, 2]);
        assert!(h.call("aten::permute_copy.out", &[x, l, oi, oi]).is_err());
        let o3 = h.out(ScalarType::Float, &[3, 1]);
        assert!(h.call("aten::permute_copy.out", &[x, l, o3, o3]).is_err());
    }

    #[test]
    fn expand_cases() {
        let mut h = Harness::new();
        let x = h.tensor(&[3, 1], &[1f32, 2., 3.]);
        let size = h.int_list(&[2, -1, 2]);
        let f = h.bool(false);
        let out = h.out(ScalarType::Float, &[2, 3, 2]);
        h.call("aten::expand_copy.out", &[x, size, f, out, out])
            .unwrap();
        assert_eq!(
            h.read::<f32>(out),
            vec![1., 1., 2., 2., 3., 3., 1., 1., 2., 2., 3., 3.]
        );
        for bad in [vec![2i64], vec![-1, 3, 2], vec![2, 4, 2], vec![2, -2, 2]] {
            let size = h.int_list(&bad);
            assert!(
                h.call("aten::expand_copy.out", &[x, size, f, out, out])
                    .is_err(),
                "{bad:?}"
            );
        }
        let s = h.tensor(&[], &[4f32]);
        let size = h.int_list(&[2, 2]);
        let o2 = h.out(ScalarType::Float, &[2, 2]);
        h.call("aten::expand_copy.out", &[s, size, f, o2, o2])
            .unwrap();
        assert_eq!(h.read::<f32>(o2), vec![4.; 4]);
    }

    #[test]
    fn repeat_cases() {
        let mut h = Harness::new();
        let x = h.tensor(&[2], &[1f32, 2.]);
        let reps = h.int_list(&[2, 3]);
        let out = h.out(ScalarType::Float, &[2, 6]);
        h.call("aten::repeat.out", &[x, reps, out, out]).unwrap();
        assert_eq!(
            h.read::<f32>(out),
            vec![1., 2., 1., 2., 1., 2., 1., 2., 1., 2., 1., 2.]
        );
        let few = h.int_list(&[]);
        assert!(h.call("aten::repeat.out", &[x, few, out, out]).is_err());
        let neg = h.int_list(&[1, -1]);
        assert!(h.call("aten::repeat.out", &[x, neg, out, out]).is_err());
    }

    #[test]
    fn as_strided_cases_and_errors() {
        let mut h = Harness::new();
        let x = h.tensor(&[3, 4], &iota(12));
        let op = "aten::as_strided_copy.out";
        // Overlapping windows: [[1, 2, 3], [3, 4, 5]] from offset 1.
        let (size, stride, off) = (h.int_list(&[2, 3]), h.int_list(&[2, 1]), h.int(1));
        let out = h.out(ScalarType::Float, &[2, 3]);
        h.call(op, &[x, size, stride, off, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1., 2., 3., 3., 4., 5.]);
        // A transpose, no offset; a broadcast (stride 0).
        let (size, stride, none) = (h.int_list(&[4, 3]), h.int_list(&[1, 4]), h.none());
        let ot = h.out(ScalarType::Float, &[4, 3]);
        h.call(op, &[x, size, stride, none, ot, ot]).unwrap();
        assert_eq!(h.read::<f32>(ot)[..4], [0., 4., 8., 1.]);
        let (size, stride) = (h.int_list(&[2, 3]), h.int_list(&[0, 1]));
        h.call(op, &[x, size, stride, none, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![0., 1., 2., 0., 1., 2.]);
        // Past the end, negative values, mismatched lists.
        for (sz, st, o) in [
            (vec![2i64, 3], vec![4i64, 1], 6i64),
            (vec![2, 3], vec![-1, 1], 0),
            (vec![-2, 3], vec![1, 1], 0),
            (vec![2, 3], vec![1], 0),
            (vec![2, 3], vec![1, 1], -1),
        ] {
            let (size, stride, off) = (h.int_list(&sz), h.int_list(&st), h.int(o));
            assert!(
                h.call(op, &[x, size, stride, off, out, out]).is_err(),
                "{sz:?} {st:?} {o}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn permute_matches_reference(
            sizes in proptest::collection::vec(0usize..5, 0..5),
            seed in any::<u64>(),
            threads in 1usize..3,
        ) {
            let rank = sizes.len();
            let mut perm: Vec<usize> = (0..rank).collect();
            let mut s = seed;
            for i in (1..rank).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                perm.swap(i, (s >> 33) as usize % (i + 1));
            }
            let n: usize = sizes.iter().product();
            let data = iota(n);
            let out_sizes: Vec<usize> = perm.iter().map(|&p| sizes[p]).collect();
            let want: Vec<f32> = indices(&out_sizes)
                .iter()
                .map(|oi| {
                    let mut ii = vec![0; rank];
                    for (k, &p) in perm.iter().enumerate() { ii[p] = oi[k]; }
                    at(&data, &sizes, &ii)
                })
                .collect();
            let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
            let x = h.tensor(&sizes, &data);
            let dims = h.int_list(&perm.iter().map(|&p| p as i64).collect::<Vec<_>>());
            let out = h.out(ScalarType::Float, &out_sizes);
            h.call("aten::permute_copy.out", &[x, dims, out, out]).unwrap();
            prop_assert_eq!(h.read::<f32>(out), want);
        }

        #[test]
        fn expand_and_repeat_match_reference(
            sizes in proptest::collection::vec(1usize..3, 0..4),
            targets in proptest::collection::vec(0usize..4, 0..5),
            lead in 0usize..2,
        ) {
            let rank = sizes.len();
            let n: usize = sizes.iter().product();
            let data = iota(n);
            // expand: broadcast size-1 dims to targets, keep others via -1.
            let mut req: Vec<i64> = (0..lead).map(|i| targets.get(i).copied().unwrap_or(2) as i64).collect();
            let mut out_sizes: Vec<usize> = req.iter().map(|&v| v as usize).collect();
            for (d, &s) in sizes.iter().enumerate() {
                if s == 1 {
                    let t = targets.get(d + lead).copied().unwrap_or(1);
                    req.push(t as i64);
                    out_sizes.push(t);
                } else {
                    req.push(-1);
                    out_sizes.push(s);
                }
            }
            let want: Vec<f32> = indices(&out_sizes)
                .iter()
                .map(|oi| {
                    let ii: Vec<usize> = (0..rank).map(|d| if sizes[d] == 1 { 0 } else { oi[d + lead] }).collect();
                    at(&data, &sizes, &ii)
                })
                .collect();
            let mut h = Harness::new();
            let x = h.tensor(&sizes, &data);
            let size = h.int_list(&req);
            let f = h.bool(false);
            let out = h.out(ScalarType::Float, &out_sizes);
            h.call("aten::expand_copy.out", &[x, size, f, out, out]).unwrap();
            prop_assert_eq!(h.read::<f32>(out), want);

            // repeat with counts from targets.
            let reps: Vec<usize> = (0..rank + lead).map(|i| targets.get(i).copied().unwrap_or(1)).collect();
            let mut padded = vec![1usize; lead];
            padded.extend_from_slice(&sizes);
            let rsizes: Vec<usize> = padded.iter().zip(&reps).map(|(s, r)| s * r).collect();
            let want: Vec<f32> = indices(&rsizes)
                .iter()
                .map(|oi| {
                    let ii: Vec<usize> = (0..rank).map(|d| oi[d + lead] % sizes[d]).collect();
                    at(&data, &sizes, &ii)
                })
                .collect();
            let rl = h.int_list(&reps.iter().map(|&r| r as i64).collect::<Vec<_>>());
            let ro = h.out(ScalarType::Float, &rsizes);
            h.call("aten::repeat.out", &[x, rl, ro, ro]).unwrap();
            prop_assert_eq!(h.read::<f32>(ro), want);
        }
    }
}
