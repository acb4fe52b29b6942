//! `topk`: the `k` largest (or smallest) elements of every line along a dim, and
//! their indices.
//!
//! NaN counts as larger than every number, as in the official portable kernel
//! (`kernels/portable/cpu/op_topk.cpp`) and PyTorch. Upstream selects with
//! `std::nth_element`/`std::partial_sort`, which order equal elements arbitrarily, and
//! with `sorted=False` leaves the `k` in no particular order. Here equal elements keep
//! their input order (the lower index first), and the result is sorted whatever
//! `sorted` says: one of the orders upstream may return, and the same on every run.

use std::cmp::Ordering;

use etch_base::{Element, ScalarType};

use crate::ops::elementwise::dtype::with_elem;
use crate::ops::same_dtype;
use crate::ops::shape::common::require_contiguous;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::topk.values", topk);
}

op_args! {
    /// `topk.values(Tensor self, SymInt k, int dim=-1, bool largest=True, bool
    /// sorted=True, *, Tensor(a!) values, Tensor(b!) indices)`.
    struct TopkArgs = "aten::topk.values" {
        input: Tensor,
        k: i64,
        dim: i64,
        largest: bool,
        sorted: bool,
        values: OutArg,
        indices: OutArg,
    } returns 0..=2
}

/// The order `topk` ranks elements by.
trait Ranked: Element {
    /// `self` against `o`, NaN above every number.
    fn rank(&self, o: &Self) -> Ordering;
}

macro_rules! ranked {
    ($($t:ty),*) => {$(
        impl Ranked for $t {
            #[inline]
            fn rank(&self, o: &Self) -> Ordering {
                nan_last(self, o)
            }
        }
    )*};
}

ranked!(
    f32,
    f64,
    half::f16,
    half::bf16,
    i8,
    u8,
    i16,
    i32,
    i64,
    u16,
    u32,
    u64
);

/// Refused before any comparison; ranked as 0 < 1 for completeness.
impl Ranked for etch_base::Bool8 {
    fn rank(&self, o: &Self) -> Ordering {
        self.0.cmp(&o.0)
    }
}

/// `x` against `y` with NaN above every number (two NaNs are equal).
#[inline]
fn nan_last<E: PartialOrd>(x: &E, y: &E) -> Ordering {
    // Only NaN is unordered against itself.
    match (x.partial_cmp(x).is_none(), y.partial_cmp(y).is_none()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
    }
}

/// As upstream: `values` has the input's dtype (any number type but bool), `indices`
/// is int64, `0 <= k <=` the dim's size (1 for a 0-d input), and both outs are resized
/// to the input's sizes with `k` at `dim`.
fn topk(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let TopkArgs {
        input,
        k,
        dim,
        largest,
        values,
        indices,
        ..
    } = TopkArgs::unpack(a)?;
    same_dtype(&input, &values.tensor())?;
    if indices.tensor().dtype() != ScalarType::Long {
        return Err(KernelError::DtypeMismatch {
            expected: ScalarType::Long,
            found: indices.tensor().dtype(),
        });
    }
    if input.dtype() == ScalarType::Bool {
        return Err(KernelError::UnsupportedDtype {
            dtype: input.dtype(),
            what: "topk (numbers only)",
        });
    }
    let rank = input.rank();
    let dim = input.normalize_dim(dim)?;
    let n = if rank == 0 { 1 } else { input.sizes()[dim] };
    if k < 0 || k as u64 > n as u64 {
        return Err(KernelError::invalid(format!(
            "topk: k = {k} is outside 0..={n}, the size of dim {dim}"
        )));
    }
    let k = k as usize;
    require_contiguous(&input, "self")?;
    require_contiguous(&values.tensor(), "values")?;
    require_contiguous(&indices.tensor(), "indices")?;
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(input.sizes());
    if rank > 0 {
        sizes[dim] = k;
    }
    let values = values.resize(a, &sizes[..rank])?;
    let indices = indices.resize(a, &sizes[..rank])?;
    if input.numel() == 0 || k == 0 {
        return Ok(());
    }
    let outer: usize = input.sizes()[..dim.min(rank)].iter().product();
    let inner: usize = input.sizes()[(dim + 1).min(rank)..].iter().product();
    let order = ctx.scratch::<usize>(n)?;
    with_elem!(input.dtype(), E => {
        let x = ctx.read::<E>(&input)?;
        let v = ctx.write::<E>(&values)?;
        let ix = ctx.write::<i64>(&indices)?;
        select(x, v, ix, order, [outer, n, inner], k, largest);
        Ok(())
    }, Err(KernelError::UnsupportedDtype { dtype: input.dtype(), what: "topk" }))
}

