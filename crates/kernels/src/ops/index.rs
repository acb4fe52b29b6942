//! Indexing kernels: `index_select`, advanced indexing (`index.Tensor`), its writing
//! twin (`index_put`, `index_put_`), `gather`, the in-place `copy_`, and (in
//! `index/scatter.rs`) `scatter` and `scatter_add`; `index/data_shaped.rs` holds the
//! ops whose output size depends on values (`nonzero`, `masked_select`,
//! `masked_scatter`, `repeat_interleave.Tensor`).
//!
//! Advanced indexing follows PyTorch: the index tensors (i64 or i32; bool or u8
//! masks stand for their nonzero coordinates) broadcast together to a shape `B`. When
//! the indexed dims are adjacent, `B` replaces them in place; otherwise it goes in
//! front. The result is `[P.., B.., Q..]`, where `P` and `Q` are the non-indexed dims
//! before and after. Negative indices count from the end.

use etch_base::ScalarType;
use half::{bf16, f16};

use super::same_dtype;
use crate::ops::elementwise::broadcast::broadcast_shapes;
use crate::ops::embedding::Indices;
use crate::ops::shape::common::{
    Bool8, MAX_DIMS, Strided, advance_index, advance_index_with_offsets, broadcast_strides,
    checked_numel, copy_tensor_cast, for_rows, gather_copy, require_contiguous, strided_offset,
    with_bits_type, with_cast_type, worth_parallel,
};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor, TensorList};

mod data_shaped;
mod scatter;

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::index_select.out", index_select);
    r.register("aten::index.Tensor_out", index_tensor);
    r.register("aten::index_put.out", index_put_out);
    r.register("aten::index_put_", index_put_inplace);
    r.register("aten::copy_", copy_inplace);
    r.register("aten::gather.out", gather);
    scatter::register(r);
    data_shaped::register(r);
}

/// True when both tensors start at the same bytes.
fn same_data(x: &Tensor, y: &Tensor) -> bool {
    match (x.data(), y.data()) {
        (Some(p), Some(q)) => p.region == q.region && p.offset == q.offset,
        _ => false,
    }
}

/// `v` wrapped into `0..size` (negative counts from the end), or an error.
#[inline]
fn wrap_index(v: i64, size: usize) -> Result<usize, KernelError> {
    let n = size as i64;
    let w = if v < 0 { v + n } else { v };
    if w < 0 || w >= n {
        Err(KernelError::invalid(format!(
            "index {v} is out of bounds for a dim of size {size}"
        )))
    } else {
        Ok(w as usize)
    }
}

/// One index tensor, seen through the broadcast shape.
#[derive(Clone, Copy)]
struct Source<'a> {
    /// The dim of `self` it indexes.
    dim: usize,
    data: Indices<'a>,
    /// Element offset of its first value in `data`.
    base: usize,
    rank: usize,
    sizes: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    /// Strides over the broadcast shape `B`.
    bstrides: [usize; MAX_RANK],
}

/// How an advanced-indexing call maps output blocks to `self`.
struct Plan<'a> {
    n: usize,
    sources: [Source<'a>; MAX_RANK],
    b_rank: usize,
    b: [usize; MAX_RANK],
    /// Non-indexed dims before (`p`) and after (`q`) the broadcast block.
    p_rank: usize,
    p: [usize; MAX_RANK],
    q_rank: usize,
    q: [usize; MAX_RANK],
    /// `self`'s sizes and strides.
    sizes: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    out_rank: usize,
    out: [usize; MAX_RANK],
}

