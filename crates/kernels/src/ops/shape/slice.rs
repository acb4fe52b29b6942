//! `slice_copy.Tensor_out`, `narrow_copy.out`, `select_copy.int_out`, and the
//! inverses of a slice and a select, `slice_scatter.out` and `select_scatter.out`.
//!
//! Both copy, for every "leading" index (the dims before `dim`), `length` blocks of
//! `trailing` elements (the dims after `dim`) picked `step` apart along `dim`. As
//! upstream, the copy runs on the pool when there are at least 8 leading rows and
//! [`crate::GRAIN_SIZE`] elements, in chunks of at least 8 rows, and a step of 1 copies
//! each leading row with one `memcpy`.

use crate::ops::same_dtype;
use crate::ops::shape::common::{
    dim_of_non_scalar, for_rows, require_copy_pair, with_bits_type, worth_parallel,
};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::slice_copy.Tensor_out", slice_copy);
    r.register("aten::narrow_copy.out", narrow_copy);
    r.register("aten::select_copy.int_out", select_copy);
    r.register("aten::slice_scatter.out", slice_scatter);
    r.register("aten::select_scatter.out", select_scatter);
}

/// Upstream's `adjust_slice_indices`: wraps negative indices, clamps to `[0, size]`
/// and returns `(start, length)`.
pub(crate) fn adjust_slice(size: usize, start: i64, end: i64, step: i64) -> (usize, usize) {
    let n = size as i64;
    let wrap = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
    let start = wrap(start).clamp(0, n);
    let end = wrap(end).clamp(0, n);
    let length = if start >= n || end <= 0 || start >= end {
        0
    } else {
        (end - 1 - start) / step + 1
    };
    (start as usize, length as usize)
}

/// A slice of one dim: `length` indices from `start`, `step` apart.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DimSlice {
    pub dim: usize,
    pub start: usize,
    pub length: usize,
    pub step: usize,
}

impl DimSlice {
    /// `length` consecutive indices of dim `dim` from `start`: what `narrow` and each
    /// piece of a split take.
    pub(crate) fn contiguous(dim: usize, start: usize, length: usize) -> Self {
        DimSlice {
            dim,
            start,
            length,
            step: 1,
        }
    }

    /// Python's `[start:end:step]` on dim `dim` (already normalized) of `size`
    /// indices, as `slice_copy` and `slice_scatter` take it: a missing start is 0, a
    /// missing end is `size`, and out-of-range bounds are clamped by
    /// [`adjust_slice`]. A step below 1 is refused, with `op` naming the op.
    fn python_range(
        dim: usize,
        size: usize,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
        op: &str,
    ) -> Result<Self, KernelError> {
        if step <= 0 {
            return Err(KernelError::invalid(format!(
                "{op} step must be positive, got {step}"
            )));
        }
        let (start, length) =
            adjust_slice(size, start.unwrap_or(0), end.unwrap_or(size as i64), step);
        Ok(DimSlice {
            dim,
            start,
            length,
            step: step as usize,
        })
    }

    /// The one index `index` of dim `dim` (already normalized) of `size` indices, as
    /// `select_copy` and `select_scatter` take it: a negative index counts from the
    /// end, and one out of range is refused, with `op` naming the op.
    fn single_index(dim: usize, size: usize, index: i64, op: &str) -> Result<Self, KernelError> {
        let i = if index < 0 {
            index.saturating_add(size as i64)
        } else {
            index
        };
        if i < 0 || i >= size as i64 {
            return Err(KernelError::invalid(format!(
                "{op} index {index} out of range for a dim of size {size}"
            )));
        }
        Ok(DimSlice::contiguous(dim, i as usize, 1))
    }
}

/// `sizes` with dim `dim` set to `length`: the shape of a slice of `dim`. The first
/// `sizes.len()` entries are used.
pub(crate) fn with_dim_length(sizes: &[usize], dim: usize, length: usize) -> [usize; MAX_RANK] {
    let mut out = [0usize; MAX_RANK];
    out[..sizes.len()].copy_from_slice(sizes);
    out[dim] = length;
    out
}

