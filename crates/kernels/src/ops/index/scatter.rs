//! `scatter` (a source tensor or one value) and `scatter_add`: the out tensor is a
//! copy of `self`, then for every position `p` of `index` (row-major), the element of
//! `out` at `p` with its `dim` coordinate replaced by `index[p]` takes `src[p]` (or the
//! value), or has `src[p]` added to it. Repeated indices: the last write wins, or
//! every addition lands.
//!
//! Checks follow upstream (`check_scatter_add_args`, `check_gather_args`): int64
//! indices in `0..self.size(dim)`, no negative ones; `self`, `src` and `out` of one
//! dtype; `index` no larger than `src` in any dim and than `self` in any dim but
//! `dim`; all of the same rank (a 0-d tensor counts as rank 1 of size 1). An empty
//! index only copies `self`.

use etch_base::{Element, ScalarType, cast};

use crate::ops::elementwise::dtype::{with_compute, with_elem};
use crate::ops::elementwise::num::Num;
use crate::ops::same_dtype;
use crate::ops::shape::common::{advance_index, require_contiguous, with_bits_type};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::scatter.src_out", scatter_src);
    r.register("aten::scatter.value_out", scatter_value);
    r.register("aten::scatter_add.out", scatter_add);
}

op_args! {
    /// `scatter.src_out(Tensor self, int dim, Tensor index, Tensor src, *, Tensor(a!)
    /// out)` and `scatter_add.out` (the same arguments).
    struct ScatterSrcArgs = "aten::<scatter.src_out|scatter_add.out>" {
        input: Tensor,
        dim: i64,
        index: Tensor,
        src: Tensor,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `scatter.value_out(Tensor self, int dim, Tensor index, Scalar value, *,
    /// Tensor(a!) out)`.
    struct ScatterValueArgs = "aten::scatter.value_out" {
        input: Tensor,
        dim: i64,
        index: Tensor,
        value: Scalar,
        out: OutArg,
    } returns 1
}

/// Sizes of `t` as upstream's `nonempty_size` reads them: a 0-d tensor is `[1]`.
fn nonempty_sizes(t: &Tensor) -> &[usize] {
    if t.rank() == 0 { &[1] } else { t.sizes() }
}

/// Row-major strides of `sizes` into `buf`.
fn contiguous_strides<'b>(sizes: &[usize], buf: &'b mut [usize; MAX_RANK]) -> &'b [usize] {
    let mut s = 1;
    for d in (0..sizes.len()).rev() {
        buf[d] = s;
        s *= sizes[d].max(1);
    }
    &buf[..sizes.len()]
}

/// The checked operands of one scatter: the normalized dim and the index values.
struct Plan<'a> {
    what: &'static str,
    dim: usize,
    index: &'a [i64],
    isizes: &'a [usize],
}

impl Plan<'_> {
    /// Calls `f(out_offset, src_position)` for every index position, in row-major
    /// order, `src_position` being the position's offset in a contiguous tensor of
    /// `src_sizes`.
    fn for_each(
        &self,
        out_sizes: &[usize],
        src_sizes: Option<&[usize]>,
        mut f: impl FnMut(usize, usize),
    ) {
        let r = self.isizes.len();
        let (mut ob, mut sb) = ([0usize; MAX_RANK], [0usize; MAX_RANK]);
        let ostr = contiguous_strides(out_sizes, &mut ob);
        let sstr = contiguous_strides(src_sizes.unwrap_or(self.isizes), &mut sb);
        let mut pos = [0usize; MAX_RANK];
        for &v in self.index {
            let (mut o, mut s) = (0, 0);
            for k in 0..r {
                let c = if k == self.dim { v as usize } else { pos[k] };
                o += c * ostr[k];
                s += pos[k] * sstr[k];
            }
            f(o, s);
            advance_index(&mut pos[..r], self.isizes);
        }
    }
}

