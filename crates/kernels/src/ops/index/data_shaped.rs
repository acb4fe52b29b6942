//! Ops whose output size depends on the input's values: `nonzero`, `masked_select`,
//! `repeat_interleave.Tensor`, and `masked_scatter`, which reads as many source
//! elements as the mask holds. The first three resize their out tensor to what they
//! find, so in a program it must be dynamically bounded (or already have that size).
//!
//! As the official portable kernels (`op_nonzero.cpp`, `op_masked_select.cpp`,
//! `op_repeat_interleave.cpp`, `op_masked_scatter.cpp`): elements are visited in
//! row-major order of the (broadcast) shape; a mask is bool.
//!
//! `nonzero` writes through its out tensor's dim order. torch's export plans that out
//! column-major (dim order `[1, 0]`), and the official 1.5.1 kernel writes it
//! row-major regardless, so for an input of rank 2 or more it returns the
//! coordinates transposed; etch returns them as PyTorch does.

use etch_base::{Element, ScalarType};

use crate::ops::elementwise::broadcast::broadcast_shapes;
use crate::ops::elementwise::dtype::with_elem;
use crate::ops::same_dtype;
use crate::ops::shape::common::{
    MAX_DIMS, advance_index, advance_index_with_offsets, broadcast_strides, require_contiguous,
    with_bits_type,
};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::nonzero.out", nonzero);
    r.register("aten::masked_select.out", masked_select);
    r.register("aten::masked_scatter.out", masked_scatter);
    r.register("aten::repeat_interleave.Tensor_out", repeat_interleave);
}

/// Calls `f(input_offset, mask_offset)` for every element of the broadcast shape
/// `target`, in row-major order, with the elements' offsets in the two tensors.
fn for_each_broadcast(
    target: &[usize],
    (s1, st1): (&[usize], &[usize]),
    (s2, st2): (&[usize], &[usize]),
    mut f: impl FnMut(usize, usize),
) -> Result<(), KernelError> {
    let (mut b1, mut b2) = ([0usize; MAX_DIMS], [0usize; MAX_DIMS]);
    let a = broadcast_strides(s1, st1, target, &mut b1)?;
    let b = broadcast_strides(s2, st2, target, &mut b2)?;
    let n: usize = target.iter().product();
    let mut idx = [0usize; MAX_RANK];
    let mut at = [0usize; 2];
    for _ in 0..n {
        f(at[0], at[1]);
        advance_index_with_offsets(&mut idx[..target.len()], target, [a, b], &mut at);
    }
    Ok(())
}

op_args! {
    /// `nonzero.out(Tensor self, *, Tensor(a!) out)`: `[count, rank]` int64, the
    /// coordinates of every non-zero element (NaN counts), in row-major order.
    struct NonzeroArgs = "aten::nonzero.out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

fn nonzero(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let NonzeroArgs { input, out } = NonzeroArgs::unpack(a)?;
    let o = out.tensor();
    if o.dtype() != ScalarType::Long || o.rank() != 2 {
        return Err(KernelError::invalid(format!(
            "nonzero: out must be a 2-d int64 tensor, got {o:?}"
        )));
    }
    require_contiguous(&input, "self")?;
    let rank = input.rank();
    with_elem!(input.dtype(), E => {
        let x = ctx.read::<E>(&input)?;
        let count = x.iter().filter(|v| v.to_bool()).count();
        let out = out.resize(a, &[count, rank])?;
        let dst = ctx.write::<i64>(&out)?;
        // Through the out's strides: torch plans nonzero's out column-major.
        let (s0, s1) = (out.strides()[0], out.strides()[1]);
        if count > 0 && rank > 0 && (count - 1) * s0 + (rank - 1) * s1 >= dst.len() {
            return Err(KernelError::invalid("nonzero: out strides exceed its storage"));
        }
        let sizes = input.sizes();
        let mut idx = [0usize; MAX_RANK];
        let mut row = 0;
        for v in x {
            if v.to_bool() {
                for (j, &i) in idx[..rank].iter().enumerate() {
                    dst[row * s0 + j * s1] = i as i64;
                }
                row += 1;
            }
            advance_index(&mut idx[..rank], sizes);
        }
        Ok(())
    }, Err(KernelError::UnsupportedDtype { dtype: input.dtype(), what: "nonzero" }))
}

/// Checks a mask op's dtypes (`self` any number type or bool, `mask` bool) and
/// returns the broadcast shape of `self` and `mask` into `buf`.
fn mask_shape<'b>(
    what: &'static str,
    input: &Tensor,
    mask: &Tensor,
    buf: &'b mut [usize; MAX_RANK],
) -> Result<&'b [usize], KernelError> {
    if !crate::ops::elementwise::dtype::is_supported(input.dtype()) {
        return Err(KernelError::UnsupportedDtype {
            dtype: input.dtype(),
            what,
        });
    }
    if mask.dtype() != ScalarType::Bool {
        return Err(KernelError::invalid(format!(
            "{what}: mask must be bool, got {}",
            mask.dtype()
        )));
    }
    require_contiguous(input, "self")?;
    require_contiguous(mask, "mask")?;
    broadcast_shapes(&[input.sizes(), mask.sizes()], buf)
}

