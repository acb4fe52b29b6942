//! Reductions: `sum`, `mean`, `prod`, `amax`, `amin`, `max`, `min` (over one dim,
//! with indices, or over all), `any`, `argmax`, `argmin`, `var`, `var_mean`.
//!
//! Each output element streams its reduced elements, in row-major order, through a
//! [`Reducer`] in blocks: contiguous runs of the accumulator type are read in place
//! (the RMSNorm `mean(x², -1)` case), anything else is converted through a stack
//! buffer. `sum` and `mean` accumulate one element after another in row-major order,
//! as the official portable kernels do (`kernels/portable/cpu/op_mean.cpp`,
//! `op_sum.cpp`: `acc += x` in the accumulator type), so that their results match it
//! to the bit: an RMSNorm's `mean(x², -1)` one ulp away is enough to flip the rounding
//! of a dynamically quantized activation downstream. Outputs are split across the pool
//! when there are many of them.

use std::array;

use etch_base::ScalarType;

use super::elementwise::BLOCK;
use super::elementwise::dtype::{Bool8, Element, In, Out, narrow_slice, narrows, with_compute};
use super::elementwise::num::Num;
use crate::ops::same_dtype;
use crate::ops::shape::common::advance_index_with_offsets;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{
    Args, GRAIN_SIZE, IntList, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor,
    normalize_dim,
};

mod inner_runs;

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::sum.IntList_out", |c, a| sum_out(c, a, false));
    r.register("aten::mean.out", |c, a| sum_out(c, a, true));
    r.register("aten::mean.dtype_out", mean_all);
    r.register("aten::prod.int_out", prod_dim);
    r.register("aten::prod.out", prod_all);
    r.register("aten::amax.out", |c, a| extremum(c, a, true));
    r.register("aten::amin.out", |c, a| extremum(c, a, false));
    r.register("aten::any.out", any_dim);
    r.register("aten::any.dims_out", any_dims);
    r.register("aten::any.all_out", any_all);
    r.register("aten::argmax.out", |c, a| arg_extremum(c, a, true));
    r.register("aten::argmin.out", |c, a| arg_extremum(c, a, false));
    r.register("aten::max.dim_max", |c, a| extremum_dim(c, a, true));
    r.register("aten::min.dim_min", |c, a| extremum_dim(c, a, false));
    r.register("aten::max.unary_out", |c, a| extremum_all(c, a, true));
    r.register("aten::min.unary_out", |c, a| extremum_all(c, a, false));
    r.register("aten::var.correction_out", var_correction);
    r.register("aten::var.out", var_unbiased);
    r.register("aten::var_mean.correction_out", var_mean);
}

/// Streams the reduced elements of one output.
pub trait Reducer<A: Element>: Sync {
    type State;
    type Out: Element;
    fn start(&self) -> Self::State;
    /// `xs` are the reduced elements at flat positions `pos..pos + xs.len()`.
    fn feed(&self, state: &mut Self::State, pos: usize, xs: &[A]);
    fn finish(&self, state: Self::State, count: usize) -> Self::Out;

    /// Feeds [`ROWS`] whole contiguous runs of equal length, one per state, with the
    /// result `feed` gives row by row, and returns true; or returns false, feeding
    /// nothing (the default). A reducer whose state is one accumulator implements it
    /// to interleave the rows: the same bits, with the dependency chains of eight rows
    /// in flight instead of one.
    fn feed_rows(&self, states: &mut [Self::State; ROWS], rows: [&[A]; ROWS]) -> bool {
        let _ = (states, rows);
        false
    }
}

/// Outputs reduced together when each reduces one contiguous run
/// ([`Reducer::feed_rows`]).
pub const ROWS: usize = 8;

/// Which dims a reduction folds, from an optional dim list (absent or empty: all).
pub fn dim_mask(rank: usize, dims: Option<&[i64]>) -> Result<[bool; MAX_RANK], KernelError> {
    let mut mask = [false; MAX_RANK];
    match dims {
        None | Some([]) => mask[..rank].iter_mut().for_each(|m| *m = true),
        Some(list) => {
            for &d in list {
                let d = normalize_dim(d, rank)?;
                if rank == 0 {
                    continue;
                }
                if std::mem::replace(&mut mask[d], true) {
                    return Err(KernelError::invalid(format!(
                        "dim {d} appears multiple times in the list of dims"
                    )));
                }
            }
        }
    }
    Ok(mask)
}

/// The output sizes of reducing `sizes` over `mask`.
pub fn reduced_sizes<'b>(
    sizes: &[usize],
    mask: &[bool; MAX_RANK],
    keepdim: bool,
    buf: &'b mut [usize; MAX_RANK],
) -> &'b [usize] {
    let mut n = 0;
    for (d, &s) in sizes.iter().enumerate() {
        if mask[d] {
            if keepdim {
                buf[n] = 1;
                n += 1;
            }
        } else {
            buf[n] = s;
            n += 1;
        }
    }
    &buf[..n]
}

/// The walk of one reduction: kept dims (with input and output strides) and
/// coalesced reduced dims.
struct RPlan {
    k_rank: usize,
    k_sizes: [usize; MAX_RANK],
    k_in: [usize; MAX_RANK],
    k_out: [usize; MAX_RANK],
    r_rank: usize,
    r_sizes: [usize; MAX_RANK],
    r_in: [usize; MAX_RANK],
    count: usize,
}

