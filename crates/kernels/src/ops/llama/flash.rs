//! The blocked, flash-attention style engine behind the llama SDPA kernels.
//!
//! Attention of `q` `[B, S_q, H_q, D]` over the first `n_keys` rows of `k`, `v`
//! `[B, S_kv, H_kv, D]` (or the `[B, H, S, D]` layout, see [`SeqDim`]), query head `h`
//! reading KV head `h / (H_q / H_kv)`:
//!
//! * **Work items** are contiguous runs of output rows: `(batch, query block, all heads)`
//!   for prefill, `(batch, query, one KV group)` when there are few query rows. Inside
//!   an item, the rows of one KV group (all its query heads times all its queries) are
//!   processed together, so each key/value tile is loaded once for the whole group.
//! * **Online softmax**: key/value tiles of [`KEY_BLOCK`] rows are streamed; each row
//!   keeps a running max and sum, and its f32 accumulator is rescaled when the max
//!   grows. The output is `acc / sum`.
//! * **Split-K** (decode): when there are fewer items than twice the pool's threads,
//!   each item's keys are also split across tasks; every `(item, split)` leaves its
//!   `(max, sum, acc)` in scratch and a final pass merges them per row.
//! * **Threads**: `parallel_for` over at most `threads` tasks; each task takes its own
//!   scratch slot and then pulls items from a shared queue (a mutex around an iterator of
//!   disjoint `&mut` output chunks), so writes never overlap and load balances itself.
//! * **Scratch**: one slice from the temp allocator, sized by [`Plan::scratch_len`] and
//!   carved up before the parallel section; K/V conversion buffers (f16, bf16, int8
//!   dequantisation) exist only when the source needs them, one tile per task. Every
//!   accumulator is initialised per block: recycled scratch is dirty.
//! * **SIMD**: the inner loops (dot products, exp, value multiply-adds) are
//!   `etch_linalg::attention`'s, for the [`Isa`] of the dispatch table's attention slot.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use half::{bf16, f16};

use etch_linalg::{Isa, attention};

use crate::{Element, KernelError, ThreadPool};

/// Keys per streamed K/V tile.
pub const KEY_BLOCK: usize = 128;
/// Most query rows processed against one K/V tile.
pub const ROW_BLOCK: usize = 64;
/// Most queries per prefill work item.
pub const MAX_QUERY_BLOCK: usize = 32;
/// Row stride of a transposed key tile: [`KEY_BLOCK`] rounded up to the blocked score
/// kernel's key columns.
const KT_STRIDE: usize = KEY_BLOCK.next_multiple_of(attention::KEY_COLUMNS);
/// Fewest keys per split-K range.
pub const MIN_SPLIT_KEYS: usize = 128;
/// Scratch sub-buffers start on 64-byte boundaries.
const ALIGN_F32: usize = 16;

fn overflow() -> KernelError {
    KernelError::invalid("attention: scratch size overflows")
}

fn up(n: usize) -> Result<usize, KernelError> {
    n.checked_next_multiple_of(ALIGN_F32).ok_or_else(overflow)
}

fn mul(a: usize, b: usize) -> Result<usize, KernelError> {
    a.checked_mul(b).ok_or_else(overflow)
}

fn add(a: usize, b: usize) -> Result<usize, KernelError> {
    a.checked_add(b).ok_or_else(overflow)
}

/// The next item of a queue the pool's tasks share; the lock is released before the
/// item is used (a poisoned lock is taken over: the queue itself stays valid).
fn pop<I: Iterator>(queue: &Mutex<I>) -> Option<I::Item> {
    queue.lock().unwrap_or_else(PoisonError::into_inner).next()
}

/// A task's workspace in the next free scratch slot, laid out as `lay`; `None`, with
/// `failed` set, when no slot is left or it is too short.
fn take_workspace<'a, I: Iterator<Item = &'a mut [f32]>>(
    slots: &Mutex<I>,
    lay: &SlotLayout,
    failed: &AtomicBool,
) -> Option<Workspace<'a>> {
    let ws = pop(slots).and_then(|slot| Workspace::new(slot, lay));
    if ws.is_none() {
        failed.store(true, Ordering::Relaxed);
    }
    ws
}

/// A float element the engine reads and writes (accumulating in f32): f32, f16, bf16.
pub trait Float: Element {
    /// The slice itself when the element is f32 (tiles are then borrowed, not copied).
    #[inline]
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        if Self::DTYPE == etch_base::ScalarType::Float {
            bytemuck::try_cast_slice(s).ok()
        } else {
            None
        }
    }
}

impl Float for f32 {}
impl Float for f16 {}
impl Float for bf16 {}

/// Where the sequence dimension is: `[B, S, H, D]` (`One`, what the llama export uses)
/// or `[B, H, S, D]` (`Two`, `is_seq_at_dim_2` of the quantized op).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqDim {
    One,
    Two,
}

/// Element strides of a contiguous 4-D tensor whose rows (the last dim, `width`
/// elements) are addressed by (batch, position, head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLayout {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub width: usize,
    stride_b: usize,
    stride_s: usize,
    stride_h: usize,
}

impl RowLayout {
    /// The layout of a contiguous tensor of logical shape (batch, seq, heads, width).
    pub fn new(dim: SeqDim, batch: usize, seq: usize, heads: usize, width: usize) -> Self {
        let (stride_s, stride_h) = match dim {
            SeqDim::One => (heads * width, width),
            SeqDim::Two => (width, seq * width),
        };
        Self {
            batch,
            seq,
            heads,
            width,
            stride_b: seq * heads * width,
            stride_s,
            stride_h,
        }
    }