op_args! {
    /// `masked_select.out(Tensor self, Tensor mask, *, Tensor(a!) out)`: 1-d, the
    /// elements of `self` where the broadcast `mask` is true.
    struct MaskedSelectArgs = "aten::masked_select.out" {
        input: Tensor,
        mask: Tensor,
        out: OutArg,
    } returns 1
}

fn masked_select(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let MaskedSelectArgs { input, mask, out } = MaskedSelectArgs::unpack(a)?;
    let mut buf = [0usize; MAX_RANK];
    let target = mask_shape("masked_select", &input, &mask, &mut buf)?;
    same_dtype(&input, &out.tensor())?;
    require_contiguous(&out.tensor(), "out")?;
    if input.numel() == 0 || mask.numel() == 0 {
        out.resize(a, &[0])?;
        return Ok(());
    }
    let m = ctx.read_raw::<u8>(&mask)?;
    // Each mask element repeats numel(target) / numel(mask) times.
    let count =
        m.iter().filter(|&&b| b != 0).count() * (target.iter().product::<usize>() / m.len());
    let out = out.resize(a, &[count])?;
    with_bits_type!(input.dtype().element_size(), T => {
        let x = ctx.read_raw::<T>(&input)?;
        let dst = ctx.write_raw::<T>(&out)?;
        let mut k = 0;
        for_each_broadcast(
            target,
            (input.sizes(), input.strides()),
            (mask.sizes(), mask.strides()),
            |xi, mi| {
                if m[mi] != 0 {
                    dst[k] = x[xi];
                    k += 1;
                }
            },
        )
    })
}

op_args! {
    /// `masked_scatter.out(Tensor self, Tensor mask, Tensor source, *, Tensor(a!)
    /// out)`: `self` broadcast with `mask`, where the mask is true taking the next
    /// element of `source` (row-major).
    struct MaskedScatterArgs = "aten::masked_scatter.out" {
        input: Tensor,
        mask: Tensor,
        source: Tensor,
        out: OutArg,
    } returns 1
}

/// As upstream, `source` must hold at least as many elements as the broadcast mask
/// has true positions (checked before anything is written).
fn masked_scatter(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let MaskedScatterArgs {
        input,
        mask,
        source,
        out,
    } = MaskedScatterArgs::unpack(a)?;
    let mut buf = [0usize; MAX_RANK];
    let target = mask_shape("masked_scatter", &input, &mask, &mut buf)?;
    same_dtype(&input, &source)?;
    same_dtype(&input, &out.tensor())?;
    require_contiguous(&source, "source")?;
    require_contiguous(&out.tensor(), "out")?;
    let out = out.resize(a, target)?;
    if out.numel() == 0 {
        return Ok(());
    }
    let m = ctx.read_raw::<u8>(&mask)?;
    let needed = m.iter().filter(|&&b| b != 0).count() * (out.numel() / m.len());
    if needed > source.numel() {
        return Err(KernelError::invalid(format!(
            "masked_scatter: source has {} elements, the mask selects {needed}",
            source.numel()
        )));
    }
    with_bits_type!(input.dtype().element_size(), T => {
        let x = ctx.read_raw::<T>(&input)?;
        let s = ctx.read_raw::<T>(&source)?;
        let dst = ctx.write_raw::<T>(&out)?;
        let (mut k, mut o) = (0, 0);
        for_each_broadcast(
            target,
            (input.sizes(), input.strides()),
            (mask.sizes(), mask.strides()),
            |xi, mi| {
                dst[o] = if m[mi] != 0 {
                    k += 1;
                    s[k - 1]
                } else {
                    x[xi]
                };
                o += 1;
            },
        )
    })
}