impl RPlan {
    fn new(input: &Tensor, mask: &[bool; MAX_RANK], keepdim: bool, out: &Tensor) -> Self {
        let mut p = RPlan {
            k_rank: 0,
            k_sizes: [0; MAX_RANK],
            k_in: [0; MAX_RANK],
            k_out: [0; MAX_RANK],
            r_rank: 0,
            r_sizes: [0; MAX_RANK],
            r_in: [0; MAX_RANK],
            count: 1,
        };
        let mut od = 0;
        for (d, (&s, &st)) in input.sizes().iter().zip(input.strides()).enumerate() {
            if mask[d] {
                p.count *= s;
                if keepdim {
                    od += 1;
                }
                if s == 1 {
                    continue;
                }
                if p.r_rank > 0 && p.r_in[p.r_rank - 1] == st * s {
                    p.r_sizes[p.r_rank - 1] *= s;
                    p.r_in[p.r_rank - 1] = st;
                } else {
                    p.r_sizes[p.r_rank] = s;
                    p.r_in[p.r_rank] = st;
                    p.r_rank += 1;
                }
            } else {
                p.k_sizes[p.k_rank] = s;
                p.k_in[p.k_rank] = st;
                p.k_out[p.k_rank] = out.strides().get(od).copied().unwrap_or(0);
                p.k_rank += 1;
                od += 1;
            }
        }
        if p.r_rank == 0 {
            p.r_rank = 1;
            p.r_sizes[0] = if p.count == 0 { 0 } else { 1 };
            p.r_in[0] = 0;
        }
        p
    }

    fn out_numel(&self) -> usize {
        self.k_sizes[..self.k_rank].iter().product()
    }

    /// Input and output offsets of output element `i` (kept dims row-major).
    fn kept_offsets(&self, mut i: usize) -> (usize, usize) {
        let (mut inp, mut out) = (0, 0);
        for d in (0..self.k_rank).rev() {
            let s = self.k_sizes[d];
            let j = i % s;
            i /= s;
            inp += j * self.k_in[d];
            out += j * self.k_out[d];
        }
        (inp, out)
    }

    fn max_in_offset(&self) -> usize {
        let k: usize = (0..self.k_rank)
            .map(|d| self.k_sizes[d].saturating_sub(1) * self.k_in[d])
            .sum();
        let r: usize = (0..self.r_rank)
            .map(|d| self.r_sizes[d].saturating_sub(1) * self.r_in[d])
            .sum();
        k + r
    }

    fn max_out_offset(&self) -> usize {
        (0..self.k_rank)
            .map(|d| self.k_sizes[d].saturating_sub(1) * self.k_out[d])
            .sum()
    }
}

/// Reduces `input` over `mask` into `out` (already resized): one [`Reducer`] pass per
/// output element. Inputs are converted to `A`, rounded through `narrow` if given.
pub fn reduce<A: Element, R: Reducer<A>>(
    ctx: &KernelContext<'_>,
    input: &Tensor,
    mask: &[bool; MAX_RANK],
    keepdim: bool,
    out: &Tensor,
    narrow: Option<ScalarType>,
    reducer: &R,
) -> Result<(), KernelError> {
    let plan = RPlan::new(input, mask, keepdim, out);
    let n_out = plan.out_numel();
    if n_out != out.numel() {
        return Err(KernelError::invalid(format!(
            "reduction out has {} elements, expected {n_out}",
            out.numel()
        )));
    }
    if n_out == 0 {
        return Ok(());
    }
    let data = In::read(ctx, input)?;
    if plan.count > 0 && plan.max_in_offset() >= data.len() {
        return Err(KernelError::invalid("input strides exceed its storage"));
    }
    let mut dst = Out::write(ctx, out)?;
    if plan.max_out_offset() >= dst.len() {
        return Err(KernelError::invalid("out strides exceed its storage"));
    }
    let narrow = narrow.filter(|&t| t != input.dtype() && narrows::<A>(t));
    let direct = if narrow.is_none() {
        data.as_slice::<A>()
    } else {
        None
    };
    let job = Job {
        plan: &plan,
        data,
        direct,
        narrow,
        reducer,
    };
    let threads = ctx.pool().threads();
    let total = n_out.saturating_mul(plan.count.max(1));
    if threads > 1 && n_out >= 2 && total >= GRAIN_SIZE && out.is_contiguous() {
        let per_task = n_out.div_ceil(threads * 4).max(1);
        dst.par_chunks(ctx.pool(), per_task, &|start, mut part| {
            job.range(start, part.len(), |i, _, v| part.set(i, v));
        });
    } else {
        job.range(0, n_out, |_, o, v| dst.set(o, v));
    }
    Ok(())
}

struct Job<'a, 'p, A: Element, R> {
    plan: &'p RPlan,
    data: In<'a>,
    direct: Option<&'a [A]>,
    narrow: Option<ScalarType>,
    reducer: &'p R,
}