    #[inline(always)]
    fn offset(&self, b: usize, s: usize, h: usize) -> usize {
        b * self.stride_b + s * self.stride_s + h * self.stride_h
    }

    fn numel(&self) -> Option<usize> {
        self.batch
            .checked_mul(self.seq)?
            .checked_mul(self.heads)?
            .checked_mul(self.width)
    }

    fn check(&self, len: usize, what: &str) -> Result<(), KernelError> {
        match self.numel() {
            Some(n) if n <= len => Ok(()),
            _ => Err(KernelError::invalid(format!(
                "attention: {what} holds {len} elements, fewer than its shape needs"
            ))),
        }
    }
}

/// A source of f32 rows: queries, keys or values.
pub trait Rows: Sync {
    /// The shape the rows are addressed by.
    fn layout(&self) -> &RowLayout;
    /// True when tiles are converted into a buffer (so one must be provided).
    fn converts(&self) -> bool;
    /// Row `(b, s, h)` as f32 into `dst` (`width` long).
    fn convert_row(&self, b: usize, s: usize, h: usize, dst: &mut [f32]);
    /// Rows `s0 .. s0 + n` of head `h` borrowed as f32, `(data, row stride)`, when
    /// they are stored as f32.
    #[inline(always)]
    fn borrow_tile(&self, _b: usize, _s0: usize, _n: usize, _h: usize) -> Option<(&[f32], usize)> {
        None
    }

    /// Row `(b, s, h)` times `scale`, as f32, into `dst` (`width` long): converted
    /// exactly, then scaled (as the reference does).
    #[inline(always)]
    fn load_row(&self, b: usize, s: usize, h: usize, scale: f32, dst: &mut [f32]) {
        self.convert_row(b, s, h, dst);
        attention::scale(dst, scale);
    }

    /// Rows `s0 .. s0 + n` of head `h` as f32: `(data, row stride)`, borrowed when
    /// possible, otherwise converted into `buf` (at least `n * width` long).
    #[inline(always)]
    fn tile<'a>(
        &'a self,
        b: usize,
        s0: usize,
        n: usize,
        h: usize,
        buf: &'a mut [f32],
    ) -> (&'a [f32], usize) {
        if let Some(borrowed) = self.borrow_tile(b, s0, n, h) {
            return borrowed;
        }
        let w = self.layout().width;
        for (r, dst) in buf.chunks_exact_mut(w).take(n).enumerate() {
            self.convert_row(b, s0 + r, h, dst);
        }
        (buf.get(..n * w).unwrap_or(&[]), w)
    }
}

/// Rows of a float tensor (f32 tiles are borrowed, f16/bf16 converted).
pub struct FloatRows<'a, E> {
    data: &'a [E],
    lay: RowLayout,
}

impl<'a, E: Float> FloatRows<'a, E> {
    /// Rows of `data` laid out as `lay` (checked to fit).
    pub fn new(data: &'a [E], lay: RowLayout) -> Result<Self, KernelError> {
        lay.check(data.len(), "a float tensor")?;
        Ok(Self { data, lay })
    }
}

impl<E: Float> Rows for FloatRows<'_, E> {
    fn layout(&self) -> &RowLayout {
        &self.lay
    }

    fn converts(&self) -> bool {
        E::as_f32(self.data).is_none()
    }

    #[inline(always)]
    fn convert_row(&self, b: usize, s: usize, h: usize, dst: &mut [f32]) {
        let off = self.lay.offset(b, s, h);
        let src = self.data.get(off..off + self.lay.width).unwrap_or(&[]);
        etch_base::cast_slice(src, dst);
    }

    #[inline(always)]
    fn borrow_tile(&self, b: usize, s0: usize, n: usize, h: usize) -> Option<(&[f32], usize)> {
        let f = E::as_f32(self.data)?;
        let off = self.lay.offset(b, s0, h);
        let end = off + n.saturating_sub(1) * self.lay.stride_s + self.lay.width;
        Some((f.get(off..end).unwrap_or(&[]), self.lay.stride_s))
    }
}

/// Rows of an int8 tensor with one f32 scale and one i8 zero point per row, read as
/// `(x - zero_point) * scale`.
pub struct QuantRows<'a> {
    data: &'a [i8],
    scales: &'a [f32],
    zero_points: &'a [i8],
    lay: RowLayout,
    qlay: RowLayout,
}

impl<'a> QuantRows<'a> {
    /// Rows of `data` laid out as `lay`, with `scales` and `zero_points` laid out as
    /// `lay` with a width of 1.
    pub fn new(
        data: &'a [i8],
        scales: &'a [f32],
        zero_points: &'a [i8],
        dim: SeqDim,
        lay: RowLayout,
    ) -> Result<Self, KernelError> {
        let qlay = RowLayout::new(dim, lay.batch, lay.seq, lay.heads, 1);
        lay.check(data.len(), "an int8 tensor")?;
        qlay.check(scales.len(), "a scale tensor")?;
        qlay.check(zero_points.len(), "a zero-point tensor")?;
        Ok(Self {
            data,
            scales,
            zero_points,
            lay,
            qlay,
        })
    }
}

impl Rows for QuantRows<'_> {
    fn layout(&self) -> &RowLayout {
        &self.lay
    }

    fn converts(&self) -> bool {
        true
    }

    /// Dequantizes row `(b, s, h)`: `(x - zero_point) * scale`.
    #[inline(always)]
    fn convert_row(&self, b: usize, s: usize, h: usize, dst: &mut [f32]) {
        let off = self.lay.offset(b, s, h);
        let src = self.data.get(off..off + self.lay.width).unwrap_or(&[]);
        let qo = self.qlay.offset(b, s, h);
        let sc = self.scales.get(qo).copied().unwrap_or(0.0);
        let zp = self.zero_points.get(qo).copied().unwrap_or(0) as f32;
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = (x as f32 - zp) * sc;
        }
    }
}