impl<'a> Plan<'a> {
    fn build(
        ctx: &'a KernelContext<'_>,
        input: &Tensor,
        list: &TensorList<'_>,
    ) -> Result<Self, KernelError> {
        let rank = input.rank();
        let empty = Source {
            dim: 0,
            data: Indices::I64(&[]),
            base: 0,
            rank: 0,
            sizes: [0; MAX_RANK],
            strides: [0; MAX_RANK],
            bstrides: [0; MAX_RANK],
        };
        let mut plan = Plan {
            n: 0,
            sources: [empty; MAX_RANK],
            b_rank: 0,
            b: [0; MAX_RANK],
            p_rank: 0,
            p: [0; MAX_RANK],
            q_rank: 0,
            q: [0; MAX_RANK],
            sizes: [0; MAX_RANK],
            strides: [0; MAX_RANK],
            out_rank: 0,
            out: [0; MAX_RANK],
        };
        plan.sizes[..rank].copy_from_slice(input.sizes());
        plan.strides[..rank].copy_from_slice(input.strides());
        let too_many =
            || KernelError::invalid(format!("too many indices for a tensor of dimension {rank}"));
        let mut d = 0usize;
        for j in 0..list.len() {
            let Some(t) = list.get_opt(j)? else {
                if d >= rank {
                    return Err(too_many());
                }
                d += 1;
                continue;
            };
            require_contiguous(&t, "index tensor")?;
            match t.dtype() {
                ScalarType::Long | ScalarType::Int => {
                    if d >= rank {
                        return Err(too_many());
                    }
                    let mut s = empty;
                    s.dim = d;
                    s.data = Indices::read(ctx, &t)?;
                    s.rank = t.rank();
                    s.sizes[..s.rank].copy_from_slice(t.sizes());
                    s.strides[..s.rank].copy_from_slice(t.strides());
                    plan.sources[plan.n] = s;
                    plan.n += 1;
                    d += 1;
                }
                ScalarType::Bool | ScalarType::Byte => {
                    let k = t.rank();
                    if k == 0 {
                        return Err(KernelError::invalid(
                            "0-d boolean indices are not supported",
                        ));
                    }
                    if d + k > rank {
                        return Err(too_many());
                    }
                    if t.sizes() != &input.sizes()[d..d + k] {
                        return Err(KernelError::invalid(format!(
                            "mask of shape {:?} does not match the indexed dims {:?}",
                            t.sizes(),
                            &input.sizes()[d..d + k]
                        )));
                    }
                    let mask = ctx.read_raw::<u8>(&t)?;
                    let nnz = mask.iter().filter(|&&m| m != 0).count();
                    let coords = ctx.scratch::<i64>(nnz * k)?;
                    let mut idx = [0usize; MAX_RANK];
                    let mut w = 0;
                    for &m in mask {
                        if m != 0 {
                            for (c, &i) in coords[w..w + k].iter_mut().zip(&idx[..k]) {
                                *c = i as i64;
                            }
                            w += k;
                        }
                        advance_index(&mut idx[..k], t.sizes());
                    }
                    let coords: &'a [i64] = coords;
                    for c in 0..k {
                        let mut s = empty;
                        s.dim = d + c;
                        s.data = Indices::I64(coords);
                        s.base = c;
                        s.rank = 1;
                        s.sizes[0] = nnz;
                        s.strides[0] = k;
                        plan.sources[plan.n] = s;
                        plan.n += 1;
                    }
                    d += k;
                }
                dtype => {
                    return Err(KernelError::UnsupportedDtype {
                        dtype,
                        what: "index tensor (expected i64, i32, bool or u8)",
                    });
                }
            }
        }
        // Broadcast shape of every source.
        let mut b = [0usize; MAX_RANK];
        let mut b_rank = 0;
        for s in &plan.sources[..plan.n] {
            let mut next = [0usize; MAX_RANK];
            let r = broadcast_shapes(&[&b[..b_rank], &s.sizes[..s.rank]], &mut next)?.len();
            b = next;
            b_rank = r;
        }
        plan.b = b;
        plan.b_rank = b_rank;
        for s in plan.sources[..plan.n].iter_mut() {
            let mut buf = [0usize; MAX_DIMS];
            broadcast_strides(
                &s.sizes[..s.rank],
                &s.strides[..s.rank],
                &b[..b_rank],
                &mut buf,
            )?;
            s.bstrides[..b_rank].copy_from_slice(&buf[..b_rank]);
        }
        // Where the broadcast block goes.
        let mut indexed = [false; MAX_RANK];
        for s in &plan.sources[..plan.n] {
            indexed[s.dim] = true;
        }
        let adjacent = plan.n == 0
            || plan.sources[..plan.n]
                .windows(2)
                .all(|w| w[1].dim == w[0].dim + 1);
        let first = if plan.n > 0 { plan.sources[0].dim } else { 0 };
        for (dim, &ix) in indexed.iter().enumerate().take(rank) {
            if ix {
                continue;
            }
            if adjacent && dim < first {
                plan.p[plan.p_rank] = dim;
                plan.p_rank += 1;
            } else {
                plan.q[plan.q_rank] = dim;
                plan.q_rank += 1;
            }
        }
        let out_rank = plan.p_rank + b_rank + plan.q_rank;
        if out_rank > MAX_RANK {
            return Err(KernelError::invalid(
                "indexing result exceeds the rank limit",
            ));
        }
        let mut o = 0;
        for &dim in &plan.p[..plan.p_rank] {
            plan.out[o] = plan.sizes[dim];
            o += 1;
        }
        plan.out[o..o + b_rank].copy_from_slice(&b[..b_rank]);
        o += b_rank;
        for &dim in &plan.q[..plan.q_rank] {
            plan.out[o] = plan.sizes[dim];
            o += 1;
        }
        plan.out_rank = out_rank;
        checked_numel(&plan.out[..out_rank])?;
        Ok(plan)
    }