impl<A: Element, R: Reducer<A>> Job<'_, '_, A, R> {
    /// The reductions of [`ROWS`] output elements at once when each reduces one
    /// contiguous run read in place (`mean(x², -1)`); `None` for any other shape.
    fn rows(&self, bases: [usize; ROWS]) -> Option<[R::Out; ROWS]> {
        let p = self.plan;
        let data = self.direct?;
        if p.r_rank != 1 || p.r_in[0] != 1 || p.count == 0 {
            return None;
        }
        let inner = p.r_sizes[0];
        let mut rows: [&[A]; ROWS] = [&[]; ROWS];
        for (row, &base) in rows.iter_mut().zip(&bases) {
            *row = data.get(base..base + inner)?;
        }
        let mut states: [R::State; ROWS] = std::array::from_fn(|_| self.reducer.start());
        self.reducer
            .feed_rows(&mut states, rows)
            .then(|| states.map(|st| self.reducer.finish(st, p.count)))
    }

    /// Output elements `first..first + n` (kept dims row-major) through `set(i, value)`:
    /// [`ROWS`] at a time where [`Job::rows`] applies, one at a time otherwise.
    fn range(&self, first: usize, n: usize, mut set: impl FnMut(usize, usize, R::Out)) {
        let mut i = 0;
        while i + ROWS <= n {
            let offsets: [(usize, usize); ROWS] =
                std::array::from_fn(|r| self.plan.kept_offsets(first + i + r));
            match self.rows(offsets.map(|(inp, _)| inp)) {
                Some(values) => {
                    for (r, v) in values.into_iter().enumerate() {
                        set(i + r, offsets[r].1, v);
                    }
                    i += ROWS;
                }
                None => break,
            }
        }
        for i in i..n {
            let (inp, o) = self.plan.kept_offsets(first + i);
            set(i, o, self.one(inp));
        }
    }

    /// The reduction of the output element whose kept index starts at `base`.
    fn one(&self, base: usize) -> R::Out {
        let p = self.plan;
        let mut st = self.reducer.start();
        if p.count == 0 {
            return self.reducer.finish(st, 0);
        }
        let last = p.r_rank - 1;
        let inner = p.r_sizes[last];
        let stride = p.r_in[last];
        let rows: usize = p.r_sizes[..last].iter().product();
        let mut idx = [0usize; MAX_RANK];
        let mut off = base;
        let mut pos = 0;
        let mut buf = [A::default(); BLOCK];
        for _ in 0..rows {
            match self.direct {
                Some(d) if stride == 1 => {
                    for (j, chunk) in d[off..off + inner].chunks(BLOCK).enumerate() {
                        self.reducer.feed(&mut st, pos + j * BLOCK, chunk);
                    }
                }
                _ => {
                    let mut j = 0;
                    while j < inner {
                        let n = BLOCK.min(inner - j);
                        let b = &mut buf[..n];
                        self.data.load(off + j * stride, stride, b);
                        if let Some(t) = self.narrow {
                            narrow_slice(t, b);
                        }
                        self.reducer.feed(&mut st, pos + j, b);
                        j += n;
                    }
                }
            }
            pos += inner;
            // Next reduced row.
            advance_index_with_offsets(
                &mut idx[..last],
                &p.r_sizes,
                [&p.r_in],
                array::from_mut(&mut off),
            );
        }
        self.reducer.finish(st, p.count)
    }
}

/// Eight-lane sum of a block, combined pairwise.
#[inline]
pub fn block_sum<A: Num>(xs: &[A]) -> A {
    let mut acc = [A::ZERO; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = acc[i].add(c[i]);
        }
    }
    let mut tail = A::ZERO;
    for &x in chunks.remainder() {
        tail = tail.add(x);
    }
    let a = acc[0].add(acc[1]).add(acc[2].add(acc[3]));
    let b = acc[4].add(acc[5]).add(acc[6].add(acc[7]));
    a.add(b).add(tail)
}

/// Sums pushed block sums pairwise, like a binary counter.
pub struct Pairwise<A> {
    levels: [A; 64],
    used: u64,
}

impl<A: Num> Pairwise<A> {
    pub fn new() -> Self {
        Self {
            levels: [A::ZERO; 64],
            used: 0,
        }
    }

    pub fn push(&mut self, mut v: A) {
        let mut l = 0;
        while l < 63 && self.used & (1 << l) != 0 {
            v = self.levels[l].add(v);
            self.used &= !(1 << l);
            l += 1;
        }
        self.levels[l] = v;
        self.used |= 1 << l;
    }

    pub fn total(&self) -> A {
        let mut t = A::ZERO;
        for l in 0..64 {
            if self.used & (1 << l) != 0 {
                t = self.levels[l].add(t);
            }
        }
        t
    }
}

impl<A: Num> Default for Pairwise<A> {
    fn default() -> Self {
        Self::new()
    }
}

/// The pairwise sum of a slice (blocks of [`BLOCK`]).
pub fn pairwise_sum<A: Num>(xs: &[A]) -> A {
    let mut p = Pairwise::new();
    for c in xs.chunks(BLOCK) {
        p.push(block_sum(c));
    }
    p.total()
}

struct Sum {
    mean: bool,
}