/// An additive attention mask `[S_q, S_kv]` (row stride in [`Problem::mask_stride`]).
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    None,
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl Mask<'_> {
    #[inline(always)]
    fn add_row(&self, offset: usize, dst: &mut [f32]) {
        let range = offset..offset + dst.len();
        match self {
            Mask::None => {}
            Mask::F32(m) => {
                for (d, s) in dst.iter_mut().zip(m.get(range).unwrap_or(&[])) {
                    *d += *s;
                }
            }
            Mask::F16(m) => {
                for (d, s) in dst.iter_mut().zip(m.get(range).unwrap_or(&[])) {
                    *d += s.to_f32();
                }
            }
            Mask::BF16(m) => {
                for (d, s) in dst.iter_mut().zip(m.get(range).unwrap_or(&[])) {
                    *d += s.to_f32();
                }
            }
        }
    }
}

/// One attention call, validated.
#[derive(Clone, Copy, Debug)]
pub struct Problem {
    pub batch: usize,
    pub q_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Keys read: rows `[0, n_keys)` of the cache.
    pub n_keys: usize,
    /// Absolute position of query 0 (for the causal limit).
    pub start_pos: usize,
    pub causal: bool,
    pub scale: f32,
    /// Layout of q and out.
    pub seq_dim: SeqDim,
    /// Row stride of the mask.
    pub mask_stride: usize,
}

impl Problem {
    /// True when the output has no elements.
    pub fn is_empty(&self) -> bool {
        self.batch == 0 || self.q_len == 0 || self.q_heads == 0 || self.head_dim == 0
    }

    fn group(&self) -> usize {
        (self.q_heads / self.kv_heads.max(1)).max(1)
    }

    /// Keys query `i` may read: `[0, limit)`.
    #[inline(always)]
    fn key_limit(&self, i: usize) -> usize {
        if self.causal {
            self.n_keys.min(self.start_pos + i + 1)
        } else {
            self.n_keys
        }
    }

    fn out_len(&self) -> Option<usize> {
        self.batch
            .checked_mul(self.q_len)?
            .checked_mul(self.q_heads)?
            .checked_mul(self.head_dim)
    }
}

/// A run of output rows: queries `[i0, i1)` times heads `[h0, h1)` of batch `b`,
/// contiguous in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Item {
    b: usize,
    i0: usize,
    i1: usize,
    h0: usize,
    h1: usize,
}

impl Item {
    fn rows(&self) -> usize {
        (self.i1 - self.i0) * (self.h1 - self.h0)
    }

    /// Index of row `(i, h)` within the item's output chunk.
    #[inline(always)]
    fn row_index(&self, dim: SeqDim, i: usize, h: usize) -> usize {
        match dim {
            SeqDim::One => (i - self.i0) * (self.h1 - self.h0) + (h - self.h0),
            SeqDim::Two => (h - self.h0) * (self.i1 - self.i0) + (i - self.i0),
        }
    }
}

/// The partition of the output into items, in memory order.
#[derive(Clone, Copy, Debug)]
struct Grid {
    dim: SeqDim,
    batch: usize,
    q_len: usize,
    q_heads: usize,
    qb: usize,
    hb: usize,
}

impl Grid {
    fn q_blocks(&self) -> usize {
        self.q_len.div_ceil(self.qb)
    }

    fn h_blocks(&self) -> usize {
        self.q_heads.div_ceil(self.hb)
    }

    fn count(&self) -> usize {
        self.batch * self.q_blocks() * self.h_blocks()
    }

    fn max_rows(&self) -> usize {
        self.qb * self.hb
    }

    fn item(&self, idx: usize) -> Item {
        let (nq, nh) = (self.q_blocks(), self.h_blocks());
        let (b, rest) = (idx / (nq * nh), idx % (nq * nh));
        let (iq, ih) = match self.dim {
            SeqDim::One => (rest / nh, rest % nh),
            SeqDim::Two => (rest % nq, rest / nq),
        };
        Item {
            b,
            i0: iq * self.qb,
            i1: ((iq + 1) * self.qb).min(self.q_len),
            h0: ih * self.hb,
            h1: ((ih + 1) * self.hb).min(self.q_heads),
        }
    }
}

/// Items with their disjoint output chunks, in order.
struct OutItems<'a, O> {
    grid: Grid,
    next: usize,
    width: usize,
    rest: &'a mut [O],
}

impl<'a, O> OutItems<'a, O> {
    fn new(grid: Grid, out: &'a mut [O], width: usize) -> Self {
        Self {
            grid,
            next: 0,
            width,
            rest: out,
        }
    }
}

impl<'a, O> Iterator for OutItems<'a, O> {
    type Item = (Item, &'a mut [O]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.grid.count() {
            return None;
        }
        let item = self.grid.item(self.next);
        self.next += 1;
        let rest = std::mem::take(&mut self.rest);
        let (chunk, rest) = rest.split_at_mut_checked(item.rows() * self.width)?;
        self.rest = rest;
        Some((item, chunk))
    }
}

