//! Joining and splitting along a dim: `cat`, `stack`, `split_copy`, `unbind_copy`,
//! `split_with_sizes_copy`.
//!
//! `cat` and `stack` view every input as `[leading, piece]` and the output as
//! `[leading, Σ piece]`; each input fills its column band of every output row. The
//! rows go to the pool under upstream's rule (at least 8 rows and
//! [`crate::GRAIN_SIZE`] elements). Inputs of another dtype are cast when PyTorch's
//! `canCast` allows it.

use crate::ops::same_dtype;
use crate::ops::shape::common::{
    Strided, can_cast, copy_tensor_cast, dim_of_non_scalar, for_rows, require_contiguous,
    typed_mut, with_bits_type, with_cast_type, worth_parallel,
};
use crate::ops::shape::slice::{DimSlice, copy_slice, with_dim_length};
use crate::schema::{OpArgs, OutArg, OutListArg, op_args};
use crate::{
    Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, Tensor, TensorList,
    normalize_dim,
};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::cat.out", cat);
    r.register("aten::stack.out", stack);
    r.register("aten::split_with_sizes_copy.out", split_with_sizes_copy);
    r.register("aten::split_copy.Tensor_out", split_copy);
    r.register("aten::unbind_copy.int_out", unbind_copy);
}

/// True for the legacy empty `[0]` tensors `cat` skips.
fn skipped(t: &Tensor) -> bool {
    t.sizes() == [0]
}

/// Copies every input's `[leading, piece_k]` block into its band of `out`
/// (`[leading, row]`), where `piece_k = numel_k / leading`.
fn join_rows(
    ctx: &KernelContext<'_>,
    list: &TensorList<'_>,
    out: &Tensor,
    leading: usize,
    row: usize,
    skip_empty: bool,
) -> Result<(), KernelError> {
    let total = leading * row;
    if out.numel() != total {
        return Err(KernelError::invalid(format!(
            "join of {total} elements into an out tensor of {}",
            out.numel()
        )));
    }
    if total == 0 {
        return Ok(());
    }
    let parallel = worth_parallel(leading, total);
    // One exclusive borrow of the out bytes, viewed per input at its element type.
    let out_bytes = ctx.write_bytes(out)?;
    let mut offset = 0usize;
    for k in 0..list.len() {
        let t = list.get(k)?;
        if skip_empty && skipped(&t) {
            continue;
        }
        require_contiguous(&t, "input")?;
        let piece = t.numel() / leading;
        if piece * leading != t.numel() || offset + piece > row {
            return Err(KernelError::invalid("join input does not fit its band"));
        }
        if piece == 0 {
            continue;
        }
        if t.dtype() == out.dtype() {
            with_bits_type!(t.dtype().element_size(), T => {
                let src = ctx.read_raw::<T>(&t)?;
                let dst = typed_mut::<T>(&mut *out_bytes)?;
                for_rows(ctx.pool(), dst, row, leading, 8, parallel, |first, chunk| {
                    if piece == 1 {
                        // One element per row (RoPE re-interleave): no per-row memcpy.
                        for (r, v) in chunk.chunks_exact_mut(row).zip(&src[first..]) {
                            r[offset] = *v;
                        }
                        return;
                    }
                    for (i, r) in chunk.chunks_exact_mut(row).enumerate() {
                        let s = (first + i) * piece;
                        r[offset..offset + piece].copy_from_slice(&src[s..s + piece]);
                    }
                });
                Ok::<(), KernelError>(())
            })?;
        } else {
            if !can_cast(t.dtype(), out.dtype()) {
                return Err(KernelError::invalid(format!(
                    "cannot cast input of dtype {} to out dtype {}",
                    t.dtype(),
                    out.dtype()
                )));
            }
            with_cast_type!(t.dtype(), "cat input", S => {
                with_cast_type!(out.dtype(), "cat out", D => {
                    let src = ctx.read_raw::<S>(&t)?;
                    let dst = typed_mut::<D>(&mut *out_bytes)?;
                    for_rows(ctx.pool(), dst, row, leading, 8, parallel, |first, chunk| {
                        for (i, r) in chunk.chunks_exact_mut(row).enumerate() {
                            let s = (first + i) * piece;
                            etch_base::cast_slice(&src[s..s + piece], &mut r[offset..offset + piece]);
                        }
                    });
                    Ok::<(), KernelError>(())
                })
            })?;
        }
        offset += piece;
    }
    if offset != row {
        return Err(KernelError::invalid(
            "join inputs do not fill the out tensor",
        ));
    }
    Ok(())
}

