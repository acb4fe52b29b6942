//! p-norm distances between rows: `_cdist_forward` (every row of `x1` against every
//! row of `x2`, over broadcast batch dims) and `_pdist_forward` (every pair of rows
//! of one matrix, upper triangle in row-major order).
//!
//! As the official portable kernels (`op_cdist_forward.cpp`, `op_pdist_forward.cpp`):
//! the distance of rows `a` and `b` folds `|a_k - b_k|` in order, as a count of
//! non-zero differences for `p = 0`, a sum for `p = 1`, the square root of the sum of
//! squares for `p = 2`, the largest for `p = inf`, and `(sum |d|^p)^(1/p)` otherwise;
//! `p` must be `>= 0`. They accumulate in the element type; here f16 and bf16
//! accumulate in f32 and round once at the end, f32 in f32, f64 in f64.

use etch_base::{Element, cast};

use crate::ops::elementwise::broadcast::broadcast_shapes;
use crate::ops::elementwise::dtype::with_float;
use crate::ops::elementwise::num::Real;
use crate::ops::same_dtype;
use crate::ops::shape::common::{advance_index, require_contiguous};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::_cdist_forward.out", cdist);
    r.register("aten::_pdist_forward.out", pdist);
}

/// The norm of a row difference, by `p`.
#[derive(Clone, Copy, Debug)]
enum Norm {
    L0,
    L1,
    L2,
    Inf,
    P(f64),
}

impl Norm {
    fn of(p: f64, what: &str) -> Result<Self, KernelError> {
        if p.is_nan() || p < 0.0 {
            return Err(KernelError::invalid(format!(
                "{what} only supports non-negative p values; p = {p}"
            )));
        }
        Ok(if p == 0.0 {
            Norm::L0
        } else if p == 1.0 {
            Norm::L1
        } else if p == 2.0 {
            Norm::L2
        } else if p == f64::INFINITY {
            Norm::Inf
        } else {
            Norm::P(p)
        })
    }

    /// The distance of rows `a` and `b` (equal lengths) in `A`.
    #[inline]
    fn distance<A: Real>(self, a: &[A], b: &[A]) -> A {
        let diffs = a.iter().zip(b).map(|(&x, &y)| (x - y).abs());
        match self {
            Norm::L0 => diffs.fold(A::ZERO, |acc, d| {
                acc + if d == A::ZERO { A::ZERO } else { A::ONE }
            }),
            Norm::L1 => diffs.fold(A::ZERO, |acc, d| acc + d),
            Norm::L2 => diffs.fold(A::ZERO, |acc, d| acc + d * d).sqrt(),
            // As `std::max(acc, d)`: only a larger difference replaces the aggregate
            // (a NaN one never does).
            Norm::Inf => diffs.fold(A::ZERO, |acc, d| if acc < d { d } else { acc }),
            Norm::P(p) => {
                let pa = A::from_f64(p);
                diffs
                    .fold(A::ZERO, |acc, d| acc + d.powf(pa))
                    .powf(A::from_f64(1.0 / p))
            }
        }
    }
}

/// The row `r` of a contiguous `[.., cols]` block starting at `base`, cast to `A`
/// into `buf`.
fn row_into<'b, E: Element, A: Element>(
    data: &[E],
    base: usize,
    r: usize,
    cols: usize,
    buf: &'b mut [A],
) -> &'b [A] {
    let start = base + r * cols;
    for (b, &x) in buf.iter_mut().zip(&data[start..start + cols]) {
        *b = cast::<E, A>(x);
    }
    &buf[..cols]
}

op_args! {
    /// `_cdist_forward.out(Tensor x1, Tensor x2, float p, int? compute_mode, *,
    /// Tensor(a!) out)`: `x1` `[.., P, M]`, `x2` `[.., R, M]`, out `[batch.., P, R]`
    /// with the batch dims broadcast.
    struct CdistArgs = "aten::_cdist_forward.out" {
        x1: Tensor,
        x2: Tensor,
        p: f64,
        compute_mode: Option<i64>,
        out: OutArg,
    } returns 1
}

