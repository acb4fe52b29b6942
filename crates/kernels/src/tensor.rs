//! Tensor metadata: dtype, shape, strides, dim order, dynamism, and where its bytes live.

use etch_base::{ScalarType, ShapeDynamism};
use etch_memory::Span;

use crate::ShapeError;

use crate::MAX_RANK;

/// Tensor metadata. `Copy` and fixed-size, so kernels copy it freely and resizing
/// never allocates. The bytes are reached through the kernel context.
///
/// ```
/// use etch_base::ScalarType;
/// use etch_kernels::Tensor;
/// let t = Tensor::new(ScalarType::Float, &[2, 3], None).unwrap();
/// assert_eq!(t.sizes(), &[2, 3]);
/// assert_eq!(t.strides(), &[3, 1]);
/// assert_eq!(t.nbytes(), 24);
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Tensor {
    dtype: ScalarType,
    rank: u8,
    sizes: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    dim_order: [u8; MAX_RANK],
    dynamism: ShapeDynamism,
    numel_bound: usize,
    data: Option<Span>,
}

fn checked_numel(sizes: &[usize]) -> Result<usize, ShapeError> {
    sizes
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| ShapeError::Overflow(sizes.to_vec()))
}

impl Tensor {
    /// A contiguous, static tensor.
    pub fn new(dtype: ScalarType, sizes: &[usize], data: Option<Span>) -> Result<Self, ShapeError> {
        let mut dim_order = [0u8; MAX_RANK];
        for (i, d) in dim_order
            .iter_mut()
            .enumerate()
            .take(sizes.len().min(MAX_RANK))
        {
            *d = i as u8;
        }
        Self::with_layout(
            dtype,
            sizes,
            &dim_order[..sizes.len().min(MAX_RANK)],
            ShapeDynamism::Static,
            data,
        )
    }

    /// A tensor with an explicit dim order and dynamism; `sizes` is also the bound.
    pub fn with_layout(
        dtype: ScalarType,
        sizes: &[usize],
        dim_order: &[u8],
        dynamism: ShapeDynamism,
        data: Option<Span>,
    ) -> Result<Self, ShapeError> {
        let rank = sizes.len();
        if rank > MAX_RANK {
            return Err(ShapeError::RankTooLarge {
                rank,
                limit: MAX_RANK,
            });
        }
        let mut seen = [false; MAX_RANK];
        let valid = dim_order.len() == rank
            && dim_order.iter().all(|&d| {
                let d = d as usize;
                d < rank && !std::mem::replace(&mut seen[d], true)
            });
        if !valid {
            return Err(ShapeError::BadDimOrder(dim_order.to_vec()));
        }
        let numel_bound = checked_numel(sizes)?;
        numel_bound
            .checked_mul(dtype.element_size())
            .ok_or_else(|| ShapeError::Overflow(sizes.to_vec()))?;
        let mut t = Tensor {
            dtype,
            rank: rank as u8,
            sizes: [0; MAX_RANK],
            strides: [0; MAX_RANK],
            dim_order: [0; MAX_RANK],
            dynamism,
            numel_bound,
            data,
        };
        t.sizes[..rank].copy_from_slice(sizes);
        t.dim_order[..rank].copy_from_slice(dim_order);
        t.compute_strides();
        Ok(t)
    }

    fn compute_strides(&mut self) {
        let rank = self.rank as usize;
        let mut stride = 1usize;
        for k in (0..rank).rev() {
            let d = self.dim_order[k] as usize;
            self.strides[d] = stride;
            // A zero-size dim contributes x1, as upstream.
            stride = stride.saturating_mul(self.sizes[d].max(1));
        }
    }

    /// Element type.
    pub fn dtype(&self) -> ScalarType {
        self.dtype
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Current sizes.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes[..self.rank as usize]
    }