op_args! {
    /// `op.out(Tensor[] tensors, int dim=0, *, Tensor(a!) out)` (`cat`, `stack`).
    struct JoinArgs<'a> = "aten::<cat|stack>.out" {
        tensors: TensorList<'a>,
        dim: i64,
        out: OutArg,
    } returns 1
}

/// `cat.out(Tensor[] tensors, int dim=0, *, Tensor(a!) out)`.
fn cat(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    join(ctx, a, true, cat_shape)
}

/// `stack.out(Tensor[] tensors, int dim=0, *, Tensor(a!) out)`.
fn stack(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    join(ctx, a, false, |list, dim| stack_shape(list, dim).map(Some))
}

/// The shape of a `cat` or `stack` result and the dim its inputs are joined along.
struct JoinedShape {
    /// The result's sizes; the first `rank` are used.
    sizes: [usize; MAX_RANK],
    /// The result's rank.
    rank: usize,
    /// The dim the inputs are joined along, normalized.
    dim: usize,
}

/// The body `cat` and `stack` share: reads the arguments, works out the result's
/// shape with `shape_of` (given the inputs and the dim argument), resizes `out` to it
/// and fills it with [`join_rows`]; `skip_empty` skips the legacy empty `[0]` inputs.
/// `shape_of` gives `None` when every input is a legacy empty tensor (only `cat`
/// allows them): the result is then the empty `[0]`, which needs a 1-d `out`.
fn join(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    skip_empty: bool,
    shape_of: impl FnOnce(&TensorList<'_>, i64) -> Result<Option<JoinedShape>, KernelError>,
) -> Result<(), KernelError> {
    let JoinArgs {
        tensors: list,
        dim,
        out,
    } = JoinArgs::unpack(a)?;
    let Some(JoinedShape { sizes, rank, dim }) = shape_of(&list, dim)? else {
        if out.tensor().rank() != 1 {
            return Err(KernelError::invalid(
                "cat of empty tensors into a non-1-d out",
            ));
        }
        out.resize(a, &[0])?;
        return Ok(());
    };
    require_contiguous(&out.tensor(), "out")?;
    // Stored once the input list (borrowed from `a`) is no longer read.
    let resized = out.resized(&sizes[..rank])?;
    let leading: usize = sizes[..dim].iter().product();
    let row: usize = sizes[dim..rank].iter().product();
    join_rows(ctx, &list, &resized, leading, row, skip_empty)?;
    out.set(a, resized)
}

/// The shape of `cat(list, dim_arg)`: the inputs' common shape with the sizes of the
/// joined dim summed, legacy empty `[0]` inputs left out (`None` when all are).
fn cat_shape(list: &TensorList<'_>, dim_arg: i64) -> Result<Option<JoinedShape>, KernelError> {
    if list.is_empty() {
        return Err(KernelError::invalid("cat of an empty list"));
    }
    // The reference shape: the first input that is not a legacy empty tensor.
    let mut reference = None;
    for k in 0..list.len() {
        let t = list.get(k)?;
        if !skipped(&t) {
            reference = Some(t);
            break;
        }
    }
    let Some(reference) = reference else {
        return Ok(None);
    };
    let rank = reference.rank();
    if rank == 0 {
        return Err(KernelError::invalid("cat of 0-d tensors"));
    }
    let dim = normalize_dim(dim_arg, rank)?;
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(reference.sizes());
    sizes[dim] = 0;
    for k in 0..list.len() {
        let t = list.get(k)?;
        if skipped(&t) {
            continue;
        }
        if t.rank() != rank {
            return Err(KernelError::invalid(format!(
                "cat input {k} has rank {}, expected {rank}",
                t.rank()
            )));
        }
        for d in 0..rank {
            if d != dim && t.sizes()[d] != reference.sizes()[d] {
                return Err(KernelError::invalid(format!(
                    "cat input {k} has sizes {:?}, incompatible with {:?} at dim {dim}",
                    t.sizes(),
                    reference.sizes()
                )));
            }
        }
        sizes[dim] += t.sizes()[dim];
    }
    Ok(Some(JoinedShape { sizes, rank, dim }))
}

/// The shape of `stack(list, dim_arg)`: the inputs' one shape with a new dim of
/// `list.len()` inserted at `dim_arg` (which counts the new dim).
fn stack_shape(list: &TensorList<'_>, dim_arg: i64) -> Result<JoinedShape, KernelError> {
    if list.is_empty() {
        return Err(KernelError::invalid("stack of an empty list"));
    }
    let first = list.get(0)?;
    let rank = first.rank();
    if rank + 1 > MAX_RANK {
        return Err(KernelError::invalid("stack beyond the rank limit"));
    }
    let dim = normalize_dim(dim_arg, rank + 1)?;
    for k in 1..list.len() {
        let t = list.get(k)?;
        if t.sizes() != first.sizes() {
            return Err(KernelError::invalid(format!(
                "stack input {k} has sizes {:?}, expected {:?}",
                t.sizes(),
                first.sizes()
            )));
        }
    }
    let mut sizes = [0usize; MAX_RANK];
    sizes[..dim].copy_from_slice(&first.sizes()[..dim]);
    sizes[dim] = list.len();
    sizes[dim + 1..=rank].copy_from_slice(&first.sizes()[dim..]);
    Ok(JoinedShape {
        sizes,
        rank: rank + 1,
        dim,
    })
}

/// Splits `input` along `dim` into the tensors of `outs`, output `j` taking
/// `size_of(j)` indices.
fn split_into(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    dim: usize,
    outs: OutListArg,
    count: usize,
    size_of: impl Fn(usize) -> Result<usize, KernelError>,
) -> Result<(), KernelError> {
    let n = outs.len();
    if n != count {
        return Err(KernelError::invalid(format!(
            "split into {count} pieces but {n} out tensors"
        )));
    }
    let mut start = 0usize;
    for j in 0..count {
        let len = size_of(j)?;
        let sizes = with_dim_length(input.sizes(), dim, len);
        let o = outs.item(a, j)?;
        same_dtype(input, &o)?;
        let o = outs.resize_item(a, j, &sizes[..input.rank()])?;
        let s = DimSlice::contiguous(dim, start, len);
        if len > 0 {
            copy_slice(ctx, input, &o, s)?;
        }
        start += len;
    }
    Ok(())
}

op_args! {
    /// `split_with_sizes_copy.out(Tensor self, SymInt[] split_sizes, int dim=0, *,
    /// Tensor(a!)[] out) -> ()`, emitted with or without a trailing copy of `out`.
    struct SplitWithSizesArgs<'a> = "aten::split_with_sizes_copy.out" {
        input: Tensor,
        split_sizes: IntList<'a>,
        dim: i64,
        out: OutListArg,
    } returns 0..=1
}

