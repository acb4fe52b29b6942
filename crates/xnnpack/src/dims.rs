//! Fixed-size shapes (XNNPACK's `XNN_MAX_TENSOR_DIMS` = 6): `Copy`, `Pod`, so a shape
//! table for one call comes from scratch memory.

use bytemuck::{Pod, Zeroable};

/// Most dimensions an XNNPACK value may have.
pub const MAX_DIMS: usize = 6;

/// A shape of at most [`MAX_DIMS`] dimensions.
#[derive(Clone, Copy, PartialEq, Eq, Default, Pod, Zeroable)]
#[repr(C)]
pub struct Dims {
    rank: usize,
    dims: [usize; MAX_DIMS],
}

impl Dims {
    /// A shape from `dims`; `None` when there are more than [`MAX_DIMS`].
    pub fn new(dims: &[usize]) -> Option<Self> {
        if dims.len() > MAX_DIMS {
            return None;
        }
        let mut d = [0; MAX_DIMS];
        d[..dims.len()].copy_from_slice(dims);
        Some(Self {
            rank: dims.len(),
            dims: d,
        })
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank.min(MAX_DIMS)
    }

    /// The dimensions.
    pub fn as_slice(&self) -> &[usize] {
        &self.dims[..self.rank()]
    }

    /// The dimensions, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [usize] {
        let r = self.rank();
        &mut self.dims[..r]
    }

    /// Dimension `i` (0 when out of range).
    pub fn get(&self, i: usize) -> usize {
        self.as_slice().get(i).copied().unwrap_or(0)
    }

    /// Element count, `None` on overflow.
    pub fn numel(&self) -> Option<usize> {
        self.as_slice()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Product of dimensions `range` (1 for an empty range); saturates.
    pub fn product(&self, range: std::ops::Range<usize>) -> usize {
        self.as_slice()
            .get(range)
            .unwrap_or(&[])
            .iter()
            .fold(1usize, |acc, &d| acc.saturating_mul(d))
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_slice())
    }
}