op_args! {
    /// `repeat_interleave.Tensor_out(Tensor repeats, *, SymInt? output_size=None,
    /// Tensor(a!) out)`: `i` repeated `repeats[i]` times, for every `i`, in the
    /// dtype of `repeats` (int32 or int64).
    struct RepeatInterleaveArgs = "aten::repeat_interleave.Tensor_out" {
        repeats: Tensor,
        output_size: Option<i64>,
        out: OutArg,
    } returns 1
}

/// As upstream: `repeats` 1-d int32 or int64 without negative values, `out` of its
/// dtype, and `output_size`, when given, the sum of `repeats`.
fn repeat_interleave(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let RepeatInterleaveArgs {
        repeats,
        output_size,
        out,
    } = RepeatInterleaveArgs::unpack(a)?;
    if repeats.rank() != 1 {
        return Err(KernelError::invalid(format!(
            "repeat_interleave: repeats must be 1-d, got {:?}",
            repeats.sizes()
        )));
    }
    same_dtype(&repeats, &out.tensor())?;
    match repeats.dtype() {
        ScalarType::Int => fill_repeats::<i32>(ctx, a, &repeats, output_size, out),
        ScalarType::Long => fill_repeats::<i64>(ctx, a, &repeats, output_size, out),
        dtype => Err(KernelError::UnsupportedDtype {
            dtype,
            what: "repeat_interleave repeats (int32 or int64)",
        }),
    }
}