fn split_with_sizes_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SplitWithSizesArgs {
        input,
        split_sizes: list,
        dim,
        out,
    } = SplitWithSizesArgs::unpack(a)?;
    let dim = dim_of_non_scalar(&input, dim, "split of a 0-d tensor")?;
    let mut splits = [0i64; 256];
    if list.len() > splits.len() {
        return Err(KernelError::invalid("too many split sizes"));
    }
    let splits = list.read_into(&mut splits)?;
    let mut sum = 0i64;
    for &s in splits {
        if s < 0 {
            return Err(KernelError::invalid(format!("negative split size {s}")));
        }
        sum = sum.saturating_add(s);
    }
    if sum != input.sizes()[dim] as i64 {
        return Err(KernelError::invalid(format!(
            "split sizes sum to {sum}, but dim {dim} has size {}",
            input.sizes()[dim]
        )));
    }
    let mut buf = [0usize; 256];
    for (b, &s) in buf.iter_mut().zip(splits) {
        *b = s as usize;
    }
    let count = splits.len();
    split_into(ctx, a, &input, dim, out, count, |j| Ok(buf[j]))
}

op_args! {
    /// `split_copy.Tensor_out(Tensor self, SymInt split_size, int dim=0, *,
    /// Tensor(a!)[] out) -> ()`, emitted with or without a trailing copy of `out`.
    struct SplitArgs = "aten::split_copy.Tensor_out" {
        input: Tensor,
        split_size: i64,
        dim: i64,
        out: OutListArg,
    } returns 0..=1
}