/// `sizes` without dim `dim`: the shape of a selection on `dim`. The first
/// `sizes.len() - 1` entries are used.
fn without_dim(sizes: &[usize], dim: usize) -> [usize; MAX_RANK] {
    let mut out = [0usize; MAX_RANK];
    out[..dim].copy_from_slice(&sizes[..dim]);
    out[dim..sizes.len() - 1].copy_from_slice(&sizes[dim + 1..]);
    out
}

/// Resizes `out` to `out_sizes` (it must have `input`'s dtype) and copies the slice
/// `s` of `input` into it.
fn slice_into(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    out: OutArg,
    out_sizes: &[usize],
    s: DimSlice,
) -> Result<(), KernelError> {
    same_dtype(input, &out.tensor())?;
    let out = out.resize(a, out_sizes)?;
    copy_slice(ctx, input, &out, s)
}

/// Copies the slice `s` of `input` into `out` (already resized; same element size),
/// checking every bound.
pub(crate) fn copy_slice(
    ctx: &KernelContext<'_>,
    input: &Tensor,
    out: &Tensor,
    s: DimSlice,
) -> Result<(), KernelError> {
    require_copy_pair(input, out)?;
    let sizes = input.sizes();
    let size = *sizes.get(s.dim).ok_or_else(|| {
        KernelError::invalid(format!("slice dim {} of rank {}", s.dim, sizes.len()))
    })?;
    let leading: usize = sizes[..s.dim].iter().product();
    let trailing: usize = sizes[s.dim + 1..].iter().product();
    let total = leading * s.length * trailing;
    if out.numel() != total {
        return Err(KernelError::invalid(format!(
            "slice of {total} elements into an out tensor of {}",
            out.numel()
        )));
    }
    if total == 0 {
        return Ok(());
    }
    let last = s.start + (s.length - 1) * s.step;
    if last >= size {
        return Err(KernelError::invalid(format!(
            "slice index {last} out of range for size {size}"
        )));
    }
    with_bits_type!(input.dtype().element_size(), T => {
        let src = ctx.read_raw::<T>(input)?;
        let dst = ctx.write_raw::<T>(out)?;
        slice_rows(ctx, src, dst, leading, size, trailing, s);
        Ok(())
    })
}

/// The copy itself; `src` is `[leading, size, trailing]`, `dst` is
/// `[leading, s.length, trailing]`, all bounds already checked.
fn slice_rows<T: Copy + Send + Sync>(
    ctx: &KernelContext<'_>,
    src: &[T],
    dst: &mut [T],
    leading: usize,
    size: usize,
    trailing: usize,
    s: DimSlice,
) {
    let out_row = s.length * trailing;
    let in_row = size * trailing;
    let offset = s.start * trailing;
    let run = |first: usize, chunk: &mut [T]| {
        if out_row == 1 {
            // One element per leading row (e.g. one lane of a [.., 2] pair): a plain
            // strided gather, without per-row overhead.
            let src = &src[first * in_row + offset..];
            for (d, v) in chunk.iter_mut().zip(src.iter().step_by(in_row)) {
                *d = *v;
            }
            return;
        }
        for (i, row) in chunk.chunks_exact_mut(out_row).enumerate() {
            let base = (first + i) * in_row + offset;
            if s.step == 1 {
                row.copy_from_slice(&src[base..base + out_row]);
            } else if trailing == 1 {
                for (d, v) in row.iter_mut().zip(src[base..].iter().step_by(s.step)) {
                    *d = *v;
                }
            } else {
                for (j, d) in row.chunks_exact_mut(trailing).enumerate() {
                    let b = base + j * s.step * trailing;
                    d.copy_from_slice(&src[b..b + trailing]);
                }
            }
        }
    };
    let parallel = worth_parallel(leading, leading * out_row);
    for_rows(ctx.pool(), dst, out_row, leading, 8, parallel, run);
}