fn fill_repeats<T: Element + TryFrom<usize>>(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    repeats: &Tensor,
    output_size: Option<i64>,
    out: OutArg,
) -> Result<(), KernelError> {
    let r = ctx.read::<T>(repeats)?;
    let mut sum = 0usize;
    for (i, v) in r.iter().enumerate() {
        let v = v.to_i64();
        if v < 0 {
            return Err(KernelError::invalid(format!(
                "repeat_interleave: repeats[{i}] = {v} is negative"
            )));
        }
        sum = sum
            .checked_add(v as usize)
            .ok_or_else(|| KernelError::invalid("repeat_interleave: repeats overflow"))?;
    }
    if let Some(n) = output_size.filter(|&n| n as i128 != sum as i128) {
        return Err(KernelError::invalid(format!(
            "repeat_interleave: output_size {n} is not the sum of repeats, {sum}"
        )));
    }
    let out = out.resize(a, &[sum])?;
    let dst = ctx.write::<T>(&out)?;
    let mut k = 0;
    for (i, v) in r.iter().enumerate() {
        let value = T::try_from(i).map_err(|_| {
            KernelError::invalid(format!(
                "repeat_interleave: index {i} overflows {}",
                T::DTYPE
            ))
        })?;
        let n = v.to_i64() as usize;
        dst[k..k + n].fill(value);
        k += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use etch_base::{Bool8, ScalarType};
    use proptest::prelude::*;

    use crate::testing::Harness;

    fn bools(v: &[u8]) -> Vec<Bool8> {
        v.iter().map(|&b| Bool8(b)).collect()
    }

    proptest! {
        #[test]
        fn nonzero_lists_coordinates_in_row_major_order(
            sizes in prop::collection::vec(1usize..4, 0..4),
            seed in any::<u64>(),
        ) {
            let n: usize = sizes.iter().product();
            let vals: Vec<f32> = (0..n).map(|i| if (seed >> (i % 64)) & 1 == 1 { i as f32 - 2.0 } else { 0.0 }).collect();
            let mut want = Vec::new();
            for (f, &v) in vals.iter().enumerate() {
                if v != 0.0 {
                    let mut rem = f;
                    let mut c = vec![0i64; sizes.len()];
                    for d in (0..sizes.len()).rev() { c[d] = (rem % sizes[d]) as i64; rem /= sizes[d]; }
                    want.extend(c);
                }
            }
            let mut h = Harness::new();
            let x = h.tensor(&sizes, &vals);
            let out = h.out(ScalarType::Long, &[n, sizes.len()]);
            h.call("aten::nonzero.out", &[x, out, out]).unwrap();
            let count = vals.iter().filter(|&&v| v != 0.0).count();
            prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), vec![count, sizes.len()]);
            prop_assert_eq!(h.read::<i64>(out), want.clone());
            // A column-major out (as torch plans it) holds the same coordinates.
            let cm = h.out_with_order(ScalarType::Long, &[n, sizes.len()], &[1, 0]);
            h.call("aten::nonzero.out", &[x, cm, cm]).unwrap();
            prop_assert_eq!(h.read_logical::<i64>(cm), want);
        }
    }

    #[test]
    fn masked_select_and_scatter_broadcast_the_mask() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &[1i32, 2, 3, 4, 5, 6]);
        let m = h.tensor(&[3], &bools(&[1, 0, 1]));
        let out = h.out(ScalarType::Int, &[6]);
        h.call("aten::masked_select.out", &[x, m, out, out])
            .unwrap();
        assert_eq!(h.read::<i32>(out), vec![1, 3, 4, 6]);
        // self broadcast against a larger mask.
        let col = h.tensor(&[2, 1], &[10i32, 20]);
        let m2 = h.tensor(&[2, 3], &bools(&[1, 1, 0, 0, 0, 1]));
        h.call("aten::masked_select.out", &[col, m2, out, out])
            .unwrap();
        assert_eq!(h.read::<i32>(out), vec![10, 10, 20]);
        // masked_scatter takes source elements in order.
        let src = h.tensor(&[5], &[-1i32, -2, -3, -4, -5]);
        let so = h.out(ScalarType::Int, &[2, 3]);
        h.call("aten::masked_scatter.out", &[x, m, src, so, so])
            .unwrap();
        assert_eq!(h.read::<i32>(so), vec![-1, 2, -2, -3, 5, -4]);
        // Too few source elements, a non-bool mask, a wrong out dtype.
        let short = h.tensor(&[3], &[0i32; 3]);
        assert!(
            h.call("aten::masked_scatter.out", &[x, m, short, so, so])
                .is_err()
        );
        let im = h.tensor(&[3], &[1i32, 0, 1]);
        assert!(
            h.call("aten::masked_select.out", &[x, im, out, out])
                .is_err()
        );
        let fo = h.out(ScalarType::Float, &[6]);
        assert!(h.call("aten::masked_select.out", &[x, m, fo, fo]).is_err());
        // A static out of the wrong size cannot take the result.
        let fixed = h.tensor(&[3], &[0i32; 3]);
        assert!(
            h.call("aten::masked_select.out", &[x, m, fixed, fixed])
                .is_err()
        );
    }

    #[test]
    fn repeat_interleave_repeats_each_index() {
        let mut h = Harness::new();
        let r = h.tensor(&[4], &[2i64, 0, 3, 1]);
        let none = h.none();
        let out = h.out(ScalarType::Long, &[10]);
        let op = "aten::repeat_interleave.Tensor_out";
        h.call(op, &[r, none, out, out]).unwrap();
        assert_eq!(h.read::<i64>(out), vec![0, 0, 2, 2, 2, 3]);
        let six = h.int(6);
        h.call(op, &[r, six, out, out]).unwrap();
        let r32 = h.tensor(&[2], &[1i32, 2]);
        let o32 = h.out(ScalarType::Int, &[4]);
        h.call(op, &[r32, none, o32, o32]).unwrap();
        assert_eq!(h.read::<i32>(o32), vec![0, 1, 1]);
        // A wrong output_size, a negative repeat, 2-d repeats, a dtype mismatch.
        let five = h.int(5);
        assert!(h.call(op, &[r, five, out, out]).is_err());
        let neg = h.tensor(&[2], &[1i64, -1]);
        assert!(h.call(op, &[neg, none, out, out]).is_err());
        let two_d = h.tensor(&[1, 2], &[1i64, 1]);
        assert!(h.call(op, &[two_d, none, out, out]).is_err());
        assert!(h.call(op, &[r32, none, out, out]).is_err());
    }
}
