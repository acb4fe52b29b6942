//! Helpers shared by the shape, index, embedding and matmul kernels: dtype dispatch,
//! dtype casts, row-major multi-index stepping, a strided gather-copy engine and
//! row-parallel loops.

use std::array;

use bytemuck::Pod;
use etch_base::{Element, cast, cast_slice};

use crate::{GRAIN_SIZE, KernelContext, KernelError, MAX_RANK, Tensor, ThreadPool};

/// Most dimensions the copy engine handles (twice [`MAX_RANK`], for `repeat`).
pub(crate) const MAX_DIMS: usize = 2 * MAX_RANK;

pub(crate) use etch_base::Bool8;

/// Fails unless the tensor's dim order is the contiguous one.
pub(crate) fn require_contiguous(t: &Tensor, what: &'static str) -> Result<(), KernelError> {
    if t.is_contiguous() {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "{what}: non-contiguous dim order {:?} is not supported",
            t.dim_order()
        )))
    }
}

/// Checks the two ends of a byte copy: the same dtype, both contiguous.
pub(crate) fn require_copy_pair(input: &Tensor, out: &Tensor) -> Result<(), KernelError> {
    crate::ops::same_dtype(input, out)?;
    require_contiguous(input, "input")?;
    require_contiguous(out, "out")
}

/// The dim `dim` of `input`, a negative dim counting from the end. An op that works
/// along one dim has nothing to work on in a 0-d tensor, so one is refused with
/// `zero_d_error` (which names the op) before the dim is read.
pub(crate) fn dim_of_non_scalar(
    input: &Tensor,
    dim: i64,
    zero_d_error: &'static str,
) -> Result<usize, KernelError> {
    if input.rank() == 0 {
        return Err(KernelError::invalid(zero_d_error));
    }
    Ok(input.normalize_dim(dim)?)
}

/// Views bytes as a mutable slice of `T` (fails when misaligned or ragged).
pub(crate) fn typed_mut<T: Pod>(bytes: &mut [u8]) -> Result<&mut [T], KernelError> {
    bytemuck::try_cast_slice_mut(bytes)
        .map_err(|e| KernelError::invalid(format!("tensor bytes as elements: {e:?}")))
}

/// Product of `sizes`, failing on overflow.
pub(crate) fn checked_numel(sizes: &[usize]) -> Result<usize, KernelError> {
    sizes
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| KernelError::invalid(format!("shape {sizes:?} overflows")))
}

/// Runs `$body` with `$T` bound to the storage type of a dtype of element size 1, 2, 4
/// or 8 bytes (`u8`, `u16`, `u32`, `u64`): for kernels that only move bytes.
macro_rules! with_bits_type {
    ($size:expr, $T:ident => $body:expr) => {
        match $size {
            1 => {
                type $T = u8;
                $body
            }
            2 => {
                type $T = u16;
                $body
            }
            4 => {
                type $T = u32;
                $body
            }
            8 => {
                type $T = u64;
                $body
            }
            other => Err($crate::KernelError::invalid(format!(
                "unsupported element size {other}"
            ))),
        }
    };
}
pub(crate) use with_bits_type;

/// Runs `$body` with `$T` bound to the Rust type of a numeric dtype (bool as
/// [`Bool8`]); other dtypes give `UnsupportedDtype` for `$what`.
macro_rules! with_cast_type {
    ($dtype:expr, $what:expr, $T:ident => $body:expr) => {{
        let dtype: $crate::ScalarType = $dtype;
        $crate::ops::elementwise::dtype::with_elem!(dtype, $T => $body,
            Err($crate::KernelError::UnsupportedDtype { dtype, what: $what }))
    }};
}
pub(crate) use with_cast_type;

pub(crate) use etch_base::can_cast;

/// The offset, through `strides`, of the element at row-major position `i` over `sizes`
/// (the last dim fastest).
#[inline]
pub(crate) fn strided_offset(mut i: usize, sizes: &[usize], strides: &[usize]) -> usize {
    let mut off = 0;
    for d in (0..sizes.len()).rev() {
        off += (i % sizes[d]) * strides[d];
        i /= sizes[d];
    }
    off
}

/// Steps the row-major multi-index `idx` over `sizes` (the last dim fastest) to the
/// next position. Returns false, with `idx` back at all zeros, when it was the last.
#[inline(always)]
pub(crate) fn advance_index(idx: &mut [usize], sizes: &[usize]) -> bool {
    advance_index_with_offsets(idx, sizes, [], &mut [])
}