/// `compute_mode` must be None or 0 to 2 and chooses nothing: every mode computes
/// the distances directly, as upstream.
fn cdist(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let CdistArgs {
        x1,
        x2,
        p,
        compute_mode,
        out,
    } = CdistArgs::unpack(a)?;
    same_dtype(&x1, &x2)?;
    same_dtype(&x1, &out.tensor())?;
    let (r1, r2) = (x1.rank(), x2.rank());
    if r1 < 2 || r2 < 2 {
        return Err(KernelError::invalid(format!(
            "_cdist_forward needs x1 and x2 of rank >= 2, got {:?} and {:?}",
            x1.sizes(),
            x2.sizes()
        )));
    }
    let (rows1, m) = (x1.sizes()[r1 - 2], x1.sizes()[r1 - 1]);
    let (rows2, m2) = (x2.sizes()[r2 - 2], x2.sizes()[r2 - 1]);
    if m != m2 {
        return Err(KernelError::invalid(format!(
            "_cdist_forward: x1 rows have {m} columns, x2 rows {m2}"
        )));
    }
    let norm = Norm::of(p, "cdist")?;
    if let Some(mode) = compute_mode.filter(|m| !(0..=2).contains(m)) {
        return Err(KernelError::invalid(format!(
            "_cdist_forward: possible compute modes are 0, 1, 2, but was {mode}"
        )));
    }
    for (t, what) in [(&x1, "x1"), (&x2, "x2"), (&out.tensor(), "out")] {
        require_contiguous(t, what)?;
    }
    let (b1, b2) = (&x1.sizes()[..r1 - 2], &x2.sizes()[..r2 - 2]);
    let mut bbuf = [0usize; MAX_RANK];
    let batch = broadcast_shapes(&[b1, b2], &mut bbuf)?;
    let nb = batch.len();
    if nb + 2 > MAX_RANK {
        return Err(KernelError::invalid(
            "_cdist_forward: out rank exceeds the limit",
        ));
    }
    let mut sizes = [0usize; MAX_RANK];
    sizes[..nb].copy_from_slice(batch);
    sizes[nb] = rows1;
    sizes[nb + 1] = rows2;
    let out = out.resize(a, &sizes[..nb + 2])?;
    if out.numel() == 0 {
        return Ok(());
    }
    let batches: usize = batch.iter().product();
    with_float!(x1.dtype(), "_cdist_forward", E, A => {
        let o = ctx.write::<E>(&out)?;
        if x1.numel() == 0 || x2.numel() == 0 {
            o.fill(E::from_f64(0.0));
            return Ok(());
        }
        let (d1, d2) = (ctx.read::<E>(&x1)?, ctx.read::<E>(&x2)?);
        let (ra, rb) = (ctx.scratch::<A>(m)?, ctx.scratch::<A>(m)?);
        let mut idx = [0usize; MAX_RANK];
        for b in 0..batches {
            let base1 = batch_offset(batch, &idx, b1) * rows1 * m;
            let base2 = batch_offset(batch, &idx, b2) * rows2 * m;
            let ob = b * rows1 * rows2;
            for i in 0..rows1 {
                let row_i = row_into(d1, base1, i, m, ra);
                for j in 0..rows2 {
                    let row_j = row_into(d2, base2, j, m, rb);
                    o[ob + i * rows2 + j] = cast::<A, E>(norm.distance(row_i, row_j));
                }
            }
            advance_index(&mut idx[..nb], batch);
        }
        Ok(())
    })
}

/// The flat index, in `sizes`, of the element the broadcast batch index `idx` (over
/// `batch`) reads: `sizes` is right-aligned with `batch` and its size-1 dims repeat.
fn batch_offset(batch: &[usize], idx: &[usize; MAX_RANK], sizes: &[usize]) -> usize {
    let lead = batch.len() - sizes.len();
    sizes.iter().enumerate().fold(0, |acc, (d, &s)| {
        acc * s + if s == 1 { 0 } else { idx[lead + d] }
    })
}

op_args! {
    /// `_pdist_forward.out(Tensor self, float p=2., *, Tensor(a!) out)`: `self` `[N,
    /// M]`, out `[N (N - 1) / 2]`, the distances of rows `(i, j)`, `i < j`, in
    /// row-major order.
    struct PdistArgs = "aten::_pdist_forward.out" {
        input: Tensor,
        p: f64,
        out: OutArg,
    } returns 1
}

