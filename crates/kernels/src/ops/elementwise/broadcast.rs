//! PyTorch broadcasting, and the iteration plan of an elementwise op: the output's
//! dims with size-1 dims dropped and adjacent dims merged wherever every operand
//! allows, so the innermost loop runs as long as possible.

use crate::{KernelError, MAX_RANK};

/// Broadcasts `shapes` (right-aligned) into `buf`; returns the filled prefix.
pub fn broadcast_shapes<'b>(
    shapes: &[&[usize]],
    buf: &'b mut [usize; MAX_RANK],
) -> Result<&'b [usize], KernelError> {
    etch_base::broadcast_shapes(shapes, buf).ok_or_else(|| {
        let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
        if rank > MAX_RANK {
            KernelError::invalid(format!("rank {rank} exceeds {MAX_RANK}"))
        } else {
            KernelError::invalid(format!("shapes {shapes:?} are not broadcastable"))
        }
    })
}

/// How to walk an output and `N` inputs together: `rank` coalesced dims, the
/// innermost last. A stride of 0 repeats an element (broadcast or scalar).
#[derive(Clone, Copy, Debug)]
pub struct Plan<const N: usize> {
    pub rank: usize,
    pub sizes: [usize; MAX_RANK],
    pub out_strides: [usize; MAX_RANK],
    pub in_strides: [[usize; MAX_RANK]; N],
}

impl<const N: usize> Plan<N> {
    /// A plan over an output of `out_sizes`/`out_strides` and inputs given as
    /// `(sizes, strides)` (`None` for a scalar). Fails when an input does not
    /// broadcast to the output shape.
    pub fn new(
        out_sizes: &[usize],
        out_strides: &[usize],
        inputs: &[Option<(&[usize], &[usize])>; N],
    ) -> Result<Self, KernelError> {
        let rank = out_sizes.len();
        let mut full = [[0usize; MAX_RANK]; N];
        for (k, input) in inputs.iter().enumerate() {
            let Some((sizes, strides)) = input else {
                continue;
            };
            if sizes.len() > rank || strides.len() != sizes.len() {
                return Err(KernelError::invalid(format!(
                    "input of shape {sizes:?} does not broadcast to {out_sizes:?}"
                )));
            }
            let off = rank - sizes.len();
            for (i, (&s, &st)) in sizes.iter().zip(strides.iter()).enumerate() {
                let o = out_sizes[off + i];
                if s == o {
                    full[k][off + i] = if s == 1 { 0 } else { st };
                } else if s == 1 {
                    full[k][off + i] = 0;
                } else {
                    return Err(KernelError::invalid(format!(
                        "input of shape {sizes:?} does not broadcast to {out_sizes:?}"
                    )));
                }
            }
        }
        let mut plan = Plan {
            rank: 0,
            sizes: [0; MAX_RANK],
            out_strides: [0; MAX_RANK],
            in_strides: [[0; MAX_RANK]; N],
        };
        for d in 0..rank {
            let size = out_sizes[d];
            if size == 1 {
                continue;
            }
            if plan.rank > 0 {
                let p = plan.rank - 1;
                let merges = plan.out_strides[p] == out_strides[d] * size
                    && (0..N).all(|k| plan.in_strides[k][p] == full[k][d] * size);
                if merges {
                    plan.sizes[p] *= size;
                    plan.out_strides[p] = out_strides[d];
                    for (k, f) in full.iter().enumerate() {
                        plan.in_strides[k][p] = f[d];
                    }
                    continue;
                }
            }
            let r = plan.rank;
            plan.sizes[r] = size;
            plan.out_strides[r] = out_strides[d];
            for (k, f) in full.iter().enumerate() {
                plan.in_strides[k][r] = f[d];
            }
            plan.rank += 1;
        }
        if plan.rank == 0 {
            // Every dim has size 1 (or rank 0): one element.
            plan.rank = 1;
            plan.sizes[0] = 1;
            plan.out_strides[0] = 1;
        }
        Ok(plan)
    }