op_args! {
    /// `slice_copy.Tensor_out(Tensor self, int dim=0, SymInt? start=None,
    /// SymInt? end=None, SymInt step=1, *, Tensor(a!) out)`.
    struct SliceArgs = "aten::slice_copy.Tensor_out" {
        input: Tensor,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
        out: OutArg,
    } returns 1
}

fn slice_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SliceArgs {
        input,
        dim,
        start,
        end,
        step,
        out,
    } = SliceArgs::unpack(a)?;
    let dim = dim_of_non_scalar(&input, dim, "slice_copy of a 0-d tensor")?;
    let s = DimSlice::python_range(dim, input.sizes()[dim], start, end, step, "slice")?;
    let sizes = with_dim_length(input.sizes(), dim, s.length);
    slice_into(ctx, a, &input, out, &sizes[..input.rank()], s)
}

op_args! {
    /// `narrow_copy.out(Tensor self, int dim, SymInt start, SymInt length, *,
    /// Tensor(a!) out)`: `length` indices of `dim` from `start` (a negative start
    /// counts from the end); the range must lie inside the dim.
    struct NarrowArgs = "aten::narrow_copy.out" {
        input: Tensor,
        dim: i64,
        start: i64,
        length: i64,
        out: OutArg,
    } returns 1
}

fn narrow_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let NarrowArgs {
        input,
        dim,
        start,
        length,
        out,
    } = NarrowArgs::unpack(a)?;
    let dim = dim_of_non_scalar(&input, dim, "narrow_copy of a 0-d tensor")?;
    let size = input.sizes()[dim];
    let n = size as i64;
    let first = if start < 0 {
        start.saturating_add(n)
    } else {
        start
    };
    if !(0..=n).contains(&first) {
        return Err(KernelError::invalid(format!(
            "narrow_copy: start {start} out of range for a dim of size {size}"
        )));
    }
    if length < 0 || first.checked_add(length).is_none_or(|end| end > n) {
        return Err(KernelError::invalid(format!(
            "narrow_copy: start {start} with length {length} exceeds a dim of size {size}"
        )));
    }
    let sizes = with_dim_length(input.sizes(), dim, length as usize);
    let s = DimSlice::contiguous(dim, first as usize, length as usize);
    slice_into(ctx, a, &input, out, &sizes[..input.rank()], s)
}

op_args! {
    /// `select_copy.int_out(Tensor self, int dim, SymInt index, *, Tensor(a!) out)`.
    struct SelectArgs = "aten::select_copy.int_out" {
        input: Tensor,
        dim: i64,
        index: i64,
        out: OutArg,
    } returns 1
}

fn select_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SelectArgs {
        input,
        dim,
        index,
        out,
    } = SelectArgs::unpack(a)?;
    let dim = dim_of_non_scalar(&input, dim, "select_copy of a 0-d tensor")?;
    let s = DimSlice::single_index(dim, input.sizes()[dim], index, "select_copy")?;
    let sizes = without_dim(input.sizes(), dim);
    slice_into(ctx, a, &input, out, &sizes[..input.rank() - 1], s)
}

op_args! {
    /// `slice_scatter.out(Tensor self, Tensor src, int dim=0, SymInt? start=None,
    /// SymInt? end=None, SymInt step=1, *, Tensor(a!) out)`: `self` with the slice
    /// `[start:end:step]` of `dim` replaced by `src` (which has the slice's shape).
    struct SliceScatterArgs = "aten::slice_scatter.out" {
        input: Tensor,
        src: Tensor,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
        out: OutArg,
    } returns 1
}

fn slice_scatter(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SliceScatterArgs {
        input,
        src,
        dim,
        start,
        end,
        step,
        out,
    } = SliceScatterArgs::unpack(a)?;
    let dim = dim_of_non_scalar(&input, dim, "slice_scatter into a 0-d tensor")?;
    let s = DimSlice::python_range(dim, input.sizes()[dim], start, end, step, "slice_scatter")?;
    let want = with_dim_length(input.sizes(), dim, s.length);
    require_src_shape(&src, &want[..input.rank()], "slice_scatter", "slice")?;
    scatter_into_copy(ctx, a, &input, &src, out, s, "slice_scatter")
}

