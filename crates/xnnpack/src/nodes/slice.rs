//! `StaticSlice`: a window of the input (begin = offset, end = offset + size, an end of
//! 0 meaning the whole axis, as XNNPACK's `xnn_define_static_slice` reads it), for fp32
//! and int8 values.

use etch_kernels::{BackendError, KernelError};

use crate::dims::{Dims, MAX_DIMS};
use crate::graph::{NodeDef, Params, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, int8, int8_mut, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::nodes::strided::{contiguous_strides, copy_block, offset};
use crate::plan_builder::Builder;

/// A slice node.
#[derive(Debug, Clone)]
pub struct Slice {
    x: usize,
    y: usize,
    offsets: Dims,
    sizes: Dims,
    /// Whether the values are qint8 (bytes) rather than fp32.
    int8: bool,
}

/// Reads a `StaticSlice` node: as many sizes as offsets.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    let offsets = r.dims(1, "offsets")?;
    let sizes = r.dims(2, "sizes")?;
    if offsets.rank() != sizes.rank() {
        return Err(invalid(
            r.field("sizes"),
            format!("{} sizes for {} offsets", sizes.rank(), offsets.rank()),
        ));
    }
    node.params = Params::Slice { offsets, sizes };
    r.one_input(node, 3, 0)
}

/// Plans a `StaticSlice` node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Slice, BackendError> {
    let Params::Slice { offsets, sizes } = node.params else {
        return Err(invalid(b.field(i, node, "offsets"), "missing"));
    };
    let y = b.output(node);
    Ok(Slice {
        x: b.input(node, 0),
        y,
        offsets,
        sizes,
        int8: b.is_int8(y),
    })
}

impl Slice {
    /// The start of each dim of the slice of an input of dims `xd`.
    fn start(&self, xd: &Dims) -> [usize; MAX_DIMS] {
        let mut start = [0usize; MAX_DIMS];
        for (i, s) in start.iter_mut().enumerate().take(xd.rank()) {
            *s = slice_extent(xd.get(i), self.offsets.get(i), self.sizes.get(i)).0;
        }
        start
    }
}

impl NodeOp for Slice {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let xd = get(shapes, self.x);
        if xd.rank() != self.offsets.rank() {
            return Err("slice rank differs from the input's");
        }
        let mut d = xd;
        for i in 0..xd.rank() {
            d.as_mut_slice()[i] = slice_extent(xd.get(i), self.offsets.get(i), self.sizes.get(i)).1;
        }
        set(shapes, self.y, d);
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let (xd, yd) = (&call.shapes[self.x], &call.shapes[self.y]);
        let start = self.start(xd);
        let start = &start[..xd.rank()];
        let (x, out) = (call.inputs[0], call.output);
        if !self.int8 {
            return slice(xd, start, yd, x, out);
        }
        let (xn, yn) = (xd.numel().unwrap_or(0), yd.numel().unwrap_or(0));
        let src = int8(x).get(..xn).ok_or_else(|| short("slice"))?;
        let dst = int8_mut(out).get_mut(..yn).ok_or_else(|| short("slice"))?;
        slice(xd, start, yd, src, dst)
    }
}

/// Start and length of a static slice along an axis of `dim`, as XNNPACK's
/// `xnn_define_static_slice` reads it (begin = offset, end = offset + size; an end of 0
/// means the whole axis), clamped to the axis.
pub fn slice_extent(dim: usize, offset: usize, size: usize) -> (usize, usize) {
    let end = offset.saturating_add(size);
    let size = if end == 0 {
        dim.saturating_sub(offset)
    } else {
        size
    };
    let offset = offset.min(dim);
    (offset, size.min(dim - offset))
}

/// Copies the window of `x` starting at `start` with shape `yd` into `out`.
pub fn slice<T: Copy>(
    xd: &Dims,
    start: &[usize],
    yd: &Dims,
    x: &[T],
    out: &mut [T],
) -> Result<(), KernelError> {
    let xs = contiguous_strides(xd);
    let from = (x, offset(start, &xs), &xs);
    copy_block(yd, from, (out, 0, &contiguous_strides(yd)), "slice")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents() {
        assert_eq!(slice_extent(10, 2, 3), (2, 3));
        assert_eq!(slice_extent(10, 0, 0), (0, 10));
        assert_eq!(slice_extent(4, 2, 8), (2, 2));
        assert_eq!(slice_extent(4, 6, 1), (4, 0));
    }

    #[test]
    fn copies_a_window() {
        let d = |v: &[usize]| Dims::new(v).unwrap();
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let mut s = [0f32; 2];
        slice(&d(&[2, 3]), &[1, 1], &d(&[1, 2]), &x, &mut s).unwrap();
        assert_eq!(s, [4.0, 5.0]);
    }
}