impl<A: Num> Reducer<A> for Sum {
    type State = A;
    type Out = A;
    fn start(&self) -> Self::State {
        A::ZERO
    }
    fn feed(&self, st: &mut Self::State, _: usize, xs: &[A]) {
        for &x in xs {
            *st = st.add(x);
        }
    }
    fn feed_rows(&self, states: &mut [A; ROWS], rows: [&[A]; ROWS]) -> bool {
        let n = rows[0].len();
        if rows.iter().any(|r| r.len() != n) {
            return false;
        }
        for j in 0..n {
            for (st, row) in states.iter_mut().zip(&rows) {
                *st = st.add(row[j]);
            }
        }
        true
    }
    fn finish(&self, st: Self::State, count: usize) -> A {
        let s = st;
        if self.mean {
            s.div(A::from_i64(count as i64))
        } else {
            s
        }
    }
}

struct Extremum {
    max: bool,
}

impl<A: Num> Reducer<A> for Extremum {
    type State = Option<A>;
    type Out = A;
    fn start(&self) -> Self::State {
        None
    }
    fn feed(&self, st: &mut Self::State, _: usize, xs: &[A]) {
        let Some((&first, rest)) = xs.split_first() else {
            return;
        };
        let mut m = st.unwrap_or(first);
        if self.max {
            for &x in rest {
                m = m.maximum(x);
            }
            m = m.maximum(first);
        } else {
            for &x in rest {
                m = m.minimum(x);
            }
            m = m.minimum(first);
        }
        *st = Some(m);
    }
    fn finish(&self, st: Self::State, _: usize) -> A {
        st.unwrap_or(A::ZERO)
    }
}

/// Keeps the first extreme element seen and its position, as PyTorch's `argmax` and
/// `max.dim` pick it: a NaN beats every number and the first NaN stays; among equal
/// numbers the first stays.
#[inline(always)]
fn keep_first_extreme<A: Num>(max: bool, st: &mut Option<(A, usize)>, pos: usize, xs: &[A]) {
    for (j, &x) in xs.iter().enumerate() {
        let better = match st {
            None => true,
            Some((b, _)) => {
                if b.is_nan() {
                    false
                } else if x.is_nan() {
                    true
                } else if max {
                    x > *b
                } else {
                    x < *b
                }
            }
        };
        if better {
            *st = Some((x, pos + j));
        }
    }
}

/// The position of the first extreme element ([`keep_first_extreme`]).
struct ArgExtremum {
    max: bool,
}

impl<A: Num> Reducer<A> for ArgExtremum {
    type State = Option<(A, usize)>;
    type Out = i64;
    fn start(&self) -> Self::State {
        None
    }
    fn feed(&self, st: &mut Self::State, pos: usize, xs: &[A]) {
        keep_first_extreme(self.max, st, pos, xs);
    }
    fn finish(&self, st: Self::State, _: usize) -> i64 {
        st.map(|(_, i)| i as i64).unwrap_or(0)
    }
}

/// The value of the first extreme element ([`keep_first_extreme`]): the element at
/// [`ArgExtremum`]'s position, so that a `max.dim` value and index agree (for signed
/// zeros too).
struct ExtremeValue {
    max: bool,
}

impl<A: Num> Reducer<A> for ExtremeValue {
    type State = Option<(A, usize)>;
    type Out = A;
    fn start(&self) -> Self::State {
        None
    }
    fn feed(&self, st: &mut Self::State, pos: usize, xs: &[A]) {
        keep_first_extreme(self.max, st, pos, xs);
    }
    fn finish(&self, st: Self::State, _: usize) -> A {
        st.map(|(v, _)| v).unwrap_or(A::ZERO)
    }
}

struct Any;

impl Reducer<Bool8> for Any {
    type State = bool;
    type Out = Bool8;
    fn start(&self) -> bool {
        false
    }
    fn feed(&self, st: &mut bool, _: usize, xs: &[Bool8]) {
        if !*st {
            *st = xs.iter().any(|b| b.0 != 0);
        }
    }
    fn finish(&self, st: bool, _: usize) -> Bool8 {
        Bool8(st as u8)
    }
}

/// Welford's streaming mean and variance, in f64: the sum of squared deviations over
/// `count - correction`. Callers handle a count of 0 and a denominator <= 0
/// ([`var_is_nan`]).
struct Var {
    correction: f64,
}

impl Reducer<f64> for Var {
    type State = (f64, f64, f64);
    type Out = f64;
    fn start(&self) -> Self::State {
        (0.0, 0.0, 0.0)
    }
    fn feed(&self, st: &mut Self::State, _: usize, xs: &[f64]) {
        let (n, mean, m2) = st;
        for &x in xs {
            *n += 1.0;
            let d = x - *mean;
            *mean += d / *n;
            *m2 += d * (x - *mean);
        }
    }
    fn finish(&self, st: Self::State, _: usize) -> f64 {
        let (n, _, m2) = st;
        m2 / (n - self.correction)
    }
}

/// Upstream's rule for a variance with no valid denominator: every output is NaN
/// when nothing is reduced or `count - correction <= 0` (PyTorch gives inf for a
/// positive sum of squares over a zero denominator; the official runtime gives NaN).
fn var_is_nan(count: usize, correction: f64) -> bool {
    let denominator = count as f64 - correction;
    count == 0 || denominator.is_nan() || denominator <= 0.0
}