/// Refuses a scatter's `src` unless its shape is `want`, the shape of the part of
/// `input` it replaces; `op` names the op and `part` what it replaces ("slice" or
/// "selection") in the error.
fn require_src_shape(
    src: &Tensor,
    want: &[usize],
    op: &str,
    part: &str,
) -> Result<(), KernelError> {
    if src.sizes() != want {
        return Err(KernelError::invalid(format!(
            "{op}: src of shape {:?} for a {part} of shape {want:?}",
            src.sizes()
        )));
    }
    Ok(())
}

/// Writes `input` into `out` (resized to `input`'s shape) with the slice `s` replaced
/// by `src`, whose elements are in the slice's order (its shape already checked).
fn scatter_into_copy(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    src: &Tensor,
    out: OutArg,
    s: DimSlice,
    what: &str,
) -> Result<(), KernelError> {
    require_copy_pair(input, &out.tensor())?;
    require_copy_pair(input, src)?;
    let out = out.resize(a, input.sizes())?;
    require_copy_pair(input, &out)?;
    let numel = input.numel();
    if numel == 0 {
        return Ok(());
    }
    let size = input.sizes()[s.dim];
    if s.length > 0 && s.start + (s.length - 1) * s.step >= size {
        return Err(KernelError::invalid(format!(
            "{what}: slice from {} ({} x step {}) exceeds a dim of size {size}",
            s.start, s.length, s.step
        )));
    }
    let leading: usize = input.sizes()[..s.dim].iter().product();
    let trailing: usize = input.sizes()[s.dim + 1..].iter().product();
    with_bits_type!(input.dtype().element_size(), T => {
        let x = ctx.read_raw::<T>(input)?;
        let from_src = ctx.read_raw::<T>(src)?;
        let o = ctx.write_raw::<T>(&out)?;
        let block = s.length * trailing;
        if x.len() < numel || o.len() < numel || from_src.len() < leading * block {
            return Err(KernelError::invalid(format!("{what}: tensor storage is too small")));
        }
        o[..numel].copy_from_slice(&x[..numel]);
        for l in 0..leading {
            for j in 0..s.length {
                let at = (l * size + s.start + j * s.step) * trailing;
                let from = (l * s.length + j) * trailing;
                o[at..at + trailing].copy_from_slice(&from_src[from..from + trailing]);
            }
        }
        Ok(())
    })
}

op_args! {
    /// `select_scatter.out(Tensor self, Tensor src, int dim, SymInt index, *,
    /// Tensor(a!) out)`: `self` with index `index` of `dim` replaced by `src` (which
    /// has `self`'s shape without `dim`).
    struct SelectScatterArgs = "aten::select_scatter.out" {
        input: Tensor,
        src: Tensor,
        dim: i64,
        index: i64,
        out: OutArg,
    } returns 1
}