/// Sizes of one task's scratch slot (in f32).
#[derive(Clone, Copy, Debug)]
struct SlotLayout {
    rows: usize,
    keys: usize,
    q: usize,
    s: usize,
    stats: usize,
    acc: usize,
    kbuf: usize,
    vbuf: usize,
    /// f32 of the transposed key tile (0 when row sets are too small for the blocked
    /// scores).
    kt: usize,
    total: usize,
}

/// How a call is split into work and scratch.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    grid: Grid,
    /// Split-K ranges per item (1: no split).
    splits: usize,
    /// The most `splits` can be for this shape and pool (scratch is sized for it, so
    /// that decode steps of one model ask for the same scratch whatever the position).
    max_splits: usize,
    tasks: usize,
    max_tasks: usize,
    slot: SlotLayout,
    /// f32 per split-K partial result (0 without split-K).
    unit_len: usize,
    /// f32 of the merge row buffer (0 without split-K).
    merge_len: usize,
}

impl Plan {
    /// Chooses items, split-K and scratch for `threads` threads; `k_converts` and
    /// `v_converts` say whether K and V tiles need conversion buffers.
    pub fn new(
        p: &Problem,
        threads: usize,
        k_converts: bool,
        v_converts: bool,
    ) -> Result<Plan, KernelError> {
        let t = threads.max(1);
        let g = p.group();
        let q_len = p.q_len.max(1);
        let (qb, hb) = match p.seq_dim {
            SeqDim::One => {
                let rows = p.batch.saturating_mul(q_len);
                if rows >= 2 * t {
                    let qb = (rows / (4 * t)).clamp(1, MAX_QUERY_BLOCK.min(q_len));
                    (qb, p.q_heads.max(1))
                } else {
                    (1, g)
                }
            }
            SeqDim::Two => {
                if q_len <= MAX_QUERY_BLOCK {
                    (q_len, g)
                } else {
                    (MAX_QUERY_BLOCK, 1)
                }
            }
        };
        let grid = Grid {
            dim: p.seq_dim,
            batch: p.batch,
            q_len: p.q_len,
            q_heads: p.q_heads,
            qb,
            hb,
        };
        let items = grid.count().max(1);
        let max_splits = if t > 1 && items < 2 * t {
            (4 * t).div_ceil(items)
        } else {
            1
        };
        let splits = max_splits.min(p.n_keys / MIN_SPLIT_KEYS).max(1);
        let tasks = t.min(mul(items, splits)?).max(1);
        let max_tasks = t.min(mul(items, max_splits)?).max(1);
        let d = p.head_dim.max(1);
        let rows = ROW_BLOCK.min(qb * hb.min(g)).max(1);
        // Full-size key tiles whatever the key count: the scratch size then does not
        // change from one decode step to the next.
        let keys = KEY_BLOCK;
        let tile = mul(keys, d)?;
        let q = up(mul(rows, d)?)?;
        let s = up(mul(rows, keys)?)?;
        let stats = up(rows)?;
        let acc = q;
        let kbuf = if k_converts { up(tile)? } else { 0 };
        let vbuf = if v_converts { up(tile)? } else { 0 };
        let kt = if rows >= attention::QUERY_ROWS {
            // (sized whatever the ISA, so that scratch does not depend on it)
            up(mul(KT_STRIDE, d)?)?
        } else {
            0
        };
        let total = [s, stats, stats, acc, kbuf, vbuf, kt]
            .into_iter()
            .try_fold(q, add)?;
        let (unit_len, merge_len) = if max_splits > 1 {
            let r = grid.max_rows();
            (up(add(mul(r, d)?, 2 * r)?)?, up(d)?)
        } else {
            (0, 0)
        };
        Ok(Plan {
            grid,
            splits,
            max_splits,
            tasks,
            max_tasks,
            slot: SlotLayout {
                rows,
                keys,
                q,
                s,
                stats,
                acc,
                kbuf,
                vbuf,
                kt,
                total,
            },
            unit_len,
            merge_len,
        })
    }

    /// Scratch f32 elements the call needs.
    pub fn scratch_len(&self) -> Result<usize, KernelError> {
        add(
            add(self.slots_len()?, self.partials_len()?)?,
            self.merge_len,
        )
    }

    fn slots_len(&self) -> Result<usize, KernelError> {
        mul(self.max_tasks, self.slot.total)
    }

    fn partials_len(&self) -> Result<usize, KernelError> {
        mul(
            mul(self.grid.count().max(1), self.max_splits)?,
            self.unit_len,
        )
    }

    /// Number of split-K ranges per item (1: no split).
    #[cfg(test)]
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// Number of parallel tasks.
    #[cfg(test)]
    pub fn tasks(&self) -> usize {
        self.tasks
    }
}

/// One task's scratch, carved from its slot.
struct Workspace<'a> {
    rows: usize,
    keys: usize,
    q: &'a mut [f32],
    s: &'a mut [f32],
    m: &'a mut [f32],
    l: &'a mut [f32],
    acc: &'a mut [f32],
    kbuf: &'a mut [f32],
    vbuf: &'a mut [f32],
    /// The key tile transposed for the blocked scores (empty when not used).
    kt: &'a mut [f32],
}

impl<'a> Workspace<'a> {
    fn new(slot: &'a mut [f32], lay: &SlotLayout) -> Option<Self> {
        let (q, rest) = slot.split_at_mut_checked(lay.q)?;
        let (s, rest) = rest.split_at_mut_checked(lay.s)?;
        let (m, rest) = rest.split_at_mut_checked(lay.stats)?;
        let (l, rest) = rest.split_at_mut_checked(lay.stats)?;
        let (acc, rest) = rest.split_at_mut_checked(lay.acc)?;
        let (kbuf, rest) = rest.split_at_mut_checked(lay.kbuf)?;
        let (vbuf, rest) = rest.split_at_mut_checked(lay.vbuf)?;
        let (kt, _) = rest.split_at_mut_checked(lay.kt)?;
        Some(Self {
            rows: lay.rows,
            keys: lay.keys,
            q,
            s,
            m,
            l,
            acc,
            kbuf,
            vbuf,
            kt,
        })
    }
}