/// The dims of an `int[]?` argument, read into `buf`.
/// The reduction mask of an `int[]? dim` argument over `x` (absent or empty: all dims).
fn mask_of(x: &Tensor, dim: Option<IntList<'_>>) -> Result<[bool; MAX_RANK], KernelError> {
    let mut buf = [0i64; MAX_RANK];
    let dims = dim.map(|l| l.read_into(&mut buf)).transpose()?;
    dim_mask(x.rank(), dims)
}

/// One reduction op's operands: the input, the dims it folds and the out tensor.
struct Reduction {
    x: Tensor,
    mask: [bool; MAX_RANK],
    keepdim: bool,
    out: Tensor,
}

impl Reduction {
    /// Resizes `out` to the result of reducing `x` over `mask`.
    fn new(
        a: &mut Args<'_>,
        x: Tensor,
        mask: [bool; MAX_RANK],
        keepdim: bool,
        out: OutArg,
    ) -> Result<Self, KernelError> {
        let mut sb = [0usize; MAX_RANK];
        let sizes = reduced_sizes(x.sizes(), &mask, keepdim, &mut sb);
        let out = out.resize(a, sizes)?;
        Ok(Reduction {
            x,
            mask,
            keepdim,
            out,
        })
    }

    /// Reads [`DimsArgs`] and resizes `out` to the result.
    fn of_dims(a: &mut Args<'_>) -> Result<Self, KernelError> {
        let args = DimsArgs::unpack(a)?;
        let mask = mask_of(&args.input, args.dim)?;
        let (x, keepdim, out) = (args.input, args.keepdim, args.out);
        Reduction::new(a, x, mask, keepdim, out)
    }

    /// Runs `r` over the input, accumulating in `A`.
    fn run<A: Element, R: Reducer<A>>(
        &self,
        ctx: &KernelContext<'_>,
        r: &R,
    ) -> Result<(), KernelError> {
        reduce::<A, R>(ctx, &self.x, &self.mask, self.keepdim, &self.out, None, r)
    }
}

op_args! {
    /// `op.out(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None,
    /// Tensor(a!) out)` (`sum.IntList_out`, `mean.out`).
    struct SumArgs<'a> = "aten::<sum.IntList_out|mean.out>" {
        input: Tensor,
        dim: Option<IntList<'a>>,
        keepdim: bool,
        dtype: Option<ScalarType>,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `op.out(Tensor self, int[]? dim, bool keepdim=False, *, Tensor(a!) out)`
    /// (`amax.out`, `amin.out`, `any.dims_out`).
    struct DimsArgs<'a> = "aten::<amax|amin|any>.<out|dims_out>" {
        input: Tensor,
        dim: Option<IntList<'a>>,
        keepdim: bool,
        out: OutArg,
    } returns 1
}

fn supported(t: ScalarType, what: &'static str) -> Result<(), KernelError> {
    if super::elementwise::dtype::is_supported(t) {
        Ok(())
    } else {
        Err(super::elementwise::dtype::unsupported(t, what))
    }
}

/// `sum.IntList_out`, or `mean.out` when `mean`.
fn sum_out(ctx: &KernelContext<'_>, a: &mut Args<'_>, mean: bool) -> Result<(), KernelError> {
    let SumArgs {
        input: x,
        dim,
        keepdim,
        dtype,
        out,
    } = SumArgs::unpack(a)?;
    let mask = mask_of(&x, dim)?;
    let red = Reduction::new(a, x, mask, keepdim, out)?;
    sum_or_mean(ctx, &red, dtype, mean)
}

op_args! {
    /// `mean.dtype_out(Tensor self, *, ScalarType? dtype=None, Tensor(a!) out)`: the
    /// mean of every element, a 0-d result.
    struct MeanAllArgs = "aten::mean.dtype_out" {
        input: Tensor,
        dtype: Option<ScalarType>,
        out: OutArg,
    } returns 1
}

fn mean_all(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let MeanAllArgs {
        input: x,
        dtype,
        out,
    } = MeanAllArgs::unpack(a)?;
    let mask = dim_mask(x.rank(), None)?;
    let red = Reduction::new(a, x, mask, false, out)?;
    sum_or_mean(ctx, &red, dtype, true)
}

/// The sum (or mean) of a resized reduction, checking dtypes as `sum`/`mean` do.
fn sum_or_mean(
    ctx: &KernelContext<'_>,
    red: &Reduction,
    dtype: Option<ScalarType>,
    mean: bool,
) -> Result<(), KernelError> {
    let (x, out) = (red.x, red.out);
    supported(x.dtype(), if mean { "mean" } else { "sum" })?;
    if !mean {
        supported(out.dtype(), "sum")?;
    }
    if let Some(d) = dtype {
        if d != out.dtype() {
            return Err(KernelError::DtypeMismatch {
                expected: d,
                found: out.dtype(),
            });
        }
    } else if mean && !x.dtype().is_floating_point() {
        return Err(KernelError::UnsupportedDtype {
            dtype: x.dtype(),
            what: "mean (floating point input, or a dtype argument)",
        });
    }
    if mean && !out.dtype().is_floating_point() {
        return Err(KernelError::UnsupportedDtype {
            dtype: out.dtype(),
            what: "mean (floating point out)",
        });
    }
    if inner_runs::try_run(ctx, red, mean)? {
        return Ok(());
    }
    with_compute!(out.dtype(), A => red.run::<A, _>(ctx, &Sum { mean }))
}

