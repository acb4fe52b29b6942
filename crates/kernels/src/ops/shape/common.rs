//! Helpers shared by the shape, index, embedding and matmul kernels: dtype dispatch,
//! dtype casts, a strided gather-copy engine and row-parallel loops.

use bytemuck::Pod;
use etch_base::ScalarType;
use half::{bf16, f16};

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
        use etch_base::ScalarType as St;
        match $dtype {
            St::Float => {
                type $T = f32;
                $body
            }
            St::Double => {
                type $T = f64;
                $body
            }
            St::Half => {
                type $T = half::f16;
                $body
            }
            St::BFloat16 => {
                type $T = half::bf16;
                $body
            }
            St::Char => {
                type $T = i8;
                $body
            }
            St::Byte => {
                type $T = u8;
                $body
            }
            St::Short => {
                type $T = i16;
                $body
            }
            St::Int => {
                type $T = i32;
                $body
            }
            St::Long => {
                type $T = i64;
                $body
            }
            St::UInt16 => {
                type $T = u16;
                $body
            }
            St::UInt32 => {
                type $T = u32;
                $body
            }
            St::UInt64 => {
                type $T = u64;
                $body
            }
            St::Bool => {
                type $T = $crate::ops::shape::common::Bool8;
                $body
            }
            dtype => Err($crate::KernelError::UnsupportedDtype { dtype, what: $what }),
        }
    }};
}
pub(crate) use with_cast_type;

/// A numeric element that converts to and from other dtypes the way PyTorch casts:
/// floats round to nearest, floats to ints truncate toward zero, ints wrap, anything
/// to bool is `!= 0`, bool is 0 or 1.
pub(crate) trait CastElem: Pod + Send + Sync {
    /// True for floating-point types.
    const FLOAT: bool;
    /// The value as f64 (exact for every float type and for small ints).
    fn to_f64(self) -> f64;
    /// The value as i64 (floats truncate; u64 wraps).
    fn to_i64(self) -> i64;
    /// From an f64 (floats round, ints truncate, bool is `!= 0`).
    fn from_f64(v: f64) -> Self;
    /// From an i64 (ints wrap, floats round, bool is `!= 0`).
    fn from_i64(v: i64) -> Self;
    /// Casts from another element type.
    #[inline]
    fn cast_from<S: CastElem>(s: S) -> Self {
        if S::FLOAT {
            Self::from_f64(s.to_f64())
        } else {
            Self::from_i64(s.to_i64())
        }
    }
}