/// Where a processed row goes.
enum Sink<'a, O> {
    /// The item's output chunk: `acc / sum`.
    Out(&'a mut [O]),
    /// A split-K partial: `[max; R] [sum; R] [acc; R * D]`.
    Partial { buf: &'a mut [f32], rows: usize },
}

impl<O: Float> Sink<'_, O> {
    #[inline(always)]
    fn put(&mut self, r: usize, mm: usize, ws: &Workspace<'_>, d: usize) {
        let acc = ws.acc.get(mm * d..(mm + 1) * d).unwrap_or(&[]);
        match self {
            Sink::Out(out) => {
                // An all-masked row has sum 0: 0 * (1/0) = NaN, as upstream.
                let inv = 1.0 / ws.l[mm];
                if let Some(dst) = out.get_mut(r * d..(r + 1) * d) {
                    for (o, a) in dst.iter_mut().zip(acc) {
                        *o = O::from_f32(a * inv);
                    }
                }
            }
            Sink::Partial { buf, rows } => {
                if let Some(x) = buf.get_mut(r) {
                    *x = ws.m[mm];
                }
                if let Some(x) = buf.get_mut(*rows + r) {
                    *x = ws.l[mm];
                }
                let at = 2 * *rows + r * d;
                if let Some(dst) = buf.get_mut(at..at + d) {
                    dst.copy_from_slice(acc);
                }
            }
        }
    }
}

/// Rows `m0 .. m0 + mr` of a KV group's row set: row `m` is query `i0 + m / gh`, head
/// `hs + m % gh`.
#[derive(Clone, Copy)]
struct RowSet {
    b: usize,
    hk: usize,
    i0: usize,
    hs: usize,
    gh: usize,
    m0: usize,
    mr: usize,
}

impl RowSet {
    #[inline(always)]
    fn at(&self, mm: usize) -> (usize, usize) {
        let m = self.m0 + mm;
        (self.i0 + m / self.gh, self.hs + m % self.gh)
    }
}

/// Everything the tasks share.
struct Job<'a, Q, K, V> {
    p: &'a Problem,
    q: &'a Q,
    k: &'a K,
    v: &'a V,
    mask: Mask<'a>,
    isa: Isa,
}

impl<Q: Rows, K: Rows, V: Rows> Job<'_, Q, K, V> {
    fn item<O: Float>(
        &self,
        ws: &mut Workspace<'_>,
        item: Item,
        keys: Range<usize>,
        sink: Sink<'_, O>,
    ) {
        item_rows(self, ws, item, keys, sink)
    }
}

/// Keys an item reads: `[0, end)`.
fn item_key_end(p: &Problem, item: &Item) -> usize {
    if p.causal {
        p.n_keys.min(p.start_pos + item.i1)
    } else {
        p.n_keys
    }
}

/// Attends every row of `item` over `keys` and hands the results to `sink`.
fn item_rows<Q: Rows, K: Rows, V: Rows, O: Float>(
    job: &Job<'_, Q, K, V>,
    ws: &mut Workspace<'_>,
    item: Item,
    keys: Range<usize>,
    mut sink: Sink<'_, O>,
) {
    let p = job.p;
    let g = p.group();
    let d = p.head_dim;
    if item.rows() == 0 {
        return;
    }
    for hk in item.h0 / g..=(item.h1 - 1) / g {
        let hs = item.h0.max(hk * g);
        let he = item.h1.min((hk + 1) * g);
        let gh = he - hs;
        let total = (item.i1 - item.i0) * gh;
        let mut m0 = 0;
        while m0 < total {
            let mr = ws.rows.min(total - m0);
            let rows = RowSet {
                b: item.b,
                hk,
                i0: item.i0,
                hs,
                gh,
                m0,
                mr,
            };
            block(job, ws, &rows, keys.clone());
            for mm in 0..mr {
                let (i, h) = rows.at(mm);
                sink.put(item.row_index(p.seq_dim, i, h), mm, ws, d);
            }
            m0 += mr;
        }
    }
}