/// Checks the operands (see the module documentation) and reads the index.
fn plan<'a>(
    ctx: &'a KernelContext<'_>,
    what: &'static str,
    input: &Tensor,
    dim: i64,
    index: &'a Tensor,
    src: Option<&Tensor>,
) -> Result<Plan<'a>, KernelError> {
    if index.dtype() != ScalarType::Long {
        return Err(KernelError::invalid(format!(
            "{what}: index must be int64, got {}",
            index.dtype()
        )));
    }
    let dim = input.normalize_dim(dim)?;
    require_contiguous(input, "self")?;
    require_contiguous(index, "index")?;
    if let Some(s) = src {
        same_dtype(input, s)?;
        require_contiguous(s, "src")?;
    }
    let isizes = nonempty_sizes(index);
    if index.numel() == 0 {
        return Ok(Plan {
            what,
            dim,
            index: &[],
            isizes,
        });
    }
    let ssizes = nonempty_sizes(input);
    let rank = ssizes.len();
    let src_sizes = src.map(nonempty_sizes);
    if isizes.len() != rank || src_sizes.is_some_and(|s| s.len() != rank) {
        return Err(KernelError::invalid(format!(
            "{what}: self, index and src must have the same number of dims (self {:?}, \
             index {:?}{})",
            input.sizes(),
            index.sizes(),
            src.map_or(String::new(), |s| format!(", src {:?}", s.sizes()))
        )));
    }
    for d in 0..rank {
        let over_src = src_sizes.is_some_and(|s| isizes[d] > s[d]);
        if over_src || (d != dim && isizes[d] > ssizes[d]) {
            return Err(KernelError::invalid(format!(
                "{what}: index {:?} is larger than self {:?} or src at dim {d}",
                index.sizes(),
                input.sizes()
            )));
        }
    }
    let values = ctx.read::<i64>(index)?;
    let size = ssizes[dim];
    if let Some(&v) = values.iter().find(|&&v| v < 0 || v as u64 >= size as u64) {
        return Err(KernelError::invalid(format!(
            "{what}: index {v} is out of bounds for dim {dim} of size {size}"
        )));
    }
    Ok(Plan {
        what,
        dim,
        index: values,
        isizes,
    })
}

/// Checks `out` and resizes it to `self`'s sizes (the kernel then copies `self` in).
fn resize_out(a: &mut Args<'_>, input: &Tensor, out: OutArg) -> Result<Tensor, KernelError> {
    same_dtype(input, &out.tensor())?;
    require_contiguous(&out.tensor(), "out")?;
    out.resize(a, input.sizes())
}

/// Upstream's dtypes for the scatters: numbers, half types and bool.
fn check_dtype(t: &Tensor, what: &'static str) -> Result<(), KernelError> {
    with_elem!(t.dtype(), E => { let _ = std::mem::size_of::<E>(); Ok(()) },
        Err(KernelError::UnsupportedDtype { dtype: t.dtype(), what }))
}

fn scatter_src(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    scatter_from_src(ctx, a, false)
}

fn scatter_add(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    scatter_from_src(ctx, a, true)
}

/// `scatter.src_out`, or `scatter_add.out` when `add`: the same arguments and checks,
/// then each `src` element replaces, or is added to, its element of the out.
fn scatter_from_src(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    add: bool,
) -> Result<(), KernelError> {
    let what = if add { "scatter_add" } else { "scatter" };
    let ScatterSrcArgs {
        input,
        dim,
        index,
        src,
        out,
    } = ScatterSrcArgs::unpack(a)?;
    check_dtype(&input, what)?;
    let p = plan(ctx, what, &input, dim, &index, Some(&src))?;
    let out = resize_out(a, &input, out)?;
    let (osizes, ssizes) = (nonempty_sizes(&out), nonempty_sizes(&src));
    if !add {
        return with_bits_type!(input.dtype().element_size(), T => {
            let s = ctx.read_raw::<T>(&src)?;
            let o = ctx.write_raw::<T>(&out)?;
            o.copy_from_slice(ctx.read_raw::<T>(&input)?);
            p.for_each(osizes, Some(ssizes), |oi, si| o[oi] = s[si]);
            Ok(())
        });
    }
    with_elem!(input.dtype(), E => {
        with_compute!(input.dtype(), C => {
            let s = ctx.read::<E>(&src)?;
            let o = ctx.write::<E>(&out)?;
            o.copy_from_slice(ctx.read::<E>(&input)?);
            p.for_each(osizes, Some(ssizes), |oi, si| {
                o[oi] = cast::<C, E>(cast::<E, C>(o[oi]).add(cast::<E, C>(s[si])));
            });
            Ok(())
        })
    }, Err(KernelError::UnsupportedDtype { dtype: input.dtype(), what: p.what }))
}