/// The running product, in the out dtype's compute type, of inputs cast to the out
/// dtype (1 for nothing), as the portable kernel multiplies.
struct Prod;

impl<A: Num> Reducer<A> for Prod {
    type State = A;
    type Out = A;
    fn start(&self) -> Self::State {
        A::ONE
    }
    fn feed(&self, st: &mut Self::State, _: usize, xs: &[A]) {
        for &x in xs {
            *st = st.mul(x);
        }
    }
    fn finish(&self, st: Self::State, _: usize) -> A {
        st
    }
}

/// `prod`'s out dtype rule: `dtype` when given; int64 for an integer or bool input;
/// the input's dtype otherwise.
fn check_prod_dtype(
    x: &Tensor,
    dtype: Option<ScalarType>,
    out: &Tensor,
) -> Result<(), KernelError> {
    let expected = match dtype {
        Some(d) => d,
        None if !x.dtype().is_floating_point() => ScalarType::Long,
        None => x.dtype(),
    };
    if out.dtype() != expected {
        return Err(KernelError::DtypeMismatch {
            expected,
            found: out.dtype(),
        });
    }
    supported(x.dtype(), "prod")?;
    supported(out.dtype(), "prod out")
}

/// Runs [`Prod`] over a resized reduction.
fn prod(
    ctx: &KernelContext<'_>,
    red: &Reduction,
    dtype: Option<ScalarType>,
) -> Result<(), KernelError> {
    check_prod_dtype(&red.x, dtype, &red.out)?;
    let out_dtype = red.out.dtype();
    with_compute!(out_dtype, A => reduce::<A, _>(
        ctx, &red.x, &red.mask, red.keepdim, &red.out, Some(out_dtype), &Prod
    ))
}

op_args! {
    /// `prod.int_out(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None,
    /// Tensor(a!) out)`: the product along one dim (1 over an empty dim).
    struct ProdDimArgs = "aten::prod.int_out" {
        input: Tensor,
        dim: i64,
        keepdim: bool,
        dtype: Option<ScalarType>,
        out: OutArg,
    } returns 1
}

fn prod_dim(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ProdDimArgs {
        input: x,
        dim,
        keepdim,
        dtype,
        out,
    } = ProdDimArgs::unpack(a)?;
    let mask = dim_mask(x.rank(), Some(std::slice::from_ref(&dim)))?;
    let red = Reduction::new(a, x, mask, keepdim, out)?;
    prod(ctx, &red, dtype)
}

op_args! {
    /// `prod.out(Tensor self, *, ScalarType? dtype=None, Tensor(a!) out)`: the product
    /// of every element, a 0-d result.
    struct ProdAllArgs = "aten::prod.out" {
        input: Tensor,
        dtype: Option<ScalarType>,
        out: OutArg,
    } returns 1
}

fn prod_all(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ProdAllArgs {
        input: x,
        dtype,
        out,
    } = ProdAllArgs::unpack(a)?;
    let mask = dim_mask(x.rank(), None)?;
    let red = Reduction::new(a, x, mask, false, out)?;
    prod(ctx, &red, dtype)
}

fn check_nonempty(x: &Tensor, mask: &[bool; MAX_RANK], out: &Tensor) -> Result<(), KernelError> {
    let empty = x
        .sizes()
        .iter()
        .enumerate()
        .any(|(d, &s)| mask[d] && s == 0);
    if empty && out.numel() > 0 {
        return Err(KernelError::invalid(
            "cannot reduce over a zero-size dimension (no identity)",
        ));
    }
    Ok(())
}

/// `amax.out(Tensor self, int[1] dim=[], bool keepdim=False, *, Tensor(a!) out)` (and
/// `amin`).
fn extremum(ctx: &KernelContext<'_>, a: &mut Args<'_>, max: bool) -> Result<(), KernelError> {
    let red = Reduction::of_dims(a)?;
    let x = red.x;
    supported(x.dtype(), "amax/amin")?;
    same_dtype(&x, &red.out)?;
    check_nonempty(&x, &red.mask, &red.out)?;
    with_compute!(x.dtype(), A => red.run::<A, _>(ctx, &Extremum { max }))
}

/// The `any` reductions, once the out tensor is resized: a bool out (or uint8 for a
/// uint8 input).
fn any(ctx: &KernelContext<'_>, red: Reduction) -> Result<(), KernelError> {
    let (x, out) = (&red.x, &red.out);
    supported(x.dtype(), "any")?;
    let ok = out.dtype() == ScalarType::Bool
        || (out.dtype() == ScalarType::Byte && x.dtype() == ScalarType::Byte);
    if !ok {
        return Err(KernelError::UnsupportedDtype {
            dtype: out.dtype(),
            what: "any out (bool, or uint8 for a uint8 input)",
        });
    }
    red.run::<Bool8, _>(ctx, &Any)
}

op_args! {
    /// `any.out(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) out)`.
    struct AnyDimArgs = "aten::any.out" {
        input: Tensor,
        dim: i64,
        keepdim: bool,
        out: OutArg,
    } returns 1
}

