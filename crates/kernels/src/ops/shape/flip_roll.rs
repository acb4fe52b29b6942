//! `flip.out` and `roll.out`: copies whose out index along some dims maps to another
//! index of the same dim (reversed, or rotated by a shift).
//!
//! Both run one engine: each dim is kept, reversed or rotated; neighbouring kept dims
//! are merged, and the out tensor is written row by row (a row is the last merged
//! dim), each row a straight, reversed or two-piece copy from the input. Both tensors
//! must be contiguous and of one dtype; only bytes move, so every dtype is served.

use crate::ops::shape::common::{
    advance_index, checked_numel, for_rows, require_copy_pair, with_bits_type, worth_parallel,
};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, Tensor, normalize_dim};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::flip.out", flip);
    r.register("aten::roll.out", roll);
}

/// What one dim does: out index `i` reads input index `i` ([`Remap::Keep`]),
/// `size - 1 - i` ([`Remap::Flip`]) or `(i - shift) mod size` ([`Remap::Roll`], with
/// `0 < shift < size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Remap {
    Keep,
    Flip,
    Roll(usize),
}

impl Remap {
    /// The input index that out index `i` of a dim of `size` reads.
    #[inline(always)]
    fn source(self, i: usize, size: usize) -> usize {
        match self {
            Remap::Keep => i,
            Remap::Flip => size - 1 - i,
            Remap::Roll(shift) => {
                if i >= shift {
                    i - shift
                } else {
                    i + size - shift
                }
            }
        }
    }
}

/// A contiguous tensor's dims with their remaps, kept neighbours merged.
#[derive(Clone, Copy, Debug)]
struct RemapPlan {
    rank: usize,
    sizes: [usize; MAX_RANK],
    /// Row-major element strides of the merged dims.
    strides: [usize; MAX_RANK],
    maps: [Remap; MAX_RANK],
}

impl RemapPlan {
    /// Merges kept neighbours of `sizes`/`maps` (size-1 dims are kept: every remap of
    /// one index is the identity); the plan has at least one dim.
    fn new(sizes: &[usize], maps: &[Remap]) -> Self {
        let mut p = RemapPlan {
            rank: 0,
            sizes: [1; MAX_RANK],
            strides: [1; MAX_RANK],
            maps: [Remap::Keep; MAX_RANK],
        };
        for (&size, &map) in sizes.iter().zip(maps) {
            let map = if size <= 1 { Remap::Keep } else { map };
            if p.rank > 0 && map == Remap::Keep && p.maps[p.rank - 1] == Remap::Keep {
                p.sizes[p.rank - 1] *= size;
                continue;
            }
            p.sizes[p.rank] = size;
            p.maps[p.rank] = map;
            p.rank += 1;
        }
        p.rank = p.rank.max(1);
        for d in (0..p.rank - 1).rev() {
            p.strides[d] = p.strides[d + 1] * p.sizes[d + 1];
        }
        p
    }

    /// Input offset of the first element of out row `idx` (indices of the outer dims).
    #[inline(always)]
    fn row_base(&self, idx: &[usize; MAX_RANK]) -> usize {
        (0..self.rank - 1)
            .map(|d| self.maps[d].source(idx[d], self.sizes[d]) * self.strides[d])
            .sum()
    }
}

/// Fills `dst` (the out tensor's elements) from `src` through `plan`; both hold
/// `numel` elements or more (checked by the caller).
fn remap_copy<T: Copy + Send + Sync>(
    ctx: &KernelContext<'_>,
    plan: &RemapPlan,
    src: &[T],
    dst: &mut [T],
    numel: usize,
) {
    let inner = plan.sizes[plan.rank - 1];
    let inner_map = plan.maps[plan.rank - 1];
    let rows = numel / inner;
    let outer = plan.rank - 1;
    let run = |first_row: usize, chunk: &mut [T]| {
        let mut idx = [0usize; MAX_RANK];
        let mut r = first_row;
        for d in (0..outer).rev() {
            idx[d] = r % plan.sizes[d];
            r /= plan.sizes[d];
        }
        for row in chunk.chunks_exact_mut(inner) {
            let from = &src[plan.row_base(&idx)..][..inner];
            match inner_map {
                Remap::Keep => row.copy_from_slice(from),
                Remap::Flip => {
                    for (d, s) in row.iter_mut().zip(from.iter().rev()) {
                        *d = *s;
                    }
                }
                Remap::Roll(shift) => {
                    row[..shift].copy_from_slice(&from[inner - shift..]);
                    row[shift..].copy_from_slice(&from[..inner - shift]);
                }
            }
            advance_index(&mut idx[..outer], &plan.sizes);
        }
    };
    let parallel = worth_parallel(rows, numel);
    for_rows(ctx.pool(), &mut dst[..numel], inner, rows, 8, parallel, run);
}