/// Online-softmax attention of one row set over `keys`, leaving `(max, sum, acc)` per
/// row in the workspace.
fn block<Q: Rows, K: Rows, V: Rows>(
    job: &Job<'_, Q, K, V>,
    ws: &mut Workspace<'_>,
    rows: &RowSet,
    keys: Range<usize>,
) {
    let p = job.p;
    let d = p.head_dim;
    let kb = ws.keys;
    let mr = rows.mr;
    let q: &mut [f32] = ws.q;
    let s: &mut [f32] = ws.s;
    let m: &mut [f32] = ws.m;
    let l: &mut [f32] = ws.l;
    let acc: &mut [f32] = ws.acc;
    for (mm, dst) in q.chunks_exact_mut(d).take(mr).enumerate() {
        let (i, h) = rows.at(mm);
        job.q.load_row(rows.b, i, h, p.scale, dst);
    }
    // Recycled scratch is dirty: initialise everything this block reads.
    m[..mr].fill(f32::NEG_INFINITY);
    l[..mr].fill(0.0);
    acc[..mr * d].fill(0.0);
    let (last_i, _) = rows.at(mr - 1);
    let hi = keys.end.min(p.key_limit(last_i));
    let mut n0 = keys.start;
    while n0 < hi {
        let n = kb.min(hi - n0);
        let (kt, ks) = job.k.tile(rows.b, n0, n, rows.hk, ws.kbuf);
        // Four or more rows: all their scores against the tile at once, from the tile
        // transposed (scores past a row's causal limit are computed and not read).
        let blocked = mr >= attention::QUERY_ROWS
            && attention::scores_transposed_is_fast(job.isa)
            && attention::transpose_keys(kt, ks, n, d, ws.kt, KT_STRIDE)
            && attention::scores_transposed(job.isa, q, d, mr, ws.kt, KT_STRIDE, n, s, kb);
        for mm in 0..mr {
            let (i, _) = rows.at(mm);
            let valid = p.key_limit(i).saturating_sub(n0).min(n);
            if valid == 0 {
                continue;
            }
            let sv = &mut s[mm * kb..mm * kb + valid];
            if !blocked {
                attention::scores(job.isa, &q[mm * d..(mm + 1) * d], kt, ks, sv);
            }
            job.mask.add_row(i * p.mask_stride + n0, sv);
            let old = m[mm];
            let bmax = attention::max(sv);
            let new = if bmax > old { bmax } else { old };
            if new == f32::NEG_INFINITY {
                // Everything so far is masked: this block contributes nothing.
                sv.fill(0.0);
                continue;
            }
            let sum = attention::exp_shift_sum(job.isa, sv, new);
            let alpha = attention::exp_nonpositive(job.isa, old - new);
            l[mm] = l[mm] * alpha + sum;
            if alpha != 1.0 {
                attention::scale(&mut acc[mm * d..(mm + 1) * d], alpha);
            }
            m[mm] = new;
        }
        let (vt, vs) = job.v.tile(rows.b, n0, n, rows.hk, ws.vbuf);
        let valid = |mm: usize| {
            let (i, _) = rows.at(mm);
            let v = p.key_limit(i).saturating_sub(n0).min(n);
            if m[mm] == f32::NEG_INFINITY { 0 } else { v }
        };
        let mut mm = 0;
        while mm < mr {
            // Four rows at once: one pass over the values for all of them. A row's
            // weights past its causal limit are set to 0, which adds exactly nothing
            // (the same bits as four one-row passes, as long as the values there are
            // finite, which cache rows below the last row's limit are unless the
            // model overflowed).
            let group = mm..mm + attention::QUERY_ROWS;
            if group.end <= mr {
                let reach = group.clone().map(valid).max().unwrap_or(0);
                for r in group.clone() {
                    s[r * kb + valid(r)..r * kb + reach].fill(0.0);
                }
                if reach > 0
                    && attention::accumulate_rows(
                        job.isa,
                        &s[mm * kb..],
                        kb,
                        reach,
                        vt,
                        vs,
                        &mut acc[mm * d..],
                        d,
                    )
                {
                    mm = group.end;
                    continue;
                }
            }
            let v = valid(mm);
            if v > 0 {
                attention::accumulate(
                    job.isa,
                    &s[mm * kb..mm * kb + v],
                    vt,
                    vs,
                    &mut acc[mm * d..(mm + 1) * d],
                );
            }
            mm += 1;
        }
        n0 += n;
    }
}

/// Runs attention: `out` (`[B, S_q, H_q, D]` in `p.seq_dim` layout) from `q`, `k`, `v`
/// and the mask, with `scratch` of at least [`Plan::scratch_len`] elements.
#[allow(clippy::too_many_arguments)]
pub fn run<Q: Rows, K: Rows, V: Rows, O: Float>(
    pool: &ThreadPool,
    p: &Problem,
    plan: &Plan,
    q: &Q,
    k: &K,
    v: &V,
    mask: Mask<'_>,
    out: &mut [O],
    scratch: &mut [f32],
    isa: Isa,
) -> Result<(), KernelError> {
    if p.is_empty() {
        return Ok(());
    }
    check_sources(p, q, k, v, out.len())?;
    check_mask(p, &mask)?;
    if (k.converts() && plan.slot.kbuf == 0) || (v.converts() && plan.slot.vbuf == 0) {
        return Err(KernelError::invalid(
            "attention: the plan has no conversion buffer for a converted source",
        ));
    }
    let need = plan.scratch_len()?;
    let scratch = scratch
        .get_mut(..need)
        .ok_or_else(|| KernelError::invalid("attention: scratch is too small for the plan"))?;
    let (slot_buf, rest) = scratch.split_at_mut(plan.slots_len()?);
    let (partials, merge_row) = rest.split_at_mut(plan.partials_len()?);
    let slot_buf = &mut slot_buf[..plan.tasks * plan.slot.total];
    let job = Job {
        p,
        q,
        k,
        v,
        mask,
        isa,
    };
    let slots = Mutex::new(slot_buf.chunks_mut(plan.slot.total.max(1)));
    let failed = AtomicBool::new(false);
    let grid = plan.grid;
    let d = p.head_dim;
    if plan.splits == 1 {
        let queue = Mutex::new(OutItems::new(grid, out, d));
        pool.parallel_for(0..plan.tasks, 1, |_, _| {
            let Some(mut ws) = take_workspace(&slots, &plan.slot, &failed) else {
                return;
            };
            while let Some((item, chunk)) = pop(&queue) {
                let keys = 0..item_key_end(p, &item);
                job.item(&mut ws, item, keys, Sink::Out(chunk));
            }
        });
    } else {
        let splits = plan.splits;
        let rows = grid.max_rows();
        {
            let units = grid.count() * splits;
            let chunks = partials.chunks_mut(plan.unit_len.max(1)).take(units);
            let queue = Mutex::new(chunks.enumerate());
            pool.parallel_for(0..plan.tasks, 1, |_, _| {
                let Some(mut ws) = take_workspace(&slots, &plan.slot, &failed) else {
                    return;
                };
                while let Some((unit, buf)) = pop(&queue) {
                    let item = grid.item(unit / splits);
                    let split = unit % splits;
                    let end = item_key_end(p, &item);
                    let keys = end * split / splits..end * (split + 1) / splits;
                    job.item::<O>(&mut ws, item, keys, Sink::Partial { buf, rows });
                }
            });
        }
        merge(p, plan, partials, merge_row, out);
    }
    if failed.load(Ordering::Relaxed) {
        return Err(KernelError::invalid(
            "attention: scratch slot layout mismatch",
        ));
    }
    Ok(())
}

