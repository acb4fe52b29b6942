//! `view_copy`, `alias_copy`, `unsqueeze_copy` and the `squeeze_copy` overloads: the
//! output holds the input's elements in the same order under new sizes.

use crate::ops::prim::infer_view_sizes;
use crate::ops::shape::common::{Strided, copy_tensor, require_copy_pair};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, Tensor, normalize_dim};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::view_copy.out", view_copy);
    r.register("aten::alias_copy.out", alias_copy);
    r.register("aten::unsqueeze_copy.out", unsqueeze_copy);
    r.register("aten::squeeze_copy.dims_out", squeeze_copy_dims);
    r.register("aten::squeeze_copy.dim_out", squeeze_copy_dim);
    r.register("aten::squeeze_copy.out", squeeze_copy_all);
}

/// Resizes `out` to `sizes` and copies `input`'s elements into it in order.
fn reshape_into(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    out: OutArg,
    sizes: &[usize],
) -> Result<(), KernelError> {
    require_copy_pair(input, &out.tensor())?;
    let o = out.resize(a, sizes)?;
    if o.numel() != input.numel() {
        return Err(KernelError::invalid(format!(
            "cannot reshape {} elements to {sizes:?}",
            input.numel()
        )));
    }
    let n = input.numel();
    copy_tensor(ctx, input, &o, 0, &Strided::new(&[n], &[1])?)
}

op_args! {
    /// `view_copy.out(Tensor self, SymInt[] size, *, Tensor(a!) out)`.
    struct ViewCopyArgs<'a> = "aten::view_copy.out" {
        input: Tensor,
        size: IntList<'a>,
        out: OutArg,
    } returns 1
}

fn view_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ViewCopyArgs { input, size, out } = ViewCopyArgs::unpack(a)?;
    let mut req = [0i64; MAX_RANK];
    let req = size.read_into(&mut req)?;
    let mut buf = [0usize; MAX_RANK];
    let sizes = infer_view_sizes(req, input.numel(), &mut buf)?;
    reshape_into(ctx, a, &input, out, sizes)
}

op_args! {
    /// `alias_copy.out(Tensor self, *, Tensor(a!) out)`.
    struct AliasCopyArgs = "aten::alias_copy.out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

fn alias_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let AliasCopyArgs { input, out } = AliasCopyArgs::unpack(a)?;
    reshape_into(ctx, a, &input, out, input.sizes())
}

op_args! {
    /// `unsqueeze_copy.out(Tensor self, int dim, *, Tensor(a!) out)`.
    struct UnsqueezeArgs = "aten::unsqueeze_copy.out" {
        input: Tensor,
        dim: i64,
        out: OutArg,
    } returns 1
}

fn unsqueeze_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let UnsqueezeArgs { input, dim, out } = UnsqueezeArgs::unpack(a)?;
    let rank = input.rank();
    if rank >= MAX_RANK {
        return Err(KernelError::invalid("unsqueeze beyond the rank limit"));
    }
    let dim = normalize_dim(dim, rank + 1)?;
    let mut sizes = [0usize; MAX_RANK];
    sizes[..dim].copy_from_slice(&input.sizes()[..dim]);
    sizes[dim] = 1;
    sizes[dim + 1..=rank].copy_from_slice(&input.sizes()[dim..]);
    reshape_into(ctx, a, &input, out, &sizes[..=rank])
}

/// Copies `input` into `out` without the dims flagged in `drop` whose size is 1.
fn squeeze_into(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    out: OutArg,
    drop: &[bool; MAX_RANK],
) -> Result<(), KernelError> {
    let mut sizes = [0usize; MAX_RANK];
    let mut n = 0;
    for (d, &s) in input.sizes().iter().enumerate() {
        if !(drop[d] && s == 1) {
            sizes[n] = s;
            n += 1;
        }
    }
    reshape_into(ctx, a, input, out, &sizes[..n])
}

op_args! {
    /// `squeeze_copy.dims_out(Tensor self, int[] dim, *, Tensor(a!) out)`.
    struct SqueezeDimsArgs<'a> = "aten::squeeze_copy.dims_out" {
        input: Tensor,
        dim: IntList<'a>,
        out: OutArg,
    } returns 1
}