/// Checks the pair, resizes `out` to `input`'s sizes and copies through `maps`.
fn remap_into(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    out: OutArg,
    maps: &[Remap],
) -> Result<(), KernelError> {
    require_copy_pair(input, &out.tensor())?;
    let out = out.resize(a, input.sizes())?;
    require_copy_pair(input, &out)?;
    let numel = checked_numel(input.sizes())?;
    if numel == 0 {
        return Ok(());
    }
    let plan = RemapPlan::new(input.sizes(), maps);
    with_bits_type!(input.dtype().element_size(), T => {
        let src = ctx.read_raw::<T>(input)?;
        let dst = ctx.write_raw::<T>(&out)?;
        if src.len() < numel || dst.len() < numel {
            return Err(KernelError::invalid(format!(
                "copy of {numel} elements between tensors of {} and {} elements",
                src.len(),
                dst.len()
            )));
        }
        remap_copy(ctx, &plan, src, dst, numel);
        Ok(())
    })
}

op_args! {
    /// `flip.out(Tensor self, int[] dims, *, Tensor(a!) out)`.
    struct FlipArgs<'a> = "aten::flip.out" {
        input: Tensor,
        dims: IntList<'a>,
        out: OutArg,
    } returns 1
}

fn flip(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let FlipArgs { input, dims, out } = FlipArgs::unpack(a)?;
    let rank = input.rank();
    let mut maps = [Remap::Keep; MAX_RANK];
    for j in 0..dims.len() {
        let d = normalize_dim(dims.get(j)?, rank)?;
        if rank == 0 {
            continue;
        }
        if std::mem::replace(&mut maps[d], Remap::Flip) == Remap::Flip {
            return Err(KernelError::invalid(format!(
                "flip: dim {d} appears more than once in dims"
            )));
        }
    }
    remap_into(ctx, a, &input, out, &maps[..rank])
}

op_args! {
    /// `roll.out(Tensor self, SymInt[1] shifts, int[1] dims=[], *, Tensor(a!) out)`.
    /// Shifts of one dim add up; with no dims, one shift rolls the flattened tensor.
    struct RollArgs<'a> = "aten::roll.out" {
        input: Tensor,
        shifts: IntList<'a>,
        dims: IntList<'a>,
        out: OutArg,
    } returns 1
}