/// Combines the split-K partials of every row into the output.
fn merge<O: Float>(p: &Problem, plan: &Plan, partials: &[f32], row: &mut [f32], out: &mut [O]) {
    let d = p.head_dim;
    let splits = plan.splits;
    let rows = plan.grid.max_rows();
    let unit = |idx: usize, s: usize| {
        let at = (idx * splits + s) * plan.unit_len;
        partials.get(at..at + plan.unit_len).unwrap_or(&[])
    };
    let row = &mut row[..d];
    for (idx, (item, chunk)) in OutItems::new(plan.grid, out, d).enumerate() {
        for (r, dst) in chunk.chunks_exact_mut(d).take(item.rows()).enumerate() {
            let stat = |s: usize, k: usize| unit(idx, s).get(k * rows + r).copied();
            let mx = (0..splits)
                .filter_map(|s| stat(s, 0))
                .fold(f32::NEG_INFINITY, f32::max);
            row.fill(0.0);
            let mut sum = 0.0f32;
            if mx > f32::NEG_INFINITY {
                for s in 0..splits {
                    let (Some(ms), Some(ls)) = (stat(s, 0), stat(s, 1)) else {
                        continue;
                    };
                    if ms == f32::NEG_INFINITY {
                        continue;
                    }
                    let w = (ms - mx).exp();
                    sum += ls * w;
                    let at = 2 * rows + r * d;
                    let acc = unit(idx, s).get(at..at + d).unwrap_or(&[]);
                    for (o, a) in row.iter_mut().zip(acc) {
                        *o += a * w;
                    }
                }
            }
            let inv = 1.0 / sum;
            for (o, a) in dst.iter_mut().zip(row.iter()) {
                *o = O::from_f32(a * inv);
            }
        }
    }
}

fn check_sources<Q: Rows, K: Rows, V: Rows>(
    p: &Problem,
    q: &Q,
    k: &K,
    v: &V,
    out_len: usize,
) -> Result<(), KernelError> {
    let (ql, kl, vl) = (q.layout(), k.layout(), v.layout());
    let q_ok = (ql.batch, ql.seq, ql.heads, ql.width) == (p.batch, p.q_len, p.q_heads, p.head_dim);
    let kv_ok = |l: &RowLayout| {
        l.batch == p.batch && l.seq >= p.n_keys && l.heads == p.kv_heads && l.width == p.head_dim
    };
    let heads_ok = p.kv_heads > 0 && p.q_heads.is_multiple_of(p.kv_heads);
    if !q_ok || !kv_ok(kl) || !kv_ok(vl) || !heads_ok || p.out_len() != Some(out_len) {
        return Err(KernelError::invalid(format!(
            "attention: sources q {ql:?}, k {kl:?}, v {vl:?} and {out_len} outputs do not match {p:?}"
        )));
    }
    Ok(())
}