macro_rules! cast_int {
    ($($t:ty),*) => {$(
        impl CastElem for $t {
            const FLOAT: bool = false;
            #[inline]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline]
            fn from_f64(v: f64) -> Self { v as i64 as $t }
            #[inline]
            fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
cast_int!(i8, u8, i16, i32, i64, u16, u32, u64);

impl CastElem for f32 {
    const FLOAT: bool = true;
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
}

impl CastElem for f64 {
    const FLOAT: bool = true;
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
}

impl CastElem for f16 {
    const FLOAT: bool = true;
    #[inline]
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    #[inline]
    fn to_i64(self) -> i64 {
        f16::to_f32(self) as i64
    }
    #[inline]
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    #[inline]
    fn from_i64(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
}

impl CastElem for bf16 {
    const FLOAT: bool = true;
    #[inline]
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    #[inline]
    fn to_i64(self) -> i64 {
        bf16::to_f32(self) as i64
    }
    #[inline]
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    #[inline]
    fn from_i64(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
}

impl CastElem for Bool8 {
    const FLOAT: bool = false;
    #[inline]
    fn to_f64(self) -> f64 {
        (self.0 != 0) as u8 as f64
    }
    #[inline]
    fn to_i64(self) -> i64 {
        (self.0 != 0) as i64
    }
    #[inline]
    fn from_f64(v: f64) -> Self {
        Bool8((v != 0.0) as u8)
    }
    #[inline]
    fn from_i64(v: i64) -> Self {
        Bool8((v != 0) as u8)
    }
}

/// PyTorch's `canCast(from, to)`: no float to integral, no non-bool to bool.
pub(crate) fn can_cast(from: ScalarType, to: ScalarType) -> bool {
    if from.is_floating_point() && to.is_integral() {
        return false;
    }
    !(from != ScalarType::Bool && to == ScalarType::Bool)
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
    let numel = layout.numel()?;
    if dst.len() < numel {
        return Err(KernelError::invalid(format!(
            "copy of {numel} elements into {} elements",
            dst.len()
        )));
    }
    if numel == 0 {
        return Ok(());
    }
    let extent = layout.extent()?;
    if offset.checked_add(extent).is_none_or(|end| end > src.len()) {
        return Err(KernelError::invalid(format!(
            "copy reads elements {offset}..{offset}+{extent} of {}",
            src.len()
        )));
    }
    let c = layout.coalesced();
    let rank = c.rank;
    let inner = c.sizes[rank - 1];
    let inner_stride = c.strides[rank - 1];
    let rows = numel / inner;
    let dst = &mut dst[..numel];
    let run = |first_row: usize, chunk: &mut [T]| {
        // Multi-index of `first_row` over the outer dims.
        let mut idx = [0usize; MAX_DIMS];
        let mut r = first_row;
        let mut base = offset;
        for d in (0..rank - 1).rev() {
            idx[d] = r % c.sizes[d];
            r /= c.sizes[d];
            base += idx[d] * c.strides[d];
        }
        for row in chunk.chunks_exact_mut(inner) {
            copy_row(row, src, base, inner_stride);
            // Advance the odometer.
            for d in (0..rank - 1).rev() {
                idx[d] += 1;
                base += c.strides[d];
                if idx[d] < c.sizes[d] {
                    break;
                }
                base -= c.strides[d] * c.sizes[d];
                idx[d] = 0;
            }
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

/// Like [`gather_copy`] but converting each element from `S` to `D`.
pub(crate) fn gather_cast<S: CastElem, D: CastElem>(
    dst: &mut [D],
    src: &[S],
    offset: usize,
    layout: &Strided,
) -> Result<(), KernelError> {
    let numel = layout.numel()?;
    if dst.len() < numel {
        return Err(KernelError::invalid(format!(
            "copy of {numel} elements into {} elements",
            dst.len()
        )));
    }
    if numel == 0 {
        return Ok(());
    }
    let extent = layout.extent()?;
    if offset.checked_add(extent).is_none_or(|end| end > src.len()) {
        return Err(KernelError::invalid(format!(
            "copy reads elements {offset}..{offset}+{extent} of {}",
            src.len()
        )));
    }
    let c = layout.coalesced();
    let rank = c.rank;
    let inner = c.sizes[rank - 1];
    let s = c.strides[rank - 1];
    let mut idx = [0usize; MAX_DIMS];
    let mut base = offset;
    for row in dst[..numel].chunks_exact_mut(inner) {
        for (j, d) in row.iter_mut().enumerate() {
            *d = D::cast_from(src[base + j * s]);
        }
        for d in (0..rank - 1).rev() {
            idx[d] += 1;
            base += c.strides[d];
            if idx[d] < c.sizes[d] {
                break;
            }
            base -= c.strides[d] * c.sizes[d];
            idx[d] = 0;
        }
    }
    Ok(())
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
            gather_cast::<S, D>(d, s, offset, layout)
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
    if sizes.len() > target.len() || target.len() > MAX_DIMS {
        return Err(KernelError::invalid(format!(
            "cannot broadcast shape {sizes:?} to {target:?}"
        )));
    }
    let lead = target.len() - sizes.len();
    for (d, &t) in target.iter().enumerate() {
        buf[d] = if d < lead {
            0
        } else {
            let s = sizes[d - lead];
            if s == t {
                if s == 1 { 0 } else { strides[d - lead] }
            } else if s == 1 {
                0
            } else {
                return Err(KernelError::invalid(format!(
                    "cannot broadcast shape {sizes:?} to {target:?}"
                )));
            }
        };
    }
    Ok(&buf[..target.len()])
}

/// Broadcast shape of two shapes (PyTorch rules) into `buf`.
pub(crate) fn broadcast_shapes<'b>(
    a: &[usize],
    b: &[usize],
    buf: &'b mut [usize; MAX_RANK],
) -> Result<&'b [usize], KernelError> {
    let rank = a.len().max(b.len());
    if rank > MAX_RANK {
        return Err(KernelError::invalid("broadcast rank exceeds the limit"));
    }
    for d in 0..rank {
        let x = if d + a.len() >= rank {
            a[d + a.len() - rank]
        } else {
            1
        };
        let y = if d + b.len() >= rank {
            b[d + b.len() - rank]
        } else {
            1
        };
        buf[d] = if x == y || y == 1 {
            x
        } else if x == 1 {
            y
        } else {
            return Err(KernelError::invalid(format!(
                "shapes {a:?} and {b:?} do not broadcast"
            )));
        };
    }
    Ok(&buf[..rank])
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

    #[test]
    fn casts_follow_pytorch() {
        assert_eq!(i8::cast_from(300i64), 44);
        assert_eq!(i32::cast_from(-2.7f32), -2);
        assert_eq!(Bool8::cast_from(0.5f32), Bool8(1));
        assert_eq!(f32::cast_from(Bool8(1)), 1.0);
        assert_eq!(f16::cast_from(1.5f64), f16::from_f32(1.5));
        assert!(can_cast(ScalarType::Long, ScalarType::Float));
        assert!(!can_cast(ScalarType::Float, ScalarType::Long));
        assert!(!can_cast(ScalarType::Long, ScalarType::Bool));
    }
}