fn roll(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let RollArgs {
        input,
        shifts,
        dims,
        out,
    } = RollArgs::unpack(a)?;
    let rank = input.rank();
    if rank == 0 {
        return Err(KernelError::invalid("roll of a 0-d tensor"));
    }
    if shifts.is_empty() {
        return Err(KernelError::invalid("roll: shifts is empty"));
    }
    /// A shift of `total` along a dim of `size`, as a remap.
    fn rolled(total: i128, size: usize) -> Remap {
        if size == 0 {
            return Remap::Keep;
        }
        match total.rem_euclid(size as i128) as usize {
            0 => Remap::Keep,
            k => Remap::Roll(k),
        }
    }
    if dims.is_empty() {
        // The flattened tensor is rolled: one dim over every element.
        if shifts.len() != 1 {
            return Err(KernelError::invalid(format!(
                "roll: {} shifts without dims (one shift rolls the flattened tensor)",
                shifts.len()
            )));
        }
        let numel = checked_numel(input.sizes())?;
        let map = rolled(i128::from(shifts.get(0)?), numel);
        require_copy_pair(&input, &out.tensor())?;
        let out = out.resize(a, input.sizes())?;
        require_copy_pair(&input, &out)?;
        if numel == 0 {
            return Ok(());
        }
        let plan = RemapPlan::new(&[numel], &[map]);
        return with_bits_type!(input.dtype().element_size(), T => {
            let src = ctx.read_raw::<T>(&input)?;
            let dst = ctx.write_raw::<T>(&out)?;
            if src.len() < numel || dst.len() < numel {
                return Err(KernelError::invalid("roll: tensor storage is too small"));
            }
            remap_copy(ctx, &plan, src, dst, numel);
            Ok(())
        });
    }
    if shifts.len() != dims.len() {
        return Err(KernelError::invalid(format!(
            "roll: {} shifts for {} dims",
            shifts.len(),
            dims.len()
        )));
    }
    let mut totals = [0i128; MAX_RANK];
    for j in 0..dims.len() {
        let d = normalize_dim(dims.get(j)?, rank)?;
        totals[d] += i128::from(shifts.get(j)?);
    }
    let mut maps = [Remap::Keep; MAX_RANK];
    for d in 0..rank {
        maps[d] = rolled(totals[d], input.sizes()[d]);
    }
    remap_into(ctx, a, &input, out, &maps[..rank])
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ThreadPool;
    use crate::testing::{Harness, ravel, unravel};

    /// The reference: out element at multi-index `i` is the input's at `src(d, i_d)`.
    fn reference(sizes: &[usize], data: &[i32], src: impl Fn(usize, usize) -> usize) -> Vec<i32> {
        (0..data.len())
            .map(|flat| {
                let at: Vec<usize> = unravel(flat, sizes)
                    .into_iter()
                    .enumerate()
                    .map(|(d, i)| src(d, i))
                    .collect();
                data[ravel(&at, sizes)]
            })
            .collect()
    }

    fn iota(n: usize) -> Vec<i32> {
        (0..n as i32).collect()
    }

    #[test]
    fn roll_small_cases() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &iota(6));
        let out = h.out(ScalarType::Int, &[2, 3]);
        let (s, d) = (h.int_list(&[1]), h.int_list(&[1]));
        h.call("aten::roll.out", &[x, s, d, out, out]).unwrap();
        assert_eq!(h.read::<i32>(out), vec![2, 0, 1, 5, 3, 4]);
        // Two shifts of one dim add up; negative shifts and dims wrap.
        let (s, d) = (h.int_list(&[-1, -3, 1]), h.int_list(&[-1, 1, 0]));
        h.call("aten::roll.out", &[x, s, d, out, out]).unwrap();
        assert_eq!(h.read::<i32>(out), vec![4, 5, 3, 1, 2, 0]);
        // No dims: the flattened tensor rolls.
        let (s, d) = (h.int_list(&[2]), h.int_list(&[]));
        h.call("aten::roll.out", &[x, s, d, out, out]).unwrap();
        assert_eq!(h.read::<i32>(out), vec![4, 5, 0, 1, 2, 3]);
    }

    #[test]
    fn roll_bad_calls() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &iota(6));
        let out = h.out(ScalarType::Int, &[2, 3]);
        let op = "aten::roll.out";
        for (s, d) in [
            (vec![], vec![]),
            (vec![1, 1], vec![]),
            (vec![1], vec![0, 1]),
            (vec![1], vec![2]),
            (vec![1], vec![-3]),
        ] {
            let (s, d) = (h.int_list(&s), h.int_list(&d));
            assert!(h.call(op, &[x, s, d, out, out]).is_err());
        }
        let (s, d) = (h.int_list(&[1]), h.int_list(&[0]));
        let wrong = h.out(ScalarType::Float, &[2, 3]);
        assert!(h.call(op, &[x, s, d, wrong, wrong]).is_err());
        let small = h.out(ScalarType::Int, &[2, 2]);
        assert!(h.call(op, &[x, s, d, small, small]).is_err());
        let scalar = h.tensor(&[], &[1i32]);
        let o0 = h.out(ScalarType::Int, &[]);
        assert!(h.call(op, &[scalar, s, d, o0, o0]).is_err());
        let cl = h.tensor_with_order(&[1, 2, 2, 2], &[0, 2, 3, 1], &iota(8));
        let ocl = h.out(ScalarType::Int, &[1, 2, 2, 2]);
        assert!(h.call(op, &[cl, s, d, ocl, ocl]).is_err());
    }

    #[test]
    fn flip_small_cases() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &[0f32, 1., 2., 3., 4., 5.]);
        let out = h.out(ScalarType::Float, &[2, 3]);
        let d = h.int_list(&[-1]);
        h.call("aten::flip.out", &[x, d, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![2., 1., 0., 5., 4., 3.]);
        let d = h.int_list(&[0, 1]);
        h.call("aten::flip.out", &[x, d, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![5., 4., 3., 2., 1., 0.]);
        let d = h.int_list(&[]);
        h.call("aten::flip.out", &[x, d, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![0., 1., 2., 3., 4., 5.]);
        for bad in [vec![0, 0], vec![1, -1], vec![2]] {
            let d = h.int_list(&bad);
            assert!(h.call("aten::flip.out", &[x, d, out, out]).is_err());
        }
    }

    #[test]
    fn large_copies_on_the_pool_match_serial() {
        let sizes = [40usize, 50, 64];
        let data = iota(sizes.iter().product());
        for (op, first, second) in [
            ("aten::roll.out", vec![7i64, -3], vec![0i64, 1]),
            ("aten::flip.out", vec![0i64, 1], vec![]),
        ] {
            let mut got = Vec::new();
            for threads in [1, 2] {
                let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
                let x = h.tensor(&sizes, &data);
                let out = h.out(ScalarType::Int, &sizes);
                let a = h.int_list(&first);
                let mut args = vec![x, a];
                if op == "aten::roll.out" {
                    args.push(h.int_list(&second));
                }
                args.extend([out, out]);
                h.call(op, &args).unwrap();
                got.push(h.read::<i32>(out));
            }
            assert_eq!(got[0], got[1], "{op}");
            let want = if op == "aten::roll.out" {
                reference(&sizes, &data, |d, i| match d {
                    0 => (i + 40 - 7) % 40,
                    1 => (i + 3) % 50,
                    _ => i,
                })
            } else {
                reference(
                    &sizes,
                    &data,
                    |d, i| if d < 2 { sizes[d] - 1 - i } else { i },
                )
            };
            assert_eq!(got[0], want, "{op}");
        }
    }

    /// Sizes (some 0 or 1) and per-dim choices for the property tests.
    fn shape_and_choices() -> impl Strategy<Value = (Vec<usize>, Vec<(bool, i64)>)> {
        proptest::collection::vec((0usize..5, any::<bool>(), -9i64..9), 1..6).prop_map(|v| {
            let sizes = v.iter().map(|t| t.0).collect();
            let choices = v.iter().map(|t| (t.1, t.2)).collect();
            (sizes, choices)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn roll_matches_reference((sizes, choices) in shape_and_choices(), threads in 1usize..3) {
            let n: usize = sizes.iter().product();
            let data = iota(n);
            let mut shifts = Vec::new();
            let mut dims = Vec::new();
            let mut total = vec![0i64; sizes.len()];
            for (d, &(pick, shift)) in choices.iter().enumerate() {
                if pick {
                    // Negative dims name the same dim.
                    dims.push(if shift % 2 == 0 { d as i64 } else { d as i64 - sizes.len() as i64 });
                    shifts.push(shift);
                    total[d] += shift;
                }
            }
            if dims.is_empty() {
                dims.push(0);
                shifts.push(3);
                total[0] += 3;
            }
            let want = reference(&sizes, &data, |d, i| {
                let s = sizes[d] as i64;
                (i as i64 - total[d]).rem_euclid(s) as usize
            });
            let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
            let x = h.tensor(&sizes, &data);
            let (s, dl) = (h.int_list(&shifts), h.int_list(&dims));
            let out = h.out(ScalarType::Int, &sizes);
            h.call("aten::roll.out", &[x, s, dl, out, out]).unwrap();
            prop_assert_eq!(h.read::<i32>(out), want);
        }

        #[test]
        fn flip_matches_reference((sizes, choices) in shape_and_choices(), threads in 1usize..3) {
            let n: usize = sizes.iter().product();
            let data = iota(n);
            let dims: Vec<i64> = choices
                .iter()
                .enumerate()
                .filter(|(_, c)| c.0)
                .map(|(d, c)| if c.1 < 0 { d as i64 - sizes.len() as i64 } else { d as i64 })
                .collect();
            let flipped: Vec<bool> = choices.iter().map(|c| c.0).collect();
            let want = reference(&sizes, &data, |d, i| if flipped[d] { sizes[d] - 1 - i } else { i });
            let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
            let x = h.tensor(&sizes, &data);
            let dl = h.int_list(&dims);
            let out = h.out(ScalarType::Int, &sizes);
            h.call("aten::flip.out", &[x, dl, out, out]).unwrap();
            prop_assert_eq!(h.read::<i32>(out), want);
        }
    }
}