fn any_dim(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let AnyDimArgs {
        input: x,
        dim,
        keepdim,
        out,
    } = AnyDimArgs::unpack(a)?;
    let mask = dim_mask(x.rank(), Some(std::slice::from_ref(&dim)))?;
    any(ctx, Reduction::new(a, x, mask, keepdim, out)?)
}

/// `any.dims_out(Tensor self, int[]? dim=None, bool keepdim=False, *, Tensor(a!) out)`.
fn any_dims(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    any(ctx, Reduction::of_dims(a)?)
}

op_args! {
    /// `any.all_out(Tensor self, *, Tensor(a!) out)`: a 0-d result.
    struct AnyAllArgs = "aten::any.all_out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

fn any_all(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let AnyAllArgs { input: x, out } = AnyAllArgs::unpack(a)?;
    let mask = dim_mask(x.rank(), None)?;
    any(ctx, Reduction::new(a, x, mask, false, out)?)
}

op_args! {
    /// `argmax.out(Tensor self, int? dim=None, bool keepdim=False, *, Tensor(a!) out)`
    /// (and `argmin`).
    struct ArgExtremumArgs = "aten::<argmax|argmin>.out" {
        input: Tensor,
        dim: Option<i64>,
        keepdim: bool,
        out: OutArg,
    } returns 1
}

fn arg_extremum(ctx: &KernelContext<'_>, a: &mut Args<'_>, max: bool) -> Result<(), KernelError> {
    let ArgExtremumArgs {
        input: x,
        dim,
        keepdim,
        out: out_arg,
    } = ArgExtremumArgs::unpack(a)?;
    supported(x.dtype(), "argmax/argmin")?;
    let mask = match dim {
        Some(d) => dim_mask(x.rank(), Some(std::slice::from_ref(&d)))?,
        None => dim_mask(x.rank(), None)?,
    };
    // With no dim, the mask folds every dim: a 0-d result unless `keepdim`.
    let red = Reduction::new(a, x, mask, keepdim, out_arg)?;
    let out = red.out;
    if out.dtype() != ScalarType::Long {
        return Err(KernelError::DtypeMismatch {
            expected: ScalarType::Long,
            found: out.dtype(),
        });
    }
    check_nonempty(&x, &mask, &out)?;
    if x.numel() == 0 && out.numel() > 0 {
        return Err(KernelError::invalid("argmax/argmin of an empty tensor"));
    }
    // The flattened position is the reduction position because dims keep their order.
    with_compute!(x.dtype(), A => red.run::<A, _>(ctx, &ArgExtremum { max }))
}

op_args! {
    /// `max.dim_max(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) max,
    /// Tensor(b!) max_values)` (and `min.dim_min(.., Tensor(a!) min, Tensor(b!)
    /// min_indices)`): the values (the input's dtype) and their int64 indices.
    struct ExtremumDimArgs = "aten::<max.dim_max|min.dim_min>" {
        input: Tensor,
        dim: i64,
        keepdim: bool,
        values: OutArg,
        indices: OutArg,
    } returns 1..=2
}

/// `max.dim_max` or `min.dim_min`: the first extreme element of every line along `dim`
/// and its index (a NaN is the extreme of a line that holds one).
fn extremum_dim(ctx: &KernelContext<'_>, a: &mut Args<'_>, max: bool) -> Result<(), KernelError> {
    let ExtremumDimArgs {
        input: x,
        dim,
        keepdim,
        values,
        indices,
    } = ExtremumDimArgs::unpack(a)?;
    supported(x.dtype(), "max.dim/min.dim")?;
    let mask = dim_mask(x.rank(), Some(std::slice::from_ref(&dim)))?;
    let red = Reduction::new(a, x, mask, keepdim, values)?;
    same_dtype(&x, &red.out)?;
    let indices = indices.resize(a, red.out.sizes())?;
    if indices.dtype() != ScalarType::Long {
        return Err(KernelError::DtypeMismatch {
            expected: ScalarType::Long,
            found: indices.dtype(),
        });
    }
    check_nonempty(&x, &mask, &red.out)?;
    with_compute!(x.dtype(), A => {
        red.run::<A, _>(ctx, &ExtremeValue { max })?;
        reduce::<A, _>(ctx, &x, &mask, keepdim, &indices, None, &ArgExtremum { max })
    })
}

op_args! {
    /// `max.unary_out(Tensor self, *, Tensor(a!) out)` (and `min`): the extreme of every
    /// element as a 0-d tensor, NaN when any element is NaN. The input is cast to
    /// `out`'s dtype (a cast PyTorch allows) before the comparisons.
    struct ExtremumAllArgs = "aten::<max|min>.unary_out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

fn extremum_all(ctx: &KernelContext<'_>, a: &mut Args<'_>, max: bool) -> Result<(), KernelError> {
    let ExtremumAllArgs { input: x, out } = ExtremumAllArgs::unpack(a)?;
    supported(x.dtype(), "max/min")?;
    let mask = dim_mask(x.rank(), None)?;
    let red = Reduction::new(a, x, mask, false, out)?;
    let out_dtype = red.out.dtype();
    supported(out_dtype, "max/min out")?;
    if !etch_base::can_cast(x.dtype(), out_dtype) {
        return Err(KernelError::invalid(format!(
            "max/min: cannot cast {:?} input to a {out_dtype:?} out",
            x.dtype()
        )));
    }
    if x.numel() == 0 {
        return Err(KernelError::invalid(
            "max()/min() of an empty tensor (no identity); give a dim",
        ));
    }
    with_compute!(out_dtype, A => reduce::<A, _>(
        ctx, &x, &mask, false, &red.out, Some(out_dtype), &Extremum { max }
    ))
}

op_args! {
    /// `var.correction_out(Tensor self, int[1]? dim=None, *, Scalar? correction=None,
    /// bool keepdim=False, Tensor(a!) out)`.
    struct VarArgs<'a> = "aten::var.correction_out" {
        input: Tensor,
        dim: Option<IntList<'a>>,
        correction: Option<Scalar>,
        keepdim: bool,
        out: OutArg,
    } returns 1
}

fn var_correction(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let VarArgs {
        input: x,
        dim,
        correction,
        keepdim,
        out,
    } = VarArgs::unpack(a)?;
    let correction = correction.map(|s| s.to_f64()).unwrap_or(1.0);
    let mask = mask_of(&x, dim)?;
    let red = Reduction::new(a, x, mask, keepdim, out)?;
    variance(ctx, &red, correction)
}

/// Checks a variance's dtypes (floating point input and out) and fills `red.out`
/// with the variance over `count - correction`, or with NaN ([`var_is_nan`]).
fn variance(ctx: &KernelContext<'_>, red: &Reduction, correction: f64) -> Result<(), KernelError> {
    for t in [&red.x, &red.out] {
        if !t.dtype().is_floating_point() || !super::elementwise::dtype::is_supported(t.dtype()) {
            return Err(KernelError::UnsupportedDtype {
                dtype: t.dtype(),
                what: "var, var_mean (floating point input and out)",
            });
        }
    }
    let count = reduced_count(&red.x, &red.mask);
    if var_is_nan(count, correction) {
        Out::write(ctx, &red.out)?.fill_scalar(Scalar::Double(f64::NAN));
        return Ok(());
    }
    red.run::<f64, _>(ctx, &Var { correction })
}

/// How many input elements each output of a reduction over `mask` folds.
fn reduced_count(x: &Tensor, mask: &[bool; MAX_RANK]) -> usize {
    x.sizes()
        .iter()
        .enumerate()
        .filter(|&(d, _)| mask[d])
        .map(|(_, &s)| s)
        .product()
}

op_args! {
    /// `var.out(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False, *,
    /// Tensor(a!) out)`: the variance over `count - 1` when `unbiased`, else over
    /// `count`.
    struct VarUnbiasedArgs<'a> = "aten::var.out" {
        input: Tensor,
        dim: Option<IntList<'a>>,
        unbiased: bool,
        keepdim: bool,
        out: OutArg,
    } returns 1
}