    /// Result sizes.
    fn out_sizes(&self) -> &[usize] {
        &self.out[..self.out_rank]
    }

    /// The non-indexed trailing block, as a layout over `self`.
    fn q_layout(&self) -> Result<Strided, KernelError> {
        let mut sizes = [0usize; MAX_RANK];
        let mut strides = [0usize; MAX_RANK];
        for (i, &dim) in self.q[..self.q_rank].iter().enumerate() {
            sizes[i] = self.sizes[dim];
            strides[i] = self.strides[dim];
        }
        Strided::new(&sizes[..self.q_rank], &strides[..self.q_rank])
    }

    /// Number of `(p, b)` blocks.
    fn blocks(&self) -> usize {
        let p: usize = self.p[..self.p_rank]
            .iter()
            .map(|&d| self.sizes[d])
            .product();
        p * self.b[..self.b_rank].iter().product::<usize>()
    }

    /// Calls `f(block, offset)` for every `(p, b)` block in row-major order with the
    /// element offset of its first element in `self`.
    fn for_each_block(
        &self,
        mut f: impl FnMut(usize, usize) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        let bn: usize = self.b[..self.b_rank].iter().product();
        let blocks = self.blocks();
        for blk in 0..blocks {
            let (mut pi, mut bi) = (blk / bn.max(1), blk % bn.max(1));
            let mut off = 0usize;
            for &dim in self.p[..self.p_rank].iter().rev() {
                off += (pi % self.sizes[dim]) * self.strides[dim];
                pi /= self.sizes[dim];
            }
            let mut src_off = [0usize; MAX_RANK];
            for d in (0..self.b_rank).rev() {
                let i = bi % self.b[d];
                bi /= self.b[d];
                for (s, o) in self.sources[..self.n].iter().zip(src_off.iter_mut()) {
                    *o += i * s.bstrides[d];
                }
            }
            for (s, &o) in self.sources[..self.n].iter().zip(&src_off) {
                let at = s.base + o;
                if at >= s.data.len() {
                    return Err(KernelError::invalid(
                        "index tensor is smaller than its shape",
                    ));
                }
                off += wrap_index(s.data.get(at), self.sizes[s.dim])? * self.strides[s.dim];
            }
            f(blk, off)?;
        }
        Ok(())
    }
}

op_args! {
    /// `index.Tensor_out(Tensor self, Tensor?[] indices, *, Tensor(a!) out)`.
    struct IndexTensorArgs<'a> = "aten::index.Tensor_out" {
        input: Tensor,
        indices: TensorList<'a>,
        out: OutArg,
    } returns 1
}

fn index_tensor(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let IndexTensorArgs {
        input,
        indices,
        out,
    } = IndexTensorArgs::unpack(a)?;
    require_contiguous(&input, "input")?;
    same_dtype(&input, &out.tensor())?;
    require_contiguous(&out.tensor(), "out")?;
    let plan = Plan::build(ctx, &input, &indices)?;
    let mut sizes = [0usize; MAX_RANK];
    let rank = plan.out_rank;
    sizes[..rank].copy_from_slice(plan.out_sizes());
    let out = out.resize(a, &sizes[..rank])?;
    let q = plan.q_layout()?;
    let qn = q.numel()?;
    if out.numel() == 0 {
        return Ok(());
    }
    with_bits_type!(input.dtype().element_size(), T => {
        let src = ctx.read_raw::<T>(&input)?;
        let dst = ctx.write_raw::<T>(&out)?;
        plan.for_each_block(|blk, off| {
            let d = dst
                .get_mut(blk * qn..(blk + 1) * qn)
                .ok_or_else(|| KernelError::invalid("index out tensor too small"))?;
            gather_copy(ctx.pool(), d, src, off, &q)
        })
    })
}

