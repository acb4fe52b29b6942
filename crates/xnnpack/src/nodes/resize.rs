//! `StaticResizeBilinear2D` of NHWC images (`etch_linalg::resize`), with XNNPACK's
//! align-corners and TensorFlow legacy modes.

use etch_kernels::{BackendError, KernelError};
use etch_linalg::resize;

use crate::dims::Dims;
use crate::graph::{NodeDef, Params, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, checked, per_image};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::plan_builder::Builder;
use crate::schema::{FLAG_ALIGN_CORNERS, FLAG_TENSORFLOW_LEGACY_MODE};

/// A bilinear resize node.
#[derive(Debug, Clone)]
pub struct ResizeBilinear {
    x: usize,
    y: usize,
    height: usize,
    width: usize,
    align_corners: bool,
    legacy: bool,
}

/// Reads a `StaticResizeBilinear2D` node: output extents in `1..2^24`.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    let height = r.usize(0, "new_height")?;
    let width = r.usize(1, "new_width")?;
    for (v, n) in [(height, "new_height"), (width, "new_width")] {
        if v == 0 || v >= 1 << 24 {
            return Err(invalid(r.field(n), format!("{v} is out of range")));
        }
    }
    node.params = Params::Resize { height, width };
    r.one_input(node, 2, FLAG_ALIGN_CORNERS | FLAG_TENSORFLOW_LEGACY_MODE)
}

/// Plans a `StaticResizeBilinear2D` node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<ResizeBilinear, BackendError> {
    let Params::Resize { height, width } = node.params else {
        return Err(invalid(b.field(i, node, "new_height"), "missing"));
    };
    Ok(ResizeBilinear {
        x: b.input(node, 0),
        y: b.output(node),
        height,
        width,
        align_corners: node.flags & FLAG_ALIGN_CORNERS != 0,
        legacy: node.flags & FLAG_TENSORFLOW_LEGACY_MODE != 0,
    })
}

impl NodeOp for ResizeBilinear {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let xd = get(shapes, self.x);
        if xd.rank() != 4 {
            return Err("bilinear resize input must be NHWC (rank 4)");
        }
        if xd.get(1) == 0 || xd.get(2) == 0 {
            return Err("bilinear resize of an empty image");
        }
        let d = [xd.get(0), self.height, self.width, xd.get(3)];
        set(shapes, self.y, Dims::new(&d).unwrap_or_default());
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let d = call.shapes[self.x];
        let (nb, h, w, c) = (d.get(0), d.get(1), d.get(2), d.get(3));
        per_image(
            "resize",
            nb,
            (call.inputs[0], h * w * c),
            (call.output, self.height * self.width * c),
            |src, dst| {
                let ok = resize::resize_bilinear_nhwc(
                    h,
                    w,
                    c,
                    self.height,
                    self.width,
                    self.align_corners,
                    self.legacy,
                    src,
                    dst,
                );
                checked(ok, "bilinear resize")
            },
        )
    }
}