/// The top `k` of every line of `n` elements `inner` apart, for `outer` blocks of
/// `n * inner` (contiguous input and outs), into `v` and `ix`; `order` is `n` scratch
/// positions.
fn select<E: Ranked>(
    x: &[E],
    v: &mut [E],
    ix: &mut [i64],
    order: &mut [usize],
    [outer, n, inner]: [usize; 3],
    k: usize,
    largest: bool,
) {
    for o in 0..outer {
        for i in 0..inner {
            let base = o * n * inner + i;
            let at = |j: usize| &x[base + j * inner];
            // Ahead: the larger (or smaller) value, then the lower index.
            let ahead = |p: &usize, q: &usize| {
                let by_value = at(*p).rank(at(*q));
                let by_value = if largest {
                    by_value.reverse()
                } else {
                    by_value
                };
                by_value.then(p.cmp(q))
            };
            for (j, slot) in order.iter_mut().enumerate() {
                *slot = j;
            }
            if k < n {
                order.select_nth_unstable_by(k - 1, ahead);
            }
            order[..k].sort_unstable_by(ahead);
            let out_base = o * k * inner + i;
            for (r, &j) in order[..k].iter().enumerate() {
                v[out_base + r * inner] = *at(j);
                ix[out_base + r * inner] = j as i64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::testing::Harness;

    /// The top `k` along the last dim of rows of `n`, by a full stable sort.
    fn reference(x: &[f32], n: usize, k: usize, largest: bool) -> (Vec<f32>, Vec<i64>) {
        let (mut vals, mut idx) = (Vec::new(), Vec::new());
        for row in x.chunks(n) {
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&p, &q| {
                let (a, b) = (row[p], row[q]);
                let o = match (a.is_nan(), b.is_nan()) {
                    (true, true) => std::cmp::Ordering::Equal,
                    (true, false) => std::cmp::Ordering::Greater,
                    (false, true) => std::cmp::Ordering::Less,
                    _ => a.partial_cmp(&b).unwrap(),
                };
                if largest { o.reverse() } else { o }
            });
            for &j in &order[..k] {
                vals.push(row[j]);
                idx.push(j as i64);
            }
        }
        (vals, idx)
    }

    proptest! {
        #[test]
        fn topk_matches_a_stable_sort(
            rows in 1usize..4,
            n in 1usize..70,
            kseed in 0usize..100,
            largest in any::<bool>(),
            vals in prop::collection::vec(prop_oneof![(-4i32..4).prop_map(|v| v as f32), Just(f32::NAN)], 1..280),
        ) {
            let k = kseed % (n + 1);
            let x: Vec<f32> = (0..rows * n).map(|i| vals[i % vals.len()]).collect();
            let (want_v, want_i) = reference(&x, n, k, largest);
            // Along the last dim, and along dim 0 of the transposed layout.
            let mut h = Harness::new();
            let t = h.tensor(&[rows, n], &x);
            let (kk, d, l, s) = (h.int(k as i64), h.int(-1), h.bool(largest), h.bool(true));
            let (ov, oi) = (h.out(ScalarType::Float, &[rows, n]), h.out(ScalarType::Long, &[rows, n]));
            h.call("aten::topk.values", &[t, kk, d, l, s, ov, oi, ov, oi]).unwrap();
            prop_assert_eq!(h.tensor_meta(ov).sizes().to_vec(), vec![rows, k]);
            prop_assert_eq!(format!("{:?}", h.read::<f32>(ov)), format!("{want_v:?}"));
            prop_assert_eq!(h.read::<i64>(oi), want_i.clone());

            let xt: Vec<f32> = (0..rows * n).map(|f| x[(f % rows) * n + f / rows]).collect();
            let t = h.tensor(&[n, rows], &xt);
            let zero = h.int(0);
            let (ov, oi) = (h.out(ScalarType::Float, &[n, rows]), h.out(ScalarType::Long, &[n, rows]));
            h.call("aten::topk.values", &[t, kk, zero, l, s, ov, oi]).unwrap();
            let got_i = h.read::<i64>(oi);
            let want_t: Vec<i64> = (0..k * rows).map(|f| want_i[(f % rows) * k + f / rows]).collect();
            prop_assert_eq!(got_i, want_t);
        }
    }

    #[test]
    fn topk_refuses_bad_arguments_and_handles_0d() {
        let mut h = Harness::new();
        let x = h.tensor(&[3], &[3i32, 1, 2]);
        let (t, neg1) = (h.bool(true), h.int(-1));
        let (k4, k2, kneg) = (h.int(4), h.int(2), h.int(-1));
        let (ov, oi) = (h.out(ScalarType::Int, &[3]), h.out(ScalarType::Long, &[3]));
        let op = "aten::topk.values";
        assert!(h.call(op, &[x, k4, neg1, t, t, ov, oi]).is_err());
        assert!(h.call(op, &[x, kneg, neg1, t, t, ov, oi]).is_err());
        let bad_i = h.out(ScalarType::Int, &[3]);
        assert!(h.call(op, &[x, k2, neg1, t, t, ov, bad_i]).is_err());
        let bad_v = h.out(ScalarType::Float, &[3]);
        assert!(h.call(op, &[x, k2, neg1, t, t, bad_v, oi]).is_err());
        let f = h.bool(false);
        h.call(op, &[x, k2, neg1, f, t, ov, oi]).unwrap();
        assert_eq!(
            (h.read::<i32>(ov), h.read::<i64>(oi)),
            (vec![1, 2], vec![1, 2])
        );
        let s = h.tensor(&[], &[5i32]);
        let one = h.int(1);
        let (sv, si) = (h.out(ScalarType::Int, &[]), h.out(ScalarType::Long, &[]));
        h.call(op, &[s, one, neg1, t, t, sv, si]).unwrap();
        assert_eq!((h.read::<i32>(sv), h.read::<i64>(si)), (vec![5], vec![0]));
    }
}