fn check_mask(p: &Problem, mask: &Mask<'_>) -> Result<(), KernelError> {
    let len = match mask {
        Mask::None => return Ok(()),
        Mask::F32(m) => m.len(),
        Mask::F16(m) => m.len(),
        Mask::BF16(m) => m.len(),
    };
    let need = p.q_len.checked_mul(p.mask_stride);
    if p.mask_stride < p.n_keys || need.is_none_or(|n| n > len) {
        return Err(KernelError::invalid(format!(
            "attention: mask of {len} elements (row stride {}) does not cover {} queries x {} keys",
            p.mask_stride, p.q_len, p.n_keys
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Data {
        p: Problem,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
    }

    fn data(p: Problem, kv_len: usize) -> Data {
        let mut x = 0x1234_5678u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1 << 23) as f32 - 1.0
        };
        let q = (0..p.batch * p.q_len * p.q_heads * p.head_dim)
            .map(|_| next())
            .collect();
        let kv = p.batch * kv_len * p.kv_heads * p.head_dim;
        let k = (0..kv).map(|_| next()).collect();
        let v = (0..kv).map(|_| next()).collect();
        Data { p, q, k, v }
    }

    fn problem(q_len: usize, start_pos: usize, kv_len: usize) -> Problem {
        let _ = kv_len;
        Problem {
            batch: 1,
            q_len,
            q_heads: 6,
            kv_heads: 2,
            head_dim: 19,
            n_keys: start_pos + q_len,
            start_pos,
            causal: true,
            scale: 0.3,
            seq_dim: SeqDim::One,
            mask_stride: kv_len,
        }
    }

    /// Runs the engine with scratch pre-filled with `fill`.
    fn run_with(d: &Data, kv_len: usize, threads: usize, isa: Isa, fill: f32) -> Vec<f32> {
        let p = &d.p;
        let pool = ThreadPool::new(threads).unwrap();
        let lay_q = RowLayout::new(SeqDim::One, p.batch, p.q_len, p.q_heads, p.head_dim);
        let lay_kv = RowLayout::new(SeqDim::One, p.batch, kv_len, p.kv_heads, p.head_dim);
        let q = FloatRows::new(&d.q, lay_q).unwrap();
        let k = FloatRows::new(&d.k, lay_kv).unwrap();
        let v = FloatRows::new(&d.v, lay_kv).unwrap();
        let plan = Plan::new(p, threads, false, false).unwrap();
        let mut scratch = vec![fill; plan.scratch_len().unwrap()];
        let mut out = vec![0f32; d.q.len()];
        run(
            &pool,
            p,
            &plan,
            &q,
            &k,
            &v,
            Mask::None,
            &mut out,
            &mut scratch,
            isa,
        )
        .unwrap();
        out
    }

    #[test]
    fn dirty_scratch_does_not_leak_into_results() {
        for (q_len, start, threads) in [(1, 700, 1), (1, 700, 3), (37, 5, 2), (3, 300, 4)] {
            let kv_len = start + q_len + 3;
            let d = data(problem(q_len, start, kv_len), kv_len);
            let clean = run_with(&d, kv_len, threads, Isa::Scalar, 0.0);
            for garbage in [f32::NAN, f32::INFINITY, -1e30, 12345.0] {
                let dirty = run_with(&d, kv_len, threads, Isa::Scalar, garbage);
                assert_eq!(clean, dirty, "scratch filled with {garbage}");
            }
        }
    }

    #[test]
    fn simd_matches_its_scalar_twin() {
        for (q_len, start, threads) in [(1, 900, 1), (1, 900, 2), (50, 0, 1), (50, 77, 3)] {
            let kv_len = start + q_len;
            let d = data(problem(q_len, start, kv_len), kv_len);
            let portable = run_with(&d, kv_len, threads, Isa::Scalar, 0.0);
            let best = run_with(&d, kv_len, threads, etch_linalg::dispatch().attention, 0.0);
            for (a, b) in portable.iter().zip(&best) {
                assert!((a - b).abs() < 2e-6, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn plans() {
        // Decode on 2 threads with 3 KV groups and 2048 keys: split-K.
        let mut p = problem(1, 2047, 2048);
        p.q_heads = 9;
        p.kv_heads = 3;
        p.head_dim = 64;
        let plan = Plan::new(&p, 2, false, false).unwrap();
        assert!(plan.splits() > 1);
        assert_eq!(plan.tasks(), 2);
        // Serial: no split.
        assert_eq!(Plan::new(&p, 1, false, false).unwrap().splits(), 1);
        // Conversion buffers exist only for converted sources, and do not grow with
        // the cache: tiles, never the whole cache.
        let plain = Plan::new(&p, 1, false, false)
            .unwrap()
            .scratch_len()
            .unwrap();
        let conv = Plan::new(&p, 1, true, true).unwrap().scratch_len().unwrap();
        assert_eq!(conv - plain, 2 * KEY_BLOCK * 64);
        let mut longer = p;
        longer.n_keys = 8192;
        longer.start_pos = 8191;
        assert_eq!(
            Plan::new(&longer, 1, true, true)
                .unwrap()
                .scratch_len()
                .unwrap(),
            conv
        );
        // Prefill on 2 threads: items over query blocks, no split.
        let prefill = problem(128, 0, 128);
        let plan = Plan::new(&prefill, 2, false, false).unwrap();
        assert_eq!(plan.splits(), 1);
        assert!(plan.grid.count() >= 4);
    }

    #[test]
    fn mismatched_sources_are_errors() {
        let p = problem(2, 3, 8);
        let d = data(p, 8);
        let pool = ThreadPool::serial();
        let lay = |s, h| RowLayout::new(SeqDim::One, 1, s, h, 19);
        let q = FloatRows::new(&d.q, lay(2, 6)).unwrap();
        let k = FloatRows::new(&d.k, lay(8, 2)).unwrap();
        let plan = Plan::new(&p, 1, false, false).unwrap();
        let mut scratch = vec![0f32; plan.scratch_len().unwrap()];
        let mut out = vec![0f32; d.q.len()];
        // Runs with `k` as keys and values; true when the call is rejected.
        let rejects = |p: &Problem,
                       q: &FloatRows<'_, f32>,
                       mask: Mask<'_>,
                       out: &mut [f32],
                       scratch: &mut [f32]| {
            run(&pool, p, &plan, q, &k, &k, mask, out, scratch, Isa::Scalar).is_err()
        };
        // k given as the query: wrong shape.
        assert!(rejects(&p, &k, Mask::None, &mut out, &mut scratch));
        // out too short, scratch too short.
        let mut short = vec![0f32; 3];
        assert!(rejects(&p, &q, Mask::None, &mut short, &mut scratch));
        assert!(rejects(&p, &q, Mask::None, &mut out, &mut short));
        // A short mask.
        let mut pm = p;
        pm.causal = false;
        pm.n_keys = 8;
        let m = [0f32; 9];
        assert!(rejects(&pm, &q, Mask::F32(&m), &mut out, &mut scratch));
        // Data shorter than its layout.
        assert!(FloatRows::new(&d.q[..5], lay(2, 6)).is_err());
        assert!(
            QuantRows::new(
                &[0i8; 4],
                &[1.0],
                &[0],
                SeqDim::One,
                RowLayout::new(SeqDim::One, 1, 2, 1, 2)
            )
            .is_err()
        );
    }
}