    /// Elements in the innermost dim.
    pub fn inner(&self) -> usize {
        self.sizes[self.rank - 1]
    }

    /// True when the output is walked in memory order with no gaps.
    pub fn out_contiguous(&self) -> bool {
        let mut expect = 1usize;
        for d in (0..self.rank).rev() {
            if self.sizes[d] != 1 && self.out_strides[d] != expect {
                return false;
            }
            expect *= self.sizes[d];
        }
        true
    }

    /// The largest offset the plan reaches with `strides` (0 when empty).
    pub fn max_offset(&self, strides: &[usize; MAX_RANK]) -> usize {
        (0..self.rank)
            .map(|d| self.sizes[d].saturating_sub(1) * strides[d])
            .sum()
    }

    /// Output and input offsets of the start of row `row` (rows are the outer dims in
    /// row-major order), with the outer index written to `idx`.
    pub fn row_start(&self, mut row: usize, idx: &mut [usize; MAX_RANK]) -> (usize, [usize; N]) {
        let mut out = 0;
        let mut ins = [0usize; N];
        for d in (0..self.rank - 1).rev() {
            let i = row % self.sizes[d];
            row /= self.sizes[d];
            idx[d] = i;
            out += i * self.out_strides[d];
            for (k, o) in ins.iter_mut().enumerate() {
                *o += i * self.in_strides[k][d];
            }
        }
        (out, ins)
    }

    /// Advances `idx` and the offsets to the next row.
    #[inline]
    pub fn next_row(&self, idx: &mut [usize; MAX_RANK], out: &mut usize, ins: &mut [usize; N]) {
        for d in (0..self.rank - 1).rev() {
            idx[d] += 1;
            *out += self.out_strides[d];
            for (k, o) in ins.iter_mut().enumerate() {
                *o += self.in_strides[k][d];
            }
            if idx[d] < self.sizes[d] {
                return;
            }
            *out -= self.out_strides[d] * self.sizes[d];
            for (k, o) in ins.iter_mut().enumerate() {
                *o -= self.in_strides[k][d] * self.sizes[d];
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_errors_name_the_shapes() {
        // The rules themselves are etch_base's (tested there).
        let mut buf = [0; MAX_RANK];
        let e = broadcast_shapes(&[&[2, 3], &[3, 2]], &mut buf).unwrap_err();
        assert!(e.to_string().contains("[2, 3]"), "{e}");
    }

    #[test]
    fn coalescing() {
        // [1,S,H,D] * [1,S,1,D]
        let p = Plan::<2>::new(
            &[1, 5, 4, 8],
            &[160, 32, 8, 1],
            &[
                Some((&[1, 5, 4, 8], &[160, 32, 8, 1])),
                Some((&[1, 5, 1, 8], &[40, 8, 8, 1])),
            ],
        )
        .unwrap();
        assert_eq!(p.rank, 3);
        assert_eq!(&p.sizes[..3], &[5, 4, 8]);
        assert_eq!(&p.in_strides[1][..3], &[8, 0, 1]);
        assert!(p.out_contiguous());
        // Same shape: one dim.
        let p = Plan::<2>::new(
            &[2, 3],
            &[3, 1],
            &[Some((&[2, 3], &[3, 1])), Some((&[2, 3], &[3, 1]))],
        )
        .unwrap();
        assert_eq!((p.rank, p.sizes[0]), (1, 6));
        // Scalar input.
        let p = Plan::<2>::new(&[4, 1], &[1, 1], &[Some((&[4, 1], &[1, 1])), None]).unwrap();
        assert_eq!((p.rank, p.sizes[0], p.in_strides[1][0]), (1, 4, 0));
        let mut idx = [0; MAX_RANK];
        let p = Plan::<1>::new(&[2, 3], &[1, 2], &[Some((&[2, 3], &[3, 1]))]).unwrap();
        assert_eq!(p.rank, 2);
        assert!(!p.out_contiguous());
        let (o, i) = p.row_start(1, &mut idx);
        assert_eq!((o, i[0]), (1, 3));
    }
}