/// [`advance_index`] that keeps `offsets[k]`, the offset of `idx` through
/// `strides[k]`, in step: a dim that carries over takes its whole extent back off.
/// `sizes` and every `strides[k]` have at least `idx.len()` dims.
#[inline(always)]
pub(crate) fn advance_index_with_offsets<const N: usize>(
    idx: &mut [usize],
    sizes: &[usize],
    strides: [&[usize]; N],
    offsets: &mut [usize; N],
) -> bool {
    for d in (0..idx.len()).rev() {
        idx[d] += 1;
        for (o, s) in offsets.iter_mut().zip(&strides) {
            *o += s[d];
        }
        if idx[d] < sizes[d] {
            return true;
        }
        for (o, s) in offsets.iter_mut().zip(&strides) {
            *o -= s[d] * sizes[d];
        }
        idx[d] = 0;
    }
    false
}

/// A source layout for the copy engine: sizes of the (contiguous) destination and the
/// source's element strides for each of its dims. A stride of 0 broadcasts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided {
    rank: usize,
    sizes: [usize; MAX_DIMS],
    strides: [usize; MAX_DIMS],
}

impl Strided {
    /// A layout from sizes and strides of equal length (at most [`MAX_DIMS`]).
    pub(crate) fn new(sizes: &[usize], strides: &[usize]) -> Result<Self, KernelError> {
        if sizes.len() != strides.len() || sizes.len() > MAX_DIMS {
            return Err(KernelError::invalid(format!(
                "copy layout of {} sizes and {} strides",
                sizes.len(),
                strides.len()
            )));
        }
        let mut s = Strided {
            rank: sizes.len(),
            sizes: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        s.sizes[..s.rank].copy_from_slice(sizes);
        s.strides[..s.rank].copy_from_slice(strides);
        Ok(s)
    }

    /// Sizes.
    pub(crate) fn sizes(&self) -> &[usize] {
        &self.sizes[..self.rank]
    }

    /// Elements described.
    pub(crate) fn numel(&self) -> Result<usize, KernelError> {
        checked_numel(self.sizes())
    }

    /// One past the largest source offset reached (0 when empty).
    pub(crate) fn extent(&self) -> Result<usize, KernelError> {
        let mut last = 0usize;
        for d in 0..self.rank {
            if self.sizes[d] == 0 {
                return Ok(0);
            }
            last = (self.sizes[d] - 1)
                .checked_mul(self.strides[d])
                .and_then(|x| x.checked_add(last))
                .ok_or_else(|| KernelError::invalid("copy layout overflows"))?;
        }
        Ok(last + 1)
    }

    /// The same layout with size-1 dims dropped and mergeable neighbours merged
    /// (the result always has at least one dim).
    pub(crate) fn coalesced(&self) -> Self {
        let mut out = Strided {
            rank: 0,
            sizes: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        for d in 0..self.rank {
            let (size, stride) = (self.sizes[d], self.strides[d]);
            if size == 1 {
                continue;
            }
            if out.rank > 0 {
                let last = out.rank - 1;
                if out.strides[last] == stride.wrapping_mul(size) {
                    out.sizes[last] *= size;
                    out.strides[last] = stride;
                    continue;
                }
            }
            out.sizes[out.rank] = size;
            out.strides[out.rank] = stride;
            out.rank += 1;
        }
        if self.sizes().contains(&0) {
            out.rank = 1;
            out.sizes[0] = 0;
            out.strides[0] = 1;
        } else if out.rank == 0 {
            out.rank = 1;
            out.sizes[0] = 1;
            out.strides[0] = 1;
        }
        out
    }
}

/// Rows per task as upstream's `parallel_for` splits `rows` with `grain`.
fn rows_per_task(pool: &ThreadPool, rows: usize, grain: usize) -> usize {
    grain.max(1).max(rows.div_ceil(pool.threads().max(1)))
}

/// Runs `f(first_row, chunk)` over `rows` consecutive rows of `row_len` elements of
/// `out`, splitting the rows over the pool the way upstream's `parallel_for(0, rows,
/// grain)` does when `parallel` is true, serially otherwise.
pub(crate) fn for_rows<T, F>(
    pool: &ThreadPool,
    out: &mut [T],
    row_len: usize,
    rows: usize,
    grain: usize,
    parallel: bool,
    f: F,
) where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    let total = rows.saturating_mul(row_len).min(out.len());
    let out = &mut out[..total];
    if row_len == 0 || rows == 0 {
        return;
    }
    if !parallel || pool.threads() <= 1 || rows < 2 {
        f(0, out);
        return;
    }
    let per = rows_per_task(pool, rows, grain);
    pool.for_each_chunk_mut(out, per * row_len, 1, |i, chunk| f(i * per, chunk));
}

/// Upstream's rule for a row-parallel copy: at least 8 rows and [`GRAIN_SIZE`] elements.
pub(crate) fn worth_parallel(rows: usize, total: usize) -> bool {
    rows >= 8 && total >= GRAIN_SIZE
}

/// Checks that a destination of `dst_len` elements holds `layout`'s elements and
/// that a source of `src_len` elements holds them read from `offset`; returns their
/// count (the source is not checked when there are none).
fn check_gather(
    dst_len: usize,
    src_len: usize,
    offset: usize,
    layout: &Strided,
) -> Result<usize, KernelError> {
    let numel = layout.numel()?;
    if dst_len < numel {
        return Err(KernelError::invalid(format!(
            "copy of {numel} elements into {dst_len} elements"
        )));
    }
    if numel == 0 {
        return Ok(0);
    }
    let extent = layout.extent()?;
    if offset.checked_add(extent).is_none_or(|end| end > src_len) {
        return Err(KernelError::invalid(format!(
            "copy reads elements {offset}..{offset}+{extent} of {src_len}"
        )));
    }
    Ok(numel)
}

/// Copies `src` laid out as `layout` (from element `offset`) into the first
/// `layout.numel()` elements of `dst`, in row-major order of `layout`'s sizes.
/// Checks every bound first; runs on the pool for large copies.
pub(crate) fn gather_copy<T: Copy + Send + Sync>(
    pool: &ThreadPool,
    dst: &mut [T],
    src: &[T],
    offset: usize,
    layout: &Strided,
) -> Result<(), KernelError> {
    gather_rows(pool, dst, src, offset, layout, copy_row)
}

/// The engine of [`gather_copy`] and [`copy_tensor_cast`]: `row_op(row, src, base,
/// stride)` fills one innermost row from `src[base]`, `src[base + stride]`, ...
#[inline(always)]
fn gather_rows<S: Sync, D: Send>(
    pool: &ThreadPool,
    dst: &mut [D],
    src: &[S],
    offset: usize,
    layout: &Strided,
    row_op: impl Fn(&mut [D], &[S], usize, usize) + Sync,
) -> Result<(), KernelError> {
    let numel = check_gather(dst.len(), src.len(), offset, layout)?;
    if numel == 0 {
        return Ok(());
    }
    let c = layout.coalesced();
    let rank = c.rank;
    let inner = c.sizes[rank - 1];
    let inner_stride = c.strides[rank - 1];
    let rows = numel / inner;
    let dst = &mut dst[..numel];
    let outer = rank - 1;
    let run = |first_row: usize, chunk: &mut [D]| {
        // Multi-index of `first_row` over the outer dims.
        let mut idx = [0usize; MAX_DIMS];
        let mut r = first_row;
        let mut base = offset;
        for d in (0..outer).rev() {
            idx[d] = r % c.sizes[d];
            r /= c.sizes[d];
            base += idx[d] * c.strides[d];
        }
        for row in chunk.chunks_exact_mut(inner) {
            row_op(row, src, base, inner_stride);
            advance_index_with_offsets(
                &mut idx[..outer],
                &c.sizes,
                [&c.strides],
                array::from_mut(&mut base),
            );
        }
    };
    for_rows(
        pool,
        dst,
        inner,
        rows,
        GRAIN_SIZE.div_ceil(inner).max(1),
        numel >= GRAIN_SIZE,
        run,
    );
    Ok(())
}

#[inline]
fn copy_row<T: Copy>(row: &mut [T], src: &[T], base: usize, stride: usize) {
    match stride {
        1 => row.copy_from_slice(&src[base..base + row.len()]),
        0 => row.fill(src[base]),
        s => {
            for (j, d) in row.iter_mut().enumerate() {
                *d = src[base + j * s];
            }
        }
    }
}

/// Copies the bytes of `src` seen through `layout` into `out` (same element size),
/// dispatching on the element size.
pub(crate) fn copy_tensor(
    ctx: &KernelContext<'_>,
    src: &Tensor,
    out: &Tensor,
    offset: usize,
    layout: &Strided,
) -> Result<(), KernelError> {
    if src.dtype().element_size() != out.dtype().element_size() {
        return Err(KernelError::DtypeMismatch {
            expected: out.dtype(),
            found: src.dtype(),
        });
    }
    if layout.numel()? == 0 {
        return Ok(());
    }
    with_bits_type!(src.dtype().element_size(), T => {
        let s = ctx.read_raw::<T>(src)?;
        let d = ctx.write_raw::<T>(out)?;
        gather_copy(ctx.pool(), d, s, offset, layout)
    })
}

#[inline]
fn cast_row<S: Element, D: Element>(row: &mut [D], src: &[S], base: usize, stride: usize) {
    if stride == 1 {
        cast_slice(&src[base..base + row.len()], row);
    } else {
        for (j, d) in row.iter_mut().enumerate() {
            *d = cast(src[base + j * stride]);
        }
    }
}

/// Copies `src` through `layout` into `out`, casting to `out`'s dtype when it differs.
pub(crate) fn copy_tensor_cast(
    ctx: &KernelContext<'_>,
    src: &Tensor,
    out: &Tensor,
    offset: usize,
    layout: &Strided,
    what: &'static str,
) -> Result<(), KernelError> {
    if src.dtype() == out.dtype() {
        return copy_tensor(ctx, src, out, offset, layout);
    }
    if layout.numel()? == 0 {
        return Ok(());
    }
    with_cast_type!(src.dtype(), what, S => {
        with_cast_type!(out.dtype(), what, D => {
            let s = ctx.read_raw::<S>(src)?;
            let d = ctx.write_raw::<D>(out)?;
            gather_rows(ctx.pool(), d, s, offset, layout, cast_row::<S, D>)
        })
    })
}

/// Strides that broadcast a tensor of `sizes`/`strides` to `target` (right-aligned,
/// PyTorch rules), into `buf`.
pub(crate) fn broadcast_strides<'b>(
    sizes: &[usize],
    strides: &[usize],
    target: &[usize],
    buf: &'b mut [usize; MAX_DIMS],
) -> Result<&'b [usize], KernelError> {
    etch_base::broadcast_strides(sizes, strides, target, buf).ok_or_else(|| {
        KernelError::invalid(format!("cannot broadcast shape {sizes:?} to {target:?}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_merges_and_drops() {
        let s = Strided::new(&[2, 1, 3, 4], &[12, 99, 4, 1])
            .unwrap()
            .coalesced();
        assert_eq!(s.sizes(), &[24]);
        assert_eq!(&s.strides[..s.rank], &[1]);
        let s = Strided::new(&[2, 3], &[1, 2]).unwrap().coalesced();
        assert_eq!(s.sizes(), &[2, 3]);
        let s = Strided::new(&[1, 1], &[0, 0]).unwrap().coalesced();
        assert_eq!(s.sizes(), &[1]);
        let s = Strided::new(&[3, 0], &[1, 1]).unwrap().coalesced();
        assert_eq!(s.sizes(), &[0]);
    }

    #[test]
    fn advance_index_walks_row_major_and_wraps() {
        let sizes = [2usize, 3];
        let (mut idx, mut at) = ([0usize; 2], [0usize; 2]);
        let mut seen = vec![(idx, at)];
        while advance_index_with_offsets(&mut idx, &sizes, [&[3, 1], &[1, 2]], &mut at) {
            seen.push((idx, at));
        }
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[4], ([1, 1], [4, 3]));
        assert_eq!((idx, at), ([0, 0], [0, 0]));
        assert!(advance_index(&mut idx[..1], &sizes));
        assert!(!advance_index(&mut idx[..1], &sizes));
    }

    #[test]
    fn gather_transposes_and_checks_bounds() {
        let pool = ThreadPool::serial();
        let src: Vec<u32> = (0..6).collect();
        let mut dst = [0u32; 6];
        let l = Strided::new(&[3, 2], &[1, 3]).unwrap();
        gather_copy(&pool, &mut dst, &src, 0, &l).unwrap();
        assert_eq!(dst, [0, 3, 1, 4, 2, 5]);
        assert!(gather_copy(&pool, &mut dst, &src, 1, &l).is_err());
        let mut small = [0u32; 5];
        assert!(gather_copy(&pool, &mut small, &src, 0, &l).is_err());
    }

    #[test]
    fn gather_parallel_matches_serial() {
        let pool = ThreadPool::new(2).unwrap();
        let src: Vec<u32> = (0..70_000).collect();
        let l = Strided::new(&[350, 200], &[1, 350]).unwrap();
        let mut a = vec![0u32; 70_000];
        let mut b = vec![0u32; 70_000];
        gather_copy(&pool, &mut a, &src, 0, &l).unwrap();
        gather_copy(&ThreadPool::serial(), &mut b, &src, 0, &l).unwrap();
        assert_eq!(a, b);
        assert_eq!(a[1], 350);
    }
}