/// Fails when the finite `value` lies outside what `dtype` holds (upstream's
/// overflow check of a scalar cast); every value fits a bool, and an inf or NaN a
/// float type.
fn check_fits(value: Scalar, dtype: ScalarType, what: &'static str) -> Result<(), KernelError> {
    let v = value.to_f64();
    let fits = with_elem!(dtype, E => {
        if dtype == ScalarType::Bool || !v.is_finite() && dtype.is_floating_point() {
            true
        } else if dtype.is_floating_point() {
            E::from_f64(v).to_f64().is_finite()
        } else {
            let (lo, hi) = int_range(dtype);
            match value {
                Scalar::Int(i) => (lo..=hi).contains(&(i as i128)),
                _ => v.is_finite() && v >= lo as f64 && v <= hi as f64,
            }
        }
    }, false);
    if fits {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "{what}: value {v} does not fit {dtype}"
        )))
    }
}

/// The value range of an integer dtype.
fn int_range(dtype: ScalarType) -> (i128, i128) {
    let bits = dtype.element_size() as u32 * 8;
    let signed = !matches!(
        dtype,
        ScalarType::Byte | ScalarType::UInt16 | ScalarType::UInt32 | ScalarType::UInt64
    );
    if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

fn scatter_value(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ScatterValueArgs {
        input,
        dim,
        index,
        value,
        out,
    } = ScatterValueArgs::unpack(a)?;
    check_dtype(&input, "scatter.value")?;
    check_fits(value, input.dtype(), "scatter.value")?;
    let p = plan(ctx, "scatter.value", &input, dim, &index, None)?;
    let out = resize_out(a, &input, out)?;
    let osizes = nonempty_sizes(&out);
    with_elem!(input.dtype(), E => {
        let v: E = value.cast::<E>();
        let o = ctx.write::<E>(&out)?;
        o.copy_from_slice(ctx.read::<E>(&input)?);
        p.for_each(osizes, None, |oi, _| o[oi] = v);
        Ok(())
    }, Err(KernelError::UnsupportedDtype { dtype: input.dtype(), what: p.what }))
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::testing::{Harness, ravel, unravel};

    /// The scatter element by element; `add` for scatter_add.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        input: &[i32],
        sizes: &[usize],
        dim: usize,
        index: &[i64],
        isizes: &[usize],
        src: &[i32],
        ssizes: &[usize],
        add: bool,
    ) -> Vec<i32> {
        let mut out = input.to_vec();
        for (f, &v) in index.iter().enumerate() {
            let p = unravel(f, isizes);
            let mut q = p.clone();
            q[dim] = v as usize;
            let o = ravel(&q, sizes);
            let s = src[ravel(&p, ssizes)];
            out[o] = if add { out[o].wrapping_add(s) } else { s };
        }
        out
    }

    fn case() -> impl Strategy<Value = (Vec<usize>, usize, Vec<usize>, Vec<usize>, u64)> {
        prop::collection::vec(1usize..4, 1..4)
            .prop_flat_map(|sizes| {
                let r = sizes.len();
                (
                    Just(sizes),
                    0..r,
                    prop::collection::vec(0usize..4, r),
                    prop::collection::vec(0usize..2, r),
                    any::<u64>(),
                )
            })
            .prop_map(|(sizes, dim, iseed, extra, seed)| {
                // index no larger than self (but at dim, up to 3), src at least index.
                let isizes: Vec<usize> = (0..sizes.len())
                    .map(|d| {
                        if d == dim {
                            iseed[d] % 4
                        } else {
                            iseed[d] % (sizes[d] + 1)
                        }
                    })
                    .collect();
                let ssizes: Vec<usize> = isizes
                    .iter()
                    .zip(&extra)
                    .map(|(&i, &e)| (i + e).max(1))
                    .collect();
                (sizes, dim, isizes, ssizes, seed)
            })
    }

    proptest! {
        #[test]
        fn scatter_and_scatter_add_match_the_elementwise_rule(
            (sizes, dim, isizes, ssizes, seed) in case()
        ) {
            let n: usize = sizes.iter().product();
            let ni: usize = isizes.iter().product();
            let ns: usize = ssizes.iter().product();
            let input: Vec<i32> = (0..n as i32).map(|i| i * 10).collect();
            let src: Vec<i32> = (0..ns as i32).map(|i| -1 - i).collect();
            let mut state = seed | 1;
            let index: Vec<i64> = (0..ni).map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % sizes[dim] as u64) as i64
            }).collect();
            for (op, add) in [("aten::scatter.src_out", false), ("aten::scatter_add.out", true)] {
                let mut h = Harness::new();
                let x = h.tensor(&sizes, &input);
                let d = h.int(dim as i64 - sizes.len() as i64);
                let i = h.tensor(&isizes, &index);
                let s = h.tensor(&ssizes, &src);
                let out = h.out(ScalarType::Int, &sizes);
                h.call(op, &[x, d, i, s, out, out]).unwrap();
                let want = reference(&input, &sizes, dim, &index, &isizes, &src, &ssizes, add);
                prop_assert_eq!(h.read::<i32>(out), want);
            }
            // The value form writes one value at every indexed position.
            let mut h = Harness::new();
            let x = h.tensor(&sizes, &input);
            let d = h.int(dim as i64);
            let i = h.tensor(&isizes, &index);
            let v = h.int(7);
            let out = h.out(ScalarType::Int, &sizes);
            h.call("aten::scatter.value_out", &[x, d, i, v, out, out]).unwrap();
            let sevens = vec![7; ni.max(1)];
            let want = reference(&input, &sizes, dim, &index, &isizes, &sevens, &isizes, false);
            prop_assert_eq!(h.read::<i32>(out), want);
        }
    }

    #[test]
    fn scatter_add_rounds_half_and_saturates_bool() {
        let mut h = Harness::new();
        let x = h.tensor(&[2], &[true, false].map(|b| etch_base::Bool8(b as u8)));
        let src = h.tensor(
            &[3],
            &[true, true, false].map(|b| etch_base::Bool8(b as u8)),
        );
        let (zero, i) = (h.int(0), h.tensor(&[3], &[0i64, 0, 1]));
        let out = h.out(ScalarType::Bool, &[2]);
        h.call("aten::scatter_add.out", &[x, zero, i, src, out, out])
            .unwrap();
        assert_eq!(h.read::<u8>(out), vec![1, 0]);
        let f = [1.0f32, 1e-4].map(half::f16::from_f32);
        let x = h.tensor(&[2], &f);
        let src = h.tensor(&[3], &[half::f16::from_f32(1e-4); 3]);
        let out = h.out(ScalarType::Half, &[2]);
        h.call("aten::scatter_add.out", &[x, zero, i, src, out, out])
            .unwrap();
        // 1 + 1e-4 rounds back to 1 in f16, twice.
        let got: Vec<f32> = h
            .read::<half::f16>(out)
            .iter()
            .map(|v| v.to_f32())
            .collect();
        assert_eq!(got[0], 1.0);
    }

    #[test]
    fn scatter_refuses_bad_arguments() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 2], &[1i32, 2, 3, 4]);
        let src = h.tensor(&[2, 2], &[5i32, 6, 7, 8]);
        let zero = h.int(0);
        let out = h.out(ScalarType::Int, &[2, 2]);
        let op = "aten::scatter.src_out";
        // Out of range, negative, an i32 index, a rank mismatch, a larger index, a dim.
        for bad in [vec![2i64, 0], vec![-1, 0]] {
            let i = h.tensor(&[1, 2], &bad);
            assert!(h.call(op, &[x, zero, i, src, out, out]).is_err());
        }
        let i32_index = h.tensor(&[1, 2], &[0i32, 1]);
        assert!(h.call(op, &[x, zero, i32_index, src, out, out]).is_err());
        let flat = h.tensor(&[2], &[0i64, 1]);
        assert!(h.call(op, &[x, zero, flat, src, out, out]).is_err());
        let wide = h.tensor(&[1, 3], &[0i64, 1, 0]);
        assert!(h.call(op, &[x, zero, wide, src, out, out]).is_err());
        let i = h.tensor(&[1, 2], &[1i64, 0]);
        let two = h.int(2);
        assert!(h.call(op, &[x, two, i, src, out, out]).is_err());
        let fsrc = h.tensor(&[2, 2], &[0f32; 4]);
        assert!(h.call(op, &[x, zero, i, fsrc, out, out]).is_err());
        // A value that does not fit the dtype.
        let small = h.tensor(&[2], &[1i8, 2]);
        let (big, o8, i1) = (
            h.int(300),
            h.out(ScalarType::Char, &[2]),
            h.tensor(&[1], &[0i64]),
        );
        assert!(
            h.call("aten::scatter.value_out", &[small, zero, i1, big, o8, o8])
                .is_err()
        );
        h.call(op, &[x, zero, i, src, out, out]).unwrap();
        assert_eq!(h.read::<i32>(out), vec![1, 6, 5, 4]);
    }
}