fn select_scatter(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SelectScatterArgs {
        input,
        src,
        dim,
        index,
        out,
    } = SelectScatterArgs::unpack(a)?;
    let dim = dim_of_non_scalar(&input, dim, "select_scatter into a 0-d tensor")?;
    let s = DimSlice::single_index(dim, input.sizes()[dim], index, "select_scatter")?;
    let want = without_dim(input.sizes(), dim);
    require_src_shape(
        &src,
        &want[..input.rank() - 1],
        "select_scatter",
        "selection",
    )?;
    scatter_into_copy(ctx, a, &input, &src, out, s, "select_scatter")
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use super::adjust_slice;
    use crate::ThreadPool;
    use crate::testing::Harness;

    /// Python's `range(size)[start:end:step]` for positive steps.
    fn python_slice(size: usize, start: Option<i64>, end: Option<i64>, step: i64) -> Vec<usize> {
        let n = size as i64;
        let norm = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
        let s = start.map(norm).unwrap_or(0);
        let e = end.map(norm).unwrap_or(n);
        let mut v = Vec::new();
        let mut i = s;
        while i < e {
            v.push(i as usize);
            i += step;
        }
        v
    }

    /// An optional int argument: the int, or None.
    fn opt_int(h: &mut Harness, v: Option<i64>) -> usize {
        match v {
            Some(v) => h.int(v),
            None => h.none(),
        }
    }

    /// Naive slice of a row-major tensor along `dim` at the given indices.
    fn reference(data: &[f32], sizes: &[usize], dim: usize, idx: &[usize]) -> Vec<f32> {
        let lead: usize = sizes[..dim].iter().product();
        let trail: usize = sizes[dim + 1..].iter().product();
        let mut out = Vec::new();
        for l in 0..lead {
            for &i in idx {
                for t in 0..trail {
                    out.push(data[(l * sizes[dim] + i) * trail + t]);
                }
            }
        }
        out
    }

    #[test]
    fn slice_scatter_cases_and_errors() {
        let sizes = [2usize, 5, 3];
        let data: Vec<f32> = (0..30).map(|i| i as f32).collect();
        let op = "aten::slice_scatter.out";
        for (dim, start, end, step) in [
            (1i64, Some(1i64), Some(5i64), 2i64),
            (-1, None, None, 1),
            (0, Some(-1), None, 3),
        ] {
            let d = dim.rem_euclid(3) as usize;
            let idx = python_slice(sizes[d], start, end, step);
            let mut src_sizes = sizes;
            src_sizes[d] = idx.len();
            let n: usize = src_sizes.iter().product();
            let src: Vec<f32> = (0..n).map(|i| -1.0 - i as f32).collect();
            // Reference: write src over the slice of a copy of data.
            let mut want = data.clone();
            let lead: usize = sizes[..d].iter().product();
            let trail: usize = sizes[d + 1..].iter().product();
            let mut k = 0;
            for l in 0..lead {
                for &i in &idx {
                    for t in 0..trail {
                        want[(l * sizes[d] + i) * trail + t] = src[k];
                        k += 1;
                    }
                }
            }
            let mut h = Harness::new();
            let x = h.tensor(&sizes, &data);
            let s = h.tensor(&src_sizes, &src);
            let dv = h.int(dim);
            let sv = opt_int(&mut h, start);
            let ev = opt_int(&mut h, end);
            let st = h.int(step);
            let out = h.out(ScalarType::Float, &sizes);
            h.call(op, &[x, s, dv, sv, ev, st, out, out]).unwrap();
            assert_eq!(h.read::<f32>(out), want, "{dim} {start:?} {end:?} {step}");
            // A src of the wrong shape and a zero step are refused.
            let bad = h.tensor(&sizes, &data);
            if idx.len() != sizes[d] {
                assert!(h.call(op, &[x, bad, dv, sv, ev, st, out, out]).is_err());
            }
            let zero = h.int(0);
            assert!(h.call(op, &[x, s, dv, sv, ev, zero, out, out]).is_err());
            let wrong = h.out(ScalarType::Int, &sizes);
            assert!(h.call(op, &[x, s, dv, sv, ev, st, wrong, wrong]).is_err());
        }
    }

    #[test]
    fn select_scatter_cases_and_errors() {
        let sizes = [2usize, 3, 4];
        let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let op = "aten::select_scatter.out";
        for (dim, index) in [(0i64, 1i64), (1, -1), (-1, 2), (2, 0), (-3, -2)] {
            let d = dim.rem_euclid(3) as usize;
            let i = index.rem_euclid(sizes[d] as i64) as usize;
            let src_sizes: Vec<usize> = (0..3).filter(|&k| k != d).map(|k| sizes[k]).collect();
            let n: usize = src_sizes.iter().product();
            let src: Vec<f32> = (0..n).map(|k| -1.0 - k as f32).collect();
            // Reference: element (a, b, c) of the result takes src where its index
            // along d is i, counting the src elements in row-major order.
            let mut want = data.clone();
            let mut k = 0;
            for (flat, w) in want.iter_mut().enumerate() {
                let coords = [flat / 12, flat / 4 % 3, flat % 4];
                if coords[d] == i {
                    *w = src[k];
                    k += 1;
                }
            }
            let mut h = Harness::new();
            let x = h.tensor(&sizes, &data);
            let s = h.tensor(&src_sizes, &src);
            let (dv, iv) = (h.int(dim), h.int(index));
            let out = h.out(ScalarType::Float, &sizes);
            h.call(op, &[x, s, dv, iv, out, out]).unwrap();
            assert_eq!(h.read::<f32>(out), want, "{dim} {index}");
        }
        let mut h = Harness::new();
        let x = h.tensor(&sizes, &data);
        let s = h.tensor(&[3, 4], &[0.0f32; 12]);
        let out = h.out(ScalarType::Float, &sizes);
        let zero = h.int(0);
        // An index or dim out of range, a src of the wrong shape or dtype are refused.
        for (dim, index) in [(0i64, 2i64), (0, -3), (3, 0), (-4, 0)] {
            let (dv, iv) = (h.int(dim), h.int(index));
            assert!(
                h.call(op, &[x, s, dv, iv, out, out]).is_err(),
                "{dim} {index}"
            );
        }
        let one = h.int(1);
        assert!(h.call(op, &[x, s, one, zero, out, out]).is_err());
        let ints = h.tensor(&[3, 4], &[0i32; 12]);
        assert!(h.call(op, &[x, ints, zero, zero, out, out]).is_err());
        let scalar = h.tensor(&[], &[1.0f32]);
        let sout = h.out(ScalarType::Float, &[]);
        assert!(
            h.call(op, &[scalar, scalar, zero, zero, sout, sout])
                .is_err()
        );
    }

    #[test]
    fn narrow_copy_cases_and_errors() {
        let sizes = [2usize, 5, 3];
        let data: Vec<f32> = (0..30).map(|i| i as f32).collect();
        let mut h = Harness::new();
        let x = h.tensor(&sizes, &data);
        let op = "aten::narrow_copy.out";
        for (dim, start, length, first) in
            [(1i64, 1i64, 3i64, 1usize), (-2, -4, 2, 1), (2, 3, 0, 3)]
        {
            let d = dim.rem_euclid(3) as usize;
            let mut want_sizes = sizes;
            want_sizes[d] = length as usize;
            let idx: Vec<usize> = (first..first + length as usize).collect();
            let want = reference(&data, &sizes, d, &idx);
            let out = h.out(ScalarType::Float, &want_sizes);
            let (dv, sv, lv) = (h.int(dim), h.int(start), h.int(length));
            h.call(op, &[x, dv, sv, lv, out, out]).unwrap();
            assert_eq!(h.read::<f32>(out), want, "{dim} {start} {length}");
        }
        let out = h.out(ScalarType::Float, &sizes);
        for (dim, start, length) in [
            (3i64, 0i64, 1i64),
            (1, 6, 0),
            (1, -6, 1),
            (1, 2, 4),
            (1, 0, -1),
            (1, i64::MAX, 1),
        ] {
            let (dv, sv, lv) = (h.int(dim), h.int(start), h.int(length));
            assert!(
                h.call(op, &[x, dv, sv, lv, out, out]).is_err(),
                "{dim} {start} {length}"
            );
        }
        let scalar = h.tensor(&[], &[1f32]);
        let (dv, sv, lv) = (h.int(0), h.int(0), h.int(1));
        assert!(h.call(op, &[scalar, dv, sv, lv, out, out]).is_err());
        let wrong = h.out(ScalarType::Int, &sizes);
        assert!(h.call(op, &[x, dv, sv, lv, wrong, wrong]).is_err());
    }

    fn call_slice(
        h: &mut Harness,
        x: usize,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
        bound: &[usize],
    ) -> Result<usize, crate::KernelError> {
        let d = h.int(dim);
        let s = opt_int(h, start);
        let e = opt_int(h, end);
        let st = h.int(step);
        let dtype = h.tensor_meta(x).dtype();
        let out = h.out(dtype, bound);
        h.call("aten::slice_copy.Tensor_out", &[x, d, s, e, st, out, out])?;
        Ok(out)
    }

    #[test]
    fn adjust_matches_python() {
        for size in 0..6usize {
            for start in -8i64..8 {
                for end in -8i64..8 {
                    for step in 1..4 {
                        let want = python_slice(size, Some(start), Some(end), step);
                        let (s, len) = adjust_slice(size, start, end, step);
                        assert_eq!(len, want.len(), "{size} {start} {end} {step}");
                        if len > 0 {
                            assert_eq!(s, want[0]);
                        }
                    }
                }
            }
        }
        assert_eq!(adjust_slice(5, 2, i64::MAX, 1), (2, 3));
        assert_eq!(adjust_slice(5, i64::MIN, 3, 1), (0, 3));
    }

    #[test]
    fn slice_rope_table_rows() {
        let mut h = Harness::new();
        let data: Vec<f32> = (0..64 * 4).map(|i| i as f32).collect();
        let x = h.tensor(&[64, 4], &data);
        let out = call_slice(&mut h, x, 0, Some(7), Some(10), 1, &[63, 4]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[3, 4]);
        assert_eq!(h.read::<f32>(out), data[28..40].to_vec());
    }

    #[test]
    fn slice_bad_calls() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &[0f32; 6]);
        assert!(call_slice(&mut h, x, 2, None, None, 1, &[2, 3]).is_err());
        assert!(call_slice(&mut h, x, 1, None, None, 0, &[2, 3]).is_err());
        assert!(call_slice(&mut h, x, 1, None, None, -1, &[2, 3]).is_err());
        let s = h.tensor(&[], &[0f32]);
        assert!(call_slice(&mut h, s, 0, None, None, 1, &[]).is_err());
        // Out too small for the slice.
        assert!(call_slice(&mut h, x, 1, None, None, 1, &[2, 2]).is_err());
        // Wrong out dtype.
        let d = h.int(0);
        let n = h.none();
        let st = h.int(1);
        let oi = h.out(ScalarType::Int, &[2, 3]);
        assert!(
            h.call("aten::slice_copy.Tensor_out", &[x, d, n, n, st, oi, oi])
                .is_err()
        );
        // Wrong arg count and kinds.
        assert!(
            h.call("aten::slice_copy.Tensor_out", &[x, d, n, n, st, oi])
                .is_err()
        );
        assert!(
            h.call("aten::slice_copy.Tensor_out", &[x, x, n, n, st, oi, oi])
                .is_err()
        );
    }

    #[test]
    fn select_copy_cases() {
        let mut h = Harness::new();
        let data: Vec<i64> = (0..24).collect();
        let x = h.tensor(&[2, 3, 4], &data);
        for (dim, index, want) in [
            (1i64, -1i64, vec![8i64, 9, 10, 11, 20, 21, 22, 23]),
            (0, 1, (12..24).collect()),
            (2, 0, vec![0, 4, 8, 12, 16, 20]),
        ] {
            let d = h.int(dim);
            let i = h.int(index);
            let out = h.out(ScalarType::Long, &[12, 2]);
            h.call("aten::select_copy.int_out", &[x, d, i, out, out])
                .unwrap();
            assert_eq!(h.read::<i64>(out), want);
        }
        // input_pos[0] into a 0-d tensor.
        let pos = h.tensor(&[1], &[7i64]);
        let d = h.int(0);
        let i = h.int(0);
        let o0 = h.out(ScalarType::Long, &[]);
        h.call("aten::select_copy.int_out", &[pos, d, i, o0, o0])
            .unwrap();
        assert_eq!(h.read::<i64>(o0), vec![7]);
        let bad = h.int(1);
        assert!(
            h.call("aten::select_copy.int_out", &[pos, d, bad, o0, o0])
                .is_err()
        );
        let bad = h.int(-2);
        assert!(
            h.call("aten::select_copy.int_out", &[pos, d, bad, o0, o0])
                .is_err()
        );
        let s = h.tensor(&[], &[1i64]);
        assert!(
            h.call("aten::select_copy.int_out", &[s, d, i, o0, o0])
                .is_err()
        );
        let bad_dim = h.int(1);
        assert!(
            h.call("aten::select_copy.int_out", &[pos, bad_dim, i, o0, o0])
                .is_err()
        );
    }

    #[test]
    fn parallel_slice_matches_serial() {
        // RoPE-like [1, 128, 9, 32, 2] sliced on the last dim, and a big row slice.
        for (sizes, dim, start, step) in [
            (vec![1usize, 128, 9, 32, 2], 4usize, 1i64, 2i64),
            (vec![1, 128, 9, 32, 2], 4, 0, 1),
            (vec![16, 4096], 1, 5, 3),
            (vec![64, 40, 16], 1, 3, 1),
            (vec![64, 40, 16], 1, 3, 4),
        ] {
            let n: usize = sizes.iter().product();
            let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let idx = python_slice(sizes[dim], Some(start), None, step);
            let want = reference(&data, &sizes, dim, &idx);
            for threads in [1, 2, 3] {
                let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
                let x = h.tensor(&sizes, &data);
                let out =
                    call_slice(&mut h, x, dim as i64, Some(start), None, step, &sizes).unwrap();
                assert_eq!(h.read::<f32>(out), want, "{sizes:?} {threads}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn slice_matches_python(
            sizes in proptest::collection::vec(0usize..5, 1..5),
            dim_pick in 0usize..8,
            start in proptest::option::of(-7i64..7),
            end in proptest::option::of(-7i64..7),
            step in 1i64..4,
            width in 0usize..3,
        ) {
            let dim = dim_pick % sizes.len();
            let n: usize = sizes.iter().product();
            let idx = python_slice(sizes[dim], start, end, step);
            let mut h = Harness::new();
            // Exercise 1, 2, 4 and 8-byte elements.
            let dtypes = [ScalarType::Float, ScalarType::Half, ScalarType::Char, ScalarType::Long];
            let dtype = dtypes[width % dtypes.len()];
            let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let want = reference(&data, &sizes, dim, &idx);
            let x = match dtype {
                ScalarType::Half => h.tensor(&sizes, &data.iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>()),
                ScalarType::Char => h.tensor(&sizes, &data.iter().map(|&v| v as i8).collect::<Vec<_>>()),
                ScalarType::Long => h.tensor(&sizes, &data.iter().map(|&v| v as i64).collect::<Vec<_>>()),
                _ => h.tensor(&sizes, &data),
            };
            let out = call_slice(&mut h, x, dim as i64 - sizes.len() as i64 * (dim_pick % 2) as i64, start, end, step, &sizes).unwrap();
            let mut want_sizes = sizes.clone();
            want_sizes[dim] = idx.len();
            prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), want_sizes.clone());
            let got: Vec<f32> = match dtype {
                ScalarType::Half => h.read::<half::f16>(out).iter().map(|v| v.to_f32()).collect(),
                ScalarType::Char => h.read::<i8>(out).iter().map(|&v| v as f32).collect(),
                ScalarType::Long => h.read::<i64>(out).iter().map(|&v| v as f32).collect(),
                _ => h.read::<f32>(out),
            };
            let want: Vec<f32> = match dtype {
                ScalarType::Char => want.iter().map(|&v| v as i8 as f32).collect(),
                ScalarType::Half => want.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
                _ => want,
            };
            prop_assert_eq!(got, want);
        }
    }
}