/// Element-wise accumulation for `index_put(accumulate=True)`.
trait AddElem: Copy {
    fn add(self, other: Self) -> Self;
}

macro_rules! add_wrapping {
    ($($t:ty),*) => {$(
        impl AddElem for $t {
            #[inline]
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
        }
    )*};
}
add_wrapping!(i8, u8, i16, i32, i64, u16, u32, u64);

impl AddElem for f32 {
    #[inline]
    fn add(self, o: Self) -> Self {
        self + o
    }
}
impl AddElem for f64 {
    #[inline]
    fn add(self, o: Self) -> Self {
        self + o
    }
}
impl AddElem for f16 {
    #[inline]
    fn add(self, o: Self) -> Self {
        f16::from_f32(self.to_f32() + o.to_f32())
    }
}
impl AddElem for bf16 {
    #[inline]
    fn add(self, o: Self) -> Self {
        bf16::from_f32(self.to_f32() + o.to_f32())
    }
}
impl AddElem for Bool8 {
    #[inline]
    fn add(self, o: Self) -> Self {
        Bool8(((self.0 | o.0) != 0) as u8)
    }
}

/// Writes `src` (values seen through `vlayout` from `voff`) into `dst` (seen through
/// `dlayout` from `doff`), both over the same sizes, combining with `op`.
#[allow(clippy::too_many_arguments)]
fn scatter_block<T: Copy>(
    dst: &mut [T],
    doff: usize,
    dstrides: &[usize],
    src: &[T],
    voff: usize,
    vstrides: &[usize],
    sizes: &[usize],
    op: impl Fn(&mut T, T),
) -> Result<(), KernelError> {
    let dl = Strided::new(sizes, dstrides)?;
    let vl = Strided::new(sizes, vstrides)?;
    if dl.numel()? == 0 {
        return Ok(());
    }
    if doff + dl.extent()? > dst.len() || voff + vl.extent()? > src.len() {
        return Err(KernelError::invalid("index_put block out of bounds"));
    }
    let mut idx = [0usize; MAX_RANK];
    let idx = &mut idx[..sizes.len()];
    let mut at = [doff, voff];
    loop {
        op(&mut dst[at[0]], src[at[1]]);
        if !advance_index_with_offsets(idx, sizes, [dstrides, vstrides], &mut at) {
            return Ok(());
        }
    }
}

/// Shared body of `index_put` and `index_put_`: writes `values` at `indices` of
/// `dst`, which already holds `self`'s elements (same sizes as `input`).
fn index_put_into(
    ctx: &KernelContext<'_>,
    input: &Tensor,
    list: &TensorList<'_>,
    values: &Tensor,
    accumulate: bool,
    dst: &mut [u8],
) -> Result<(), KernelError> {
    same_dtype(input, values)?;
    require_contiguous(values, "values")?;
    let plan = Plan::build(ctx, input, list)?;
    let r = plan.out_sizes();
    let mut vbuf = [0usize; MAX_DIMS];
    let vstrides = broadcast_strides(values.sizes(), values.strides(), r, &mut vbuf)?;
    let lead = plan.p_rank + plan.b_rank;
    // Values offset of each block: digits of the block index over r[..lead].
    let block_voff = |blk: usize| strided_offset(blk, &r[..lead], vstrides);
    let mut qsizes = [0usize; MAX_RANK];
    let mut qstrides = [0usize; MAX_RANK];
    for (i, &dim) in plan.q[..plan.q_rank].iter().enumerate() {
        qsizes[i] = plan.sizes[dim];
        qstrides[i] = plan.strides[dim];
    }
    let qr = plan.q_rank;
    let vq = &vstrides[lead..];
    if checked_numel(r)? == 0 {
        return Ok(());
    }
    if accumulate {
        with_cast_type!(input.dtype(), "index_put", T => {
            let v = ctx.read_raw::<T>(values)?;
            let d = crate::ops::shape::common::typed_mut::<T>(dst)?;
            plan.for_each_block(|blk, off| {
                scatter_block(d, off, &qstrides[..qr], v, block_voff(blk), vq, &qsizes[..qr], |x, y| *x = x.add(y))
            })
        })
    } else {
        with_bits_type!(input.dtype().element_size(), T => {
            let v = ctx.read_raw::<T>(values)?;
            let d = crate::ops::shape::common::typed_mut::<T>(dst)?;
            plan.for_each_block(|blk, off| {
                scatter_block(d, off, &qstrides[..qr], v, block_voff(blk), vq, &qsizes[..qr], |x, y| *x = y)
            })
        })
    }
}