fn pdist(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let PdistArgs { input, p, out } = PdistArgs::unpack(a)?;
    same_dtype(&input, &out.tensor())?;
    if input.rank() != 2 {
        return Err(KernelError::invalid(format!(
            "_pdist_forward needs a matrix, got shape {:?}",
            input.sizes()
        )));
    }
    let norm = Norm::of(p, "pdist")?;
    require_contiguous(&input, "self")?;
    require_contiguous(&out.tensor(), "out")?;
    let (n, m) = (input.sizes()[0], input.sizes()[1]);
    let pairs = n * n.saturating_sub(1) / 2;
    let out = out.resize(a, &[pairs])?;
    if pairs == 0 {
        return Ok(());
    }
    with_float!(input.dtype(), "_pdist_forward", E, A => {
        let o = ctx.write::<E>(&out)?;
        let x = ctx.read::<E>(&input)?;
        let (ra, rb) = (ctx.scratch::<A>(m)?, ctx.scratch::<A>(m)?);
        let mut k = 0;
        for i in 0..n {
            let row_i = row_into(x, 0, i, m, ra);
            for j in i + 1..n {
                let row_j = row_into(x, 0, j, m, rb);
                o[k] = cast::<A, E>(norm.distance(row_i, row_j));
                k += 1;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::testing::Harness;

    /// The p-norm distance of two rows, in f64.
    fn dist(a: &[f32], b: &[f32], p: f64) -> f64 {
        let d = a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).abs());
        if p == 0.0 {
            d.filter(|&v| v != 0.0).count() as f64
        } else if p == f64::INFINITY {
            d.fold(0.0, f64::max)
        } else {
            d.map(|v| v.powf(p)).sum::<f64>().powf(1.0 / p)
        }
    }

    fn close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(
                (*g as f64 - w).abs() <= 1e-4 * w.abs() + 1e-5,
                "{got:?} vs {want:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn cdist_broadcasts_batches_and_matches_the_norms(
            p in prop_oneof![Just(0.0), Just(1.0), Just(2.0), Just(3.0), Just(0.5), Just(f64::INFINITY)],
            (b1, b2) in prop_oneof![Just((vec![2usize], vec![1usize])), Just((vec![], vec![3])), Just((vec![2, 1], vec![3])), Just((vec![], vec![]))],
            rows1 in 0usize..4, rows2 in 1usize..4, m in 1usize..5,
        ) {
            let s1: Vec<usize> = b1.iter().copied().chain([rows1, m]).collect();
            let s2: Vec<usize> = b2.iter().copied().chain([rows2, m]).collect();
            let n1: usize = s1.iter().product();
            let n2: usize = s2.iter().product();
            let x1: Vec<f32> = (0..n1).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.5).collect();
            let x2: Vec<f32> = (0..n2).map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.25).collect();
            // The broadcast batch: right-aligned, size 1 repeats.
            let nb = b1.len().max(b2.len());
            let pad = |b: &Vec<usize>| { let mut v = vec![1; nb - b.len()]; v.extend(b); v };
            let (p1, p2) = (pad(&b1), pad(&b2));
            let batch: Vec<usize> = p1.iter().zip(&p2).map(|(&a, &b)| a.max(b)).collect();
            let nbatch: usize = batch.iter().product();
            let mut want = Vec::new();
            for bi in 0..nbatch {
                let mut rem = bi;
                let mut idx = vec![0; nb];
                for d in (0..nb).rev() { idx[d] = rem % batch[d]; rem /= batch[d]; }
                let off = |pb: &Vec<usize>| idx.iter().zip(pb).fold(0, |acc, (&i, &s)| acc * s + if s == 1 { 0 } else { i });
                let (o1, o2) = (off(&p1) * rows1 * m, off(&p2) * rows2 * m);
                for i in 0..rows1 {
                    for j in 0..rows2 {
                        want.push(dist(&x1[o1 + i * m..o1 + (i + 1) * m], &x2[o2 + j * m..o2 + (j + 1) * m], p));
                    }
                }
            }
            let mut h = Harness::new();
            let (t1, t2) = (h.tensor(&s1, &x1), h.tensor(&s2, &x2));
            let (pv, mode) = (h.double(p), h.none());
            let osizes: Vec<usize> = batch.iter().copied().chain([rows1, rows2]).collect();
            let out = h.out(ScalarType::Float, &osizes);
            h.call("aten::_cdist_forward.out", &[t1, t2, pv, mode, out, out]).unwrap();
            prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), osizes);
            close(&h.read::<f32>(out), &want);
        }
    }

    #[test]
    fn pdist_pairs_rows_in_order_and_refuses_bad_arguments() {
        let x: Vec<f32> = vec![0.0, 0.0, 3.0, 4.0, -1.0, 2.0, 0.5, 0.5];
        for p in [0.0, 1.0, 2.0, 1.5, f64::INFINITY] {
            let mut h = Harness::new();
            let t = h.tensor(&[4, 2], &x);
            let pv = h.double(p);
            let out = h.out(ScalarType::Float, &[6]);
            h.call("aten::_pdist_forward.out", &[t, pv, out, out])
                .unwrap();
            let mut want = Vec::new();
            for i in 0..4 {
                for j in i + 1..4 {
                    want.push(dist(&x[i * 2..i * 2 + 2], &x[j * 2..j * 2 + 2], p));
                }
            }
            close(&h.read::<f32>(out), &want);
        }
        let mut h = Harness::new();
        let t = h.tensor(&[4, 2], &x);
        let (neg, two) = (h.double(-1.0), h.double(2.0));
        let out = h.out(ScalarType::Float, &[6]);
        let op = "aten::_pdist_forward.out";
        assert!(h.call(op, &[t, neg, out, out]).is_err());
        let v = h.tensor(&[8], &x);
        assert!(h.call(op, &[v, two, out, out]).is_err());
        let i = h.tensor(&[2, 2], &[1i32, 2, 3, 4]);
        let io = h.out(ScalarType::Int, &[1]);
        assert!(h.call(op, &[i, two, io, io]).is_err());
        // cdist: mismatched columns, a bad compute mode.
        let (a, b) = (h.tensor(&[2, 2], &[0f32; 4]), h.tensor(&[2, 3], &[0f32; 6]));
        let (none, bad) = (h.none(), h.int(3));
        let co = h.out(ScalarType::Float, &[2, 2]);
        let op = "aten::_cdist_forward.out";
        assert!(h.call(op, &[a, b, two, none, co, co]).is_err());
        assert!(h.call(op, &[a, a, two, bad, co, co]).is_err());
        h.call(op, &[a, a, two, none, co, co]).unwrap();
    }
}