    /// Element strides, derived from sizes and dim order.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.rank as usize]
    }

    /// Dim order (`[0, 1, ..]` for contiguous).
    pub fn dim_order(&self) -> &[u8] {
        &self.dim_order[..self.rank as usize]
    }

    /// Shape dynamism from the program.
    pub fn dynamism(&self) -> ShapeDynamism {
        self.dynamism
    }

    /// Most elements this tensor may hold (its numel at load).
    pub fn numel_bound(&self) -> usize {
        self.numel_bound
    }

    /// Elements at the current sizes.
    pub fn numel(&self) -> usize {
        self.sizes().iter().product()
    }

    /// Bytes at the current sizes.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.element_size()
    }

    /// Where the bytes live (`None` until bound).
    pub fn data(&self) -> Option<Span> {
        self.data
    }

    /// Re-points the tensor's bytes (views, inputs, frees).
    pub fn set_data(&mut self, data: Option<Span>) {
        self.data = data;
    }

    /// The size of dimension `dim`, negative counting from the end.
    pub fn size(&self, dim: i64) -> Result<usize, ShapeError> {
        Ok(self.sizes[self.normalize_dim(dim)?])
    }

    /// `dim` wrapped into `0..rank` (rank 0 accepts 0 and -1, as PyTorch).
    pub fn normalize_dim(&self, dim: i64) -> Result<usize, ShapeError> {
        normalize_dim(dim, self.rank())
    }

    /// True when the dim order is `[0, 1, .., rank-1]`.
    pub fn is_contiguous(&self) -> bool {
        self.dim_order()
            .iter()
            .enumerate()
            .all(|(i, &d)| i == d as usize)
    }

    /// Where the element at row-major logical position `logical` (the order of a
    /// contiguous tensor of these sizes) sits in this tensor's storage, in elements.
    /// For a contiguous tensor it is `logical` itself.
    pub fn storage_index(&self, logical: usize) -> usize {
        let (sizes, strides) = (self.sizes(), self.strides());
        let mut rem = logical;
        let mut at = 0;
        for d in (0..sizes.len()).rev() {
            let size = sizes[d].max(1);
            at += (rem % size) * strides[d];
            rem /= size;
        }
        at
    }

    /// Changes the sizes following ExecuTorch's rules: the rank never changes; a static
    /// tensor must keep its sizes; a dynamic one may take any sizes whose element count
    /// fits its bound. Strides are recomputed; the data never moves.
    pub fn resize(&mut self, new_sizes: &[usize]) -> Result<(), ShapeError> {
        if new_sizes.len() != self.rank() {
            return Err(ShapeError::RankChange {
                from: self.rank(),
                to: new_sizes.len(),
            });
        }
        if new_sizes == self.sizes() {
            return Ok(());
        }
        if self.dynamism == ShapeDynamism::Static {
            return Err(ShapeError::StaticResize {
                from: self.sizes().to_vec(),
                to: new_sizes.to_vec(),
            });
        }
        let numel = checked_numel(new_sizes)?;
        if numel > self.numel_bound {
            return Err(ShapeError::ExceedsBound {
                to: new_sizes.to_vec(),
                numel,
                bound: self.numel_bound,
            });
        }
        let rank = self.rank();
        self.sizes[..rank].copy_from_slice(new_sizes);
        self.compute_strides();
        Ok(())
    }
}

/// `dim` wrapped into `0..rank` (rank 0 accepts 0 and -1).
pub fn normalize_dim(dim: i64, rank: usize) -> Result<usize, ShapeError> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        Err(ShapeError::DimOutOfRange { dim, rank })
    } else {
        Ok(d as usize)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} {:?}", self.dtype, self.sizes())?;
        if !self.is_contiguous() {
            write!(f, " dim_order={:?}", self.dim_order())?;
        }
        if self.dynamism != ShapeDynamism::Static {
            write!(f, " bound={}", self.numel_bound)?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_rules() {
        let mut s = Tensor::new(ScalarType::Float, &[2, 3], None).unwrap();
        assert!(s.resize(&[2, 3]).is_ok());
        assert!(s.resize(&[3, 2]).is_err());
        let mut d = Tensor::with_layout(
            ScalarType::Float,
            &[1, 8],
            &[0, 1],
            ShapeDynamism::DynamicBound,
            None,
        )
        .unwrap();
        d.resize(&[2, 4]).unwrap();
        assert_eq!(d.strides(), &[4, 1]);
        assert!(d.resize(&[3, 3]).is_err());
        assert!(d.resize(&[8]).is_err());
    }

    #[test]
    fn channels_last_strides() {
        let t = Tensor::with_layout(
            ScalarType::Float,
            &[2, 3, 4, 5],
            &[0, 2, 3, 1],
            ShapeDynamism::Static,
            None,
        )
        .unwrap();
        assert_eq!(t.strides(), &[60, 1, 15, 3]);
        assert!(
            Tensor::with_layout(
                ScalarType::Float,
                &[2, 3],
                &[0, 0],
                ShapeDynamism::Static,
                None
            )
            .is_err()
        );
    }
}