fn split_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SplitArgs {
        input,
        split_size: split,
        dim,
        out,
    } = SplitArgs::unpack(a)?;
    let dim = dim_of_non_scalar(&input, dim, "split of a 0-d tensor")?;
    let size = input.sizes()[dim];
    if split < 0 || (split == 0 && size != 0) {
        return Err(KernelError::invalid(format!("invalid split size {split}")));
    }
    let split = split as usize;
    let count = if size == 0 { 1 } else { size.div_ceil(split) };
    split_into(ctx, a, &input, dim, out, count, |j| {
        Ok(split.min(size - (j * split).min(size)))
    })
}

op_args! {
    /// `unbind_copy.int_out(Tensor self, int dim=0, *, Tensor(a!)[] out) -> ()`,
    /// emitted with or without a trailing copy of `out`: out `j` is index `j` of `dim`,
    /// cast to the outs' dtype.
    struct UnbindArgs = "aten::unbind_copy.int_out" {
        input: Tensor,
        dim: i64,
        out: OutListArg,
    } returns 0..=1
}

/// As upstream, every out must already have the input's shape without `dim` (no
/// resize), and all outs one dtype, which may differ from the input's.
fn unbind_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let UnbindArgs { input, dim, out } = UnbindArgs::unpack(a)?;
    let dim = dim_of_non_scalar(&input, dim, "unbind_copy of a 0-d tensor")?;
    let size = input.sizes()[dim];
    if out.len() != size {
        return Err(KernelError::invalid(format!(
            "unbind_copy along a dim of size {size} into {} out tensors",
            out.len()
        )));
    }
    require_contiguous(&input, "input")?;
    let rank = input.rank();
    let mut sizes = [0usize; MAX_RANK];
    let mut strides = [0usize; MAX_RANK];
    for (k, d) in (0..rank).filter(|&d| d != dim).enumerate() {
        sizes[k] = input.sizes()[d];
        strides[k] = input.strides()[d];
    }
    let (sizes, strides) = (&sizes[..rank - 1], &strides[..rank - 1]);
    let stride = input.strides()[dim];
    let layout = Strided::new(sizes, strides)?;
    let mut dtype = None;
    for j in 0..size {
        let o = out.item(a, j)?;
        if *dtype.get_or_insert(o.dtype()) != o.dtype() {
            return Err(KernelError::invalid(format!(
                "unbind_copy: out {j} is {} but out 0 is {}",
                o.dtype(),
                dtype.map_or("?", |t| t.name())
            )));
        }
        if o.sizes() != sizes {
            return Err(KernelError::invalid(format!(
                "unbind_copy: out {j} has shape {:?}, expected {sizes:?}",
                o.sizes()
            )));
        }
        require_contiguous(&o, "out")?;
        if input.numel() > 0 {
            copy_tensor_cast(ctx, &input, &o, j * stride, &layout, "unbind_copy")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::testing::Harness;
    use crate::{KernelError, ThreadPool};

    fn cat_ref(inputs: &[(Vec<usize>, Vec<f32>)], dim: usize) -> (Vec<usize>, Vec<f32>) {
        let rank = inputs[0].0.len();
        let mut sizes = inputs[0].0.clone();
        sizes[dim] = inputs.iter().map(|(s, _)| s[dim]).sum();
        let lead: usize = sizes[..dim].iter().product();
        let mut out = Vec::new();
        for l in 0..lead {
            for (s, d) in inputs {
                let piece: usize = s[dim..rank].iter().product();
                out.extend_from_slice(&d[l * piece..(l + 1) * piece]);
            }
        }
        (sizes, out)
    }

    #[test]
    fn cat_last_dim_like_rope() {
        let mut h = Harness::new();
        let a = h.tensor(&[2, 2, 1], &[1f32, 2., 3., 4.]);
        let b = h.tensor(&[2, 2, 1], &[5f32, 6., 7., 8.]);
        let l = h.tensor_list(&[a, b]);
        let d = h.int(-1);
        let out = h.out(ScalarType::Float, &[2, 2, 2]);
        h.call("aten::cat.out", &[l, d, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1., 5., 2., 6., 3., 7., 4., 8.]);
    }

    #[test]
    fn cat_skips_legacy_empty_and_casts() {
        let mut h = Harness::new();
        let a = h.tensor(&[2], &[1i64, 2]);
        let e = h.tensor::<f32>(&[0], &[]);
        let b = h.tensor(&[1], &[3i32]);
        let l = h.tensor_list(&[a, e, b]);
        let d = h.int(0);
        let out = h.out(ScalarType::Float, &[4]);
        h.call("aten::cat.out", &[l, d, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1., 2., 3.]);
        // Float into an integer out is refused.
        let f = h.tensor(&[1], &[1.5f32]);
        let l = h.tensor_list(&[a, f]);
        let oi = h.out(ScalarType::Long, &[4]);
        assert!(h.call("aten::cat.out", &[l, d, oi, oi]).is_err());
    }

    #[test]
    fn cat_bad_calls() {
        let mut h = Harness::new();
        let a = h.tensor(&[2, 3], &[0f32; 6]);
        let b = h.tensor(&[3, 2], &[0f32; 6]);
        let c = h.tensor(&[6], &[0f32; 6]);
        let out = h.out(ScalarType::Float, &[12, 12]);
        let d0 = h.int(0);
        let d5 = h.int(5);
        let l = h.tensor_list(&[a, b]);
        assert!(h.call("aten::cat.out", &[l, d0, out, out]).is_err());
        let l = h.tensor_list(&[a, c]);
        assert!(h.call("aten::cat.out", &[l, d0, out, out]).is_err());
        let l = h.tensor_list(&[a, a]);
        assert!(h.call("aten::cat.out", &[l, d5, out, out]).is_err());
        let empty = h.tensor_list(&[]);
        assert!(h.call("aten::cat.out", &[empty, d0, out, out]).is_err());
        let small = h.out(ScalarType::Float, &[3, 3]);
        assert!(h.call("aten::cat.out", &[l, d0, small, small]).is_err());
        assert!(h.call("aten::cat.out", &[a, d0, out, out]).is_err());
    }

    #[test]
    fn stack_dims() {
        let mut h = Harness::new();
        let a = h.tensor(&[2], &[1f32, 2.]);
        let b = h.tensor(&[2], &[3f32, 4.]);
        let l = h.tensor_list(&[a, b]);
        let d = h.int(0);
        let out = h.out(ScalarType::Float, &[2, 2]);
        h.call("aten::stack.out", &[l, d, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1., 2., 3., 4.]);
        let d = h.int(-1);
        h.call("aten::stack.out", &[l, d, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1., 3., 2., 4.]);
        let c = h.tensor(&[3], &[0f32; 3]);
        let l2 = h.tensor_list(&[a, c]);
        assert!(h.call("aten::stack.out", &[l2, d, out, out]).is_err());
        let d3 = h.int(2);
        assert!(h.call("aten::stack.out", &[l, d3, out, out]).is_err());
    }

    #[test]
    fn splits() {
        let mut h = Harness::new();
        let x = h.tensor(&[5, 2], &(0..10).map(|i| i as f32).collect::<Vec<_>>());
        let sizes = h.int_list(&[1, 4]);
        let d = h.int(0);
        let o1 = h.out(ScalarType::Float, &[5, 2]);
        let o2 = h.out(ScalarType::Float, &[5, 2]);
        let outs = h.tensor_list(&[o1, o2]);
        h.call("aten::split_with_sizes_copy.out", &[x, sizes, d, outs])
            .unwrap();
        assert_eq!(h.read::<f32>(o1), vec![0., 1.]);
        assert_eq!(
            h.read::<f32>(o2),
            (2..10).map(|i| i as f32).collect::<Vec<_>>()
        );
        let bad = h.int_list(&[1, 3]);
        assert!(
            h.call("aten::split_with_sizes_copy.out", &[x, bad, d, outs])
                .is_err()
        );
        let two = h.int(2);
        let o3 = h.out(ScalarType::Float, &[5, 2]);
        let outs3 = h.tensor_list(&[o1, o2, o3]);
        h.call("aten::split_copy.Tensor_out", &[x, two, d, outs3, outs3])
            .unwrap();
        assert_eq!(h.read::<f32>(o1), vec![0., 1., 2., 3.]);
        assert_eq!(h.read::<f32>(o3), vec![8., 9.]);
        assert!(
            h.call("aten::split_copy.Tensor_out", &[x, two, d, outs, outs])
                .is_err()
        );
        let zero = h.int(0);
        assert!(
            h.call("aten::split_copy.Tensor_out", &[x, zero, d, outs3])
                .is_err()
        );
    }

    #[test]
    fn unbind_copy_selects_each_index_and_casts() {
        let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
        let sizes = [2usize, 3, 4];
        let op = "aten::unbind_copy.int_out";
        for dim in [0i64, 1, 2, -1] {
            let d = dim.rem_euclid(3) as usize;
            let out_sizes: Vec<usize> = (0..3).filter(|&k| k != d).map(|k| sizes[k]).collect();
            let mut h = Harness::new();
            let x = h.tensor(&sizes, &data);
            let dv = h.int(dim);
            let outs: Vec<usize> = (0..sizes[d])
                .map(|_| h.out(ScalarType::Float, &out_sizes))
                .collect();
            let list = h.tensor_list(&outs);
            h.call(op, &[x, dv, list]).unwrap();
            for (j, &o) in outs.iter().enumerate() {
                // Reference: the elements whose index along d is j, in order.
                let want: Vec<f32> = (0..24)
                    .filter(|&f| [f / 12, f / 4 % 3, f % 4][d] == j)
                    .map(|f| data[f])
                    .collect();
                assert_eq!(h.read::<f32>(o), want, "{dim} {j}");
            }
        }
        // Outs of another dtype get cast values; f32 -> i32 truncates.
        let mut h = Harness::new();
        let x = h.tensor(&[2, 2], &[1.5f32, -2.5, 3.0, 4.75]);
        let zero = h.int(0);
        let (a, b) = (h.out(ScalarType::Int, &[2]), h.out(ScalarType::Int, &[2]));
        let list = h.tensor_list(&[a, b]);
        h.call(op, &[x, zero, list, list]).unwrap();
        assert_eq!(
            (h.read::<i32>(a), h.read::<i32>(b)),
            (vec![1, -2], vec![3, 4])
        );
        // Wrong count, mixed dtypes, a wrong shape and a 0-d input are refused.
        let one = h.tensor_list(&[a]);
        assert!(h.call(op, &[x, zero, one]).is_err());
        let f = h.out(ScalarType::Float, &[2]);
        let mixed = h.tensor_list(&[a, f]);
        assert!(h.call(op, &[x, zero, mixed]).is_err());
        let long = h.out(ScalarType::Int, &[3]);
        let wrong = h.tensor_list(&[a, long]);
        assert!(h.call(op, &[x, zero, wrong]).is_err());
        let s = h.tensor(&[], &[1.0f32]);
        let empty = h.tensor_list(&[]);
        assert!(h.call(op, &[s, zero, empty]).is_err());
    }

    #[test]
    fn split_accepts_one_optional_return_slot() {
        let mut h = Harness::new();
        let x = h.tensor(&[4], &[0f32, 1., 2., 3.]);
        let two = h.int(2);
        let d = h.int(0);
        let o1 = h.out(ScalarType::Float, &[2]);
        let o2 = h.out(ScalarType::Float, &[2]);
        let outs = h.tensor_list(&[o1, o2]);
        let op = "aten::split_copy.Tensor_out";
        h.call(op, &[x, two, d, outs]).unwrap();
        h.call(op, &[x, two, d, outs, outs]).unwrap();
        assert_eq!(h.read::<f32>(o2), vec![2., 3.]);
        for slots in [&[x, two, d][..], &[x, two, d, outs, outs, outs]] {
            assert!(matches!(
                h.call(op, slots),
                Err(KernelError::OpArgCount { expected: 4, .. })
            ));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn cat_matches_reference(
            base in proptest::collection::vec(0usize..4, 1..4),
            extra in proptest::collection::vec(0usize..4, 1..4),
            dim_pick in 0usize..4,
            threads in 1usize..3,
        ) {
            let dim = dim_pick % base.len();
            let mut inputs = Vec::new();
            let mut next = 0f32;
            for &e in &extra {
                let mut s = base.clone();
                s[dim] = e;
                let n: usize = s.iter().product();
                let d: Vec<f32> = (0..n).map(|i| next + i as f32).collect();
                next += n as f32;
                inputs.push((s, d));
            }
            let (want_sizes, want) = cat_ref(&inputs, dim);
            let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
            let ids: Vec<usize> = inputs.iter().map(|(s, d)| h.tensor(s, d)).collect();
            let l = h.tensor_list(&ids);
            let d = h.int(dim as i64);
            let mut bound = base.clone();
            bound[dim] = 12;
            let out = h.out(ScalarType::Float, &bound);
            h.call("aten::cat.out", &[l, d, out, out]).unwrap();
            prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), want_sizes.clone());
            prop_assert_eq!(h.read::<f32>(out), want);
        }
    }

    #[test]
    fn cat_parallel_large() {
        let sizes_a = [64usize, 300, 4];
        let sizes_b = [64usize, 100, 4];
        let da: Vec<f32> = (0..64 * 1200).map(|i| i as f32).collect();
        let db: Vec<f32> = (0..64 * 400).map(|i| -(i as f32)).collect();
        let (ws, want) = cat_ref(
            &[
                (sizes_a.to_vec(), da.clone()),
                (sizes_b.to_vec(), db.clone()),
            ],
            1,
        );
        let mut h = Harness::with_pool(ThreadPool::new(2).unwrap());
        let a = h.tensor(&sizes_a, &da);
        let b = h.tensor(&sizes_b, &db);
        let l = h.tensor_list(&[a, b]);
        let d = h.int(1);
        let out = h.out(ScalarType::Float, &ws);
        h.call("aten::cat.out", &[l, d, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), want);
    }
}