op_args! {
    /// `index_put.out(Tensor self, Tensor?[] indices, Tensor values,
    /// bool accumulate=False, *, Tensor(a!) out)`.
    struct IndexPutArgs<'a> = "aten::index_put.out" {
        input: Tensor,
        indices: TensorList<'a>,
        values: Tensor,
        accumulate: bool,
        out: OutArg,
    } returns 1
}

fn index_put_out(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let IndexPutArgs {
        input,
        indices,
        values,
        accumulate,
        out,
    } = IndexPutArgs::unpack(a)?;
    require_contiguous(&input, "input")?;
    same_dtype(&input, &out.tensor())?;
    require_contiguous(&out.tensor(), "out")?;
    // Stored once the index list (borrowed from `a`) is no longer read.
    let resized = out.resized(input.sizes())?;
    let in_place = same_data(&input, &resized);
    let dst = ctx.write_bytes(&resized)?;
    if !in_place {
        dst.copy_from_slice(ctx.read_bytes(&input)?);
    }
    index_put_into(ctx, &input, &indices, &values, accumulate, dst)?;
    out.set(a, resized)
}

op_args! {
    /// `index_put_(Tensor(a!) self, Tensor?[] indices, Tensor values,
    /// bool accumulate=False) -> Tensor(a!)`.
    struct IndexPutInplaceArgs<'a> = "aten::index_put_" {
        input: Tensor,
        indices: TensorList<'a>,
        values: Tensor,
        accumulate: bool,
    } returns 1
}

fn index_put_inplace(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let IndexPutInplaceArgs {
        input,
        indices,
        values,
        accumulate,
    } = IndexPutInplaceArgs::unpack(a)?;
    require_contiguous(&input, "self")?;
    let dst = ctx.write_bytes(&input)?;
    index_put_into(ctx, &input, &indices, &values, accumulate, dst)
}

op_args! {
    /// `copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)`:
    /// `src` broadcast to `self`'s shape and cast to its dtype.
    struct CopyInplaceArgs = "aten::copy_" {
        input: Tensor,
        src: Tensor,
        non_blocking: bool,
    } returns 1
}

fn copy_inplace(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let CopyInplaceArgs {
        input: dst, src, ..
    } = CopyInplaceArgs::unpack(a)?;
    require_contiguous(&dst, "self")?;
    require_contiguous(&src, "src")?;
    if same_data(&src, &dst) && src.dtype() == dst.dtype() && src.sizes() == dst.sizes() {
        return Ok(());
    }
    let mut buf = [0usize; MAX_DIMS];
    let strides = broadcast_strides(src.sizes(), src.strides(), dst.sizes(), &mut buf)?;
    let layout = Strided::new(dst.sizes(), strides)?;
    copy_tensor_cast(ctx, &src, &dst, 0, &layout, "copy_")
}

op_args! {
    /// `index_select.out(Tensor self, int dim, Tensor index, *, Tensor(a!) out)`.
    struct IndexSelectArgs = "aten::index_select.out" {
        input: Tensor,
        dim: i64,
        index: Tensor,
        out: OutArg,
    } returns 1
}