fn squeeze_copy_dims(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SqueezeDimsArgs {
        input,
        dim: list,
        out,
    } = SqueezeDimsArgs::unpack(a)?;
    let mut drop = [false; MAX_RANK];
    for j in 0..list.len() {
        let d = normalize_dim(list.get(j)?, input.rank())?;
        if std::mem::replace(&mut drop[d], true) {
            return Err(KernelError::invalid(format!(
                "squeeze: dim {d} appears more than once"
            )));
        }
    }
    squeeze_into(ctx, a, &input, out, &drop)
}

op_args! {
    /// `squeeze_copy.dim_out(Tensor self, int dim, *, Tensor(a!) out)`.
    struct SqueezeDimArgs = "aten::squeeze_copy.dim_out" {
        input: Tensor,
        dim: i64,
        out: OutArg,
    } returns 1
}

fn squeeze_copy_dim(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SqueezeDimArgs { input, dim, out } = SqueezeDimArgs::unpack(a)?;
    let mut drop = [false; MAX_RANK];
    drop[normalize_dim(dim, input.rank())?] = true;
    squeeze_into(ctx, a, &input, out, &drop)
}

op_args! {
    /// `squeeze_copy.out(Tensor self, *, Tensor(a!) out)`: drops every size-1 dim.
    struct SqueezeAllArgs = "aten::squeeze_copy.out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

fn squeeze_copy_all(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SqueezeAllArgs { input, out } = SqueezeAllArgs::unpack(a)?;
    let drop = [true; MAX_RANK];
    squeeze_into(ctx, a, &input, out, &drop)
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::testing::Harness;

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    #[test]
    fn view_copy_infers_and_copies() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &iota(6));
        let size = h.int_list(&[-1, 2]);
        let out = h.out(ScalarType::Float, &[6, 1]);
        h.call("aten::view_copy.out", &[x, size, out, out]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[3, 2]);
        assert_eq!(h.read::<f32>(out), iota(6));
        assert_ne!(h.tensor_meta(out).data(), h.tensor_meta(x).data());
        let bad = h.int_list(&[4, -1]);
        assert!(h.call("aten::view_copy.out", &[x, bad, out, out]).is_err());
        let two = h.int_list(&[-1, -1]);
        assert!(h.call("aten::view_copy.out", &[x, two, out, out]).is_err());
        let wrong_rank = h.int_list(&[6]);
        assert!(
            h.call("aten::view_copy.out", &[x, wrong_rank, out, out])
                .is_err()
        );
        let out_i = h.out(ScalarType::Int, &[3, 2]);
        let ok = h.int_list(&[3, 2]);
        assert!(
            h.call("aten::view_copy.out", &[x, ok, out_i, out_i])
                .is_err()
        );
        assert!(h.call("aten::view_copy.out", &[x, ok, out]).is_err());
    }

    #[test]
    fn alias_copy_any_dtype() {
        let mut h = Harness::new();
        let x = h.tensor(&[3], &[1i64, -2, 3]);
        let out = h.out(ScalarType::Long, &[3]);
        h.call("aten::alias_copy.out", &[x, out, out]).unwrap();
        assert_eq!(h.read::<i64>(out), vec![1, -2, 3]);
        let b = h.tensor_raw(ScalarType::Bool, &[2], &[1, 0]);
        let ob = h.out(ScalarType::Bool, &[2]);
        h.call("aten::alias_copy.out", &[b, ob, ob]).unwrap();
        assert_eq!(h.read_bytes(ob), vec![1, 0]);
    }

    #[test]
    fn unsqueeze_positions() {
        for (dim, want) in [
            (0i64, vec![1, 2, 3]),
            (1, vec![2, 1, 3]),
            (2, vec![2, 3, 1]),
            (-1, vec![2, 3, 1]),
            (-3, vec![1, 2, 3]),
        ] {
            let mut h = Harness::new();
            let x = h.tensor(&[2, 3], &iota(6));
            let d = h.int(dim);
            let out = h.out(ScalarType::Float, &[6, 1, 1]);
            h.call("aten::unsqueeze_copy.out", &[x, d, out, out])
                .unwrap();
            assert_eq!(h.tensor_meta(out).sizes(), &want[..], "dim {dim}");
            assert_eq!(h.read::<f32>(out), iota(6));
        }
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &iota(6));
        let d = h.int(3);
        let out = h.out(ScalarType::Float, &[6, 1, 1]);
        assert!(
            h.call("aten::unsqueeze_copy.out", &[x, d, out, out])
                .is_err()
        );
        // 0-d input.
        let s = h.tensor(&[], &[5f32]);
        let d = h.int(-1);
        let o1 = h.out(ScalarType::Float, &[1]);
        h.call("aten::unsqueeze_copy.out", &[s, d, o1, o1]).unwrap();
        assert_eq!(h.read::<f32>(o1), vec![5.0]);
    }

    #[test]
    fn squeeze_variants() {
        let mut h = Harness::new();
        let x = h.tensor(&[1, 2, 1, 3], &iota(6));
        let dims = h.int_list(&[0, -2]);
        let out = h.out(ScalarType::Float, &[6, 1]);
        h.call("aten::squeeze_copy.dims_out", &[x, dims, out, out])
            .unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[2, 3]);
        // A dim whose size is not 1 stays.
        let dims = h.int_list(&[1, 2]);
        let out3 = h.out(ScalarType::Float, &[6, 1, 1]);
        h.call("aten::squeeze_copy.dims_out", &[x, dims, out3, out3])
            .unwrap();
        assert_eq!(h.tensor_meta(out3).sizes(), &[1, 2, 3]);
        let dup = h.int_list(&[0, 0]);
        assert!(
            h.call("aten::squeeze_copy.dims_out", &[x, dup, out3, out3])
                .is_err()
        );
        let oob = h.int_list(&[4]);
        assert!(
            h.call("aten::squeeze_copy.dims_out", &[x, oob, out3, out3])
                .is_err()
        );
        let d = h.int(2);
        h.call("aten::squeeze_copy.dim_out", &[x, d, out3, out3])
            .unwrap();
        assert_eq!(h.tensor_meta(out3).sizes(), &[1, 2, 3]);
        h.call("aten::squeeze_copy.out", &[x, out, out]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[2, 3]);
        assert_eq!(h.read::<f32>(out), iota(6));
        // Rank mismatch with the out tensor is an error, not a panic.
        let o4 = h.out(ScalarType::Float, &[6, 1, 1, 1]);
        assert!(h.call("aten::squeeze_copy.out", &[x, o4, o4]).is_err());
        // 0-d squeeze.
        let s = h.tensor(&[], &[2f32]);
        let o0 = h.out(ScalarType::Float, &[]);
        h.call("aten::squeeze_copy.out", &[s, o0, o0]).unwrap();
        let dims = h.int_list(&[0]);
        h.call("aten::squeeze_copy.dims_out", &[s, dims, o0, o0])
            .unwrap();
        assert_eq!(h.read::<f32>(o0), vec![2.0]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn squeeze_then_unsqueeze_round_trips(sizes in proptest::collection::vec(0usize..4, 0..5), pick in 0usize..8) {
            let n: usize = sizes.iter().product();
            let data = iota(n);
            let mut h = Harness::new();
            let x = h.tensor(&sizes, &data);
            let squeezed: Vec<usize> = sizes.iter().copied().filter(|&s| s != 1).collect();
            let out = h.out(ScalarType::Float, &squeezed);
            h.call("aten::squeeze_copy.out", &[x, out, out]).unwrap();
            prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), squeezed.clone());
            prop_assert_eq!(h.read::<f32>(out), data.clone());
            let dim = pick % (squeezed.len() + 1);
            let mut un = squeezed.clone();
            un.insert(dim, 1);
            let d = h.int(dim as i64);
            let o2 = h.out(ScalarType::Float, &un);
            h.call("aten::unsqueeze_copy.out", &[out, d, o2, o2]).unwrap();
            prop_assert_eq!(h.tensor_meta(o2).sizes().to_vec(), un.clone());
            prop_assert_eq!(h.read::<f32>(o2), data);
        }
    }
}
