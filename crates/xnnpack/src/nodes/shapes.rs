//! Shape inference helpers the node kinds share: with the real input dims of a call,
//! every node's output dims follow from its inputs (`XNNExecutor.cpp` reshapes the
//! runtime the same way each call). Serialized dims are only upper bounds.

use crate::dims::{Dims, MAX_DIMS};

/// Why a shape could not be inferred (rendered with the node at the call site).
pub type ShapeResult = Result<(), &'static str>;

/// Sets the dims of value `v`.
pub fn set(shapes: &mut [Dims], v: usize, d: Dims) {
    if let Some(s) = shapes.get_mut(v) {
        *s = d;
    }
}

/// The dims of value `v`.
pub fn get(shapes: &[Dims], v: usize) -> Dims {
    shapes.get(v).copied().unwrap_or_default()
}

/// Numpy broadcasting of two shapes, right-aligned (`xnn_shape_binary_broadcast`).
pub fn broadcast(a: &Dims, b: &Dims) -> Option<Dims> {
    let rank = a.rank().max(b.rank());
    let mut out = [0usize; MAX_DIMS];
    for i in 0..rank {
        let da = if i < a.rank() {
            a.get(a.rank() - 1 - i)
        } else {
            1
        };
        let db = if i < b.rank() {
            b.get(b.rank() - 1 - i)
        } else {
            1
        };
        let d = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
        out[rank - 1 - i] = if da == 0 || db == 0 { 0 } else { d };
    }
    Dims::new(&out[..rank])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        let a = Dims::new(&[2, 1, 4]).unwrap();
        let b = Dims::new(&[3, 1]).unwrap();
        assert_eq!(broadcast(&a, &b).unwrap().as_slice(), &[2, 3, 4]);
        assert!(broadcast(&a, &Dims::new(&[3]).unwrap()).is_none());
        assert_eq!(
            broadcast(&a, &Dims::new(&[]).unwrap()).unwrap().as_slice(),
            &[2, 1, 4]
        );
    }
}