fn index_select(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let IndexSelectArgs {
        input,
        dim,
        index,
        out,
    } = IndexSelectArgs::unpack(a)?;
    let rank = input.rank();
    let dim = input.normalize_dim(dim)?;
    if index.rank() > 1 {
        return Err(KernelError::invalid(
            "index_select index must be 0-d or 1-d",
        ));
    }
    require_contiguous(&input, "input")?;
    require_contiguous(&index, "index")?;
    let n = index.numel();
    let size = if rank == 0 { 1 } else { input.sizes()[dim] };
    if rank == 0 && n != 1 {
        return Err(KernelError::invalid(
            "index_select of a 0-d tensor needs one index",
        ));
    }
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(input.sizes());
    if rank > 0 {
        sizes[dim] = n;
    }
    same_dtype(&input, &out.tensor())?;
    require_contiguous(&out.tensor(), "out")?;
    let out = out.resize(a, &sizes[..rank])?;
    let idx = Indices::read(ctx, &index)?;
    for i in 0..idx.len() {
        let v = idx.get(i);
        if v < 0 || v as u64 >= size as u64 {
            return Err(KernelError::invalid(format!(
                "index_select index {v} out of range for size {size}"
            )));
        }
    }
    let leading: usize = input.sizes()[..dim.min(rank)].iter().product();
    let trailing: usize = if rank == 0 {
        1
    } else {
        input.sizes()[dim + 1..].iter().product()
    };
    let row = n * trailing;
    if leading * row == 0 {
        return Ok(());
    }
    with_bits_type!(input.dtype().element_size(), T => {
        let src = ctx.read_raw::<T>(&input)?;
        let dst = ctx.write_raw::<T>(&out)?;
        let parallel = worth_parallel(leading, leading * row);
        for_rows(ctx.pool(), dst, row, leading, 8, parallel, |first, chunk| {
            for (l, r) in chunk.chunks_exact_mut(row).enumerate() {
                let base = (first + l) * size * trailing;
                for (j, piece) in r.chunks_exact_mut(trailing).enumerate() {
                    let s = base + idx.get(j) as usize * trailing;
                    piece.copy_from_slice(&src[s..s + trailing]);
                }
            }
        });
        Ok(())
    })
}

op_args! {
    /// `gather.out(Tensor self, int dim, Tensor index, *, bool sparse_grad=False,
    /// Tensor(a!) out)`.
    struct GatherArgs = "aten::gather.out" {
        input: Tensor,
        dim: i64,
        index: Tensor,
        sparse_grad: bool,
        out: OutArg,
    } returns 1
}

fn gather(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let GatherArgs {
        input,
        dim,
        index,
        out,
        ..
    } = GatherArgs::unpack(a)?;
    let rank = input.rank();
    let dim = input.normalize_dim(dim)?;
    require_contiguous(&input, "input")?;
    require_contiguous(&index, "index")?;
    let irank = index.rank();
    if irank.max(1) != rank.max(1) {
        return Err(KernelError::invalid(format!(
            "gather index rank {irank} differs from the input's {rank}"
        )));
    }
    let isizes: &[usize] = if irank == 0 { &[1] } else { index.sizes() };
    let ssizes: &[usize] = if rank == 0 { &[1] } else { input.sizes() };
    let sstrides: &[usize] = if rank == 0 { &[1] } else { input.strides() };
    for d in 0..isizes.len() {
        if d != dim && isizes[d] > ssizes[d] {
            return Err(KernelError::invalid(format!(
                "gather index size {} exceeds the input's {} at dim {d}",
                isizes[d], ssizes[d]
            )));
        }
    }
    same_dtype(&input, &out.tensor())?;
    require_contiguous(&out.tensor(), "out")?;
    let out = out.resize(a, index.sizes())?;
    let idx = Indices::read(ctx, &index)?;
    let n = idx.len();
    if n == 0 {
        return Ok(());
    }
    with_bits_type!(input.dtype().element_size(), T => {
        let src = ctx.read_raw::<T>(&input)?;
        let dst = ctx.write_raw::<T>(&out)?;
        let r = isizes.len();
        let mut pos = [0usize; MAX_RANK];
        for (i, d) in dst.iter_mut().enumerate().take(n) {
            let mut off = 0usize;
            for k in 0..r {
                let c = if k == dim {
                    let v = idx.get(i);
                    if v < 0 || v as u64 >= ssizes[k] as u64 {
                        return Err(KernelError::invalid(format!(
                            "gather index {v} out of range for size {}",
                            ssizes[k]
                        )));
                    }
                    v as usize
                } else {
                    pos[k]
                };
                off += c * sstrides[k];
            }
            *d = *src.get(off).ok_or_else(|| KernelError::invalid("gather out of bounds"))?;
            advance_index(&mut pos[..r], isizes);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests;