/// As upstream, the input and out must also have the contiguous dim order.
fn var_unbiased(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let VarUnbiasedArgs {
        input: x,
        dim,
        unbiased,
        keepdim,
        out,
    } = VarUnbiasedArgs::unpack(a)?;
    if !x.is_contiguous() || !out.tensor().is_contiguous() {
        return Err(KernelError::invalid(
            "var.out: the input and out must both have the contiguous dim order",
        ));
    }
    let mask = mask_of(&x, dim)?;
    let red = Reduction::new(a, x, mask, keepdim, out)?;
    variance(ctx, &red, if unbiased { 1.0 } else { 0.0 })
}

op_args! {
    /// `var_mean.correction_out(Tensor self, int[1]? dim=None, *, Scalar?
    /// correction=None, bool keepdim=False, Tensor(a!) out0, Tensor(b!) out1)`: the
    /// variance (`out0`, as `var.correction_out`) and the mean (`out1`).
    struct VarMeanArgs<'a> = "aten::var_mean.correction_out" {
        input: Tensor,
        dim: Option<IntList<'a>>,
        correction: Option<Scalar>,
        keepdim: bool,
        out0: OutArg,
        out1: OutArg,
    } returns 0..=2
}

/// The mean is the sequential sum in the out dtype's compute type over the count,
/// as `mean`. Both outs have one floating point dtype. As upstream, where the
/// variance is NaN ([`var_is_nan`]) the mean is NaN too.
fn var_mean(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let VarMeanArgs {
        input: x,
        dim,
        correction,
        keepdim,
        out0,
        out1,
    } = VarMeanArgs::unpack(a)?;
    let correction = correction.map(|s| s.to_f64()).unwrap_or(1.0);
    let mask = mask_of(&x, dim)?;
    let var = Reduction::new(a, x, mask, keepdim, out0)?;
    let mean = Reduction::new(a, x, mask, keepdim, out1)?;
    same_dtype(&var.out, &mean.out)?;
    variance(ctx, &var, correction)?;
    if var_is_nan(reduced_count(&x, &mask), correction) {
        Out::write(ctx, &mean.out)?.fill_scalar(Scalar::Double(f64::NAN));
        return Ok(());
    }
    with_compute!(mean.out.dtype(), A => mean.run::<A, _>(ctx, &Sum { mean: true }))
}

#[cfg(test)]
mod tests;
