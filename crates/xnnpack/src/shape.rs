//! Shape inference per node kind: with the real input dims of a call, every node's
//! output dims follow from its inputs (`XNNExecutor.cpp` reshapes the runtime the same
//! way each call). Serialized dims are only upper bounds.

use crate::dims::Dims;
use crate::graph::Window;
use crate::nodes::NodeOp;
use crate::plan::{ConvKind, Op};

/// Why a shape could not be inferred (rendered with the node at the call site).
pub type ShapeResult = Result<(), &'static str>;

fn set(shapes: &mut [Dims], v: usize, d: Dims) {
    if let Some(s) = shapes.get_mut(v) {
        *s = d;
    }
}

fn get(shapes: &[Dims], v: usize) -> Dims {
    shapes.get(v).copied().unwrap_or_default()
}

impl Window {
    /// Output rows of this window over an input `in_h` rows tall, or `None` where the
    /// window (dilated) is taller than the padded input.
    fn output_height(&self, in_h: usize) -> Option<usize> {
        let pad = self.pad_top + self.pad_bottom;
        window_out(in_h, pad, self.kernel_h, self.dilation_h, self.stride_h)
    }

    /// Output columns of this window over an input `in_w` columns wide, or `None`
    /// where the window (dilated) is wider than the padded input.
    fn output_width(&self, in_w: usize) -> Option<usize> {
        let pad = self.pad_left + self.pad_right;
        window_out(in_w, pad, self.kernel_w, self.dilation_w, self.stride_w)
    }
}

/// Output extent of a convolution or pooling window along one axis.
fn window_out(
    input: usize,
    pad: usize,
    kernel: usize,
    dilation: usize,
    stride: usize,
) -> Option<usize> {
    let padded = input.checked_add(pad)?;
    let effective = dilation
        .checked_mul(kernel.checked_sub(1)?)?
        .checked_add(1)?;
    if padded < effective {
        return None;
    }
    Some((padded - effective) / stride + 1)
}

/// Infers the output shapes of `op` from its inputs' shapes in `shapes`.
pub fn infer(op: &Op, shapes: &mut [Dims]) -> ShapeResult {
    match op {
        Op::Node(n) => n.infer_shape(shapes)?,
        Op::Conv(c) => {
            let xd = get(shapes, c.x);
            if xd.rank() != 4 {
                return Err("convolution input must be NHWC (rank 4)");
            }
            let w = &c.window;
            let in_c = match c.kind {
                ConvKind::Depthwise => w.groups,
                _ => w.groups * w.group_in,
            };
            if xd.get(3) != in_c {
                return Err("input channels differ from the filter's");
            }
            let (oh, ow) = match c.kind {
                ConvKind::Transposed => {
                    let f = |i: usize, s: usize, adj: usize, k: usize, dil: usize, pad: usize| {
                        let full = s
                            .checked_mul(i.checked_sub(1)?)?
                            .checked_add(adj)?
                            .checked_add(dil.checked_mul(k - 1)?)?
                            .checked_add(1)?;
                        full.checked_sub(pad)
                    };
                    (
                        f(
                            xd.get(1),
                            w.stride_h,
                            w.adjust_h,
                            w.kernel_h,
                            w.dilation_h,
                            w.pad_top + w.pad_bottom,
                        )
                        .ok_or("output height underflows")?,
                        f(
                            xd.get(2),
                            w.stride_w,
                            w.adjust_w,
                            w.kernel_w,
                            w.dilation_w,
                            w.pad_left + w.pad_right,
                        )
                        .ok_or("output width underflows")?,
                    )
                }
                _ => (
                    w.output_height(xd.get(1))
                        .ok_or("kernel taller than the padded input")?,
                    w.output_width(xd.get(2))
                        .ok_or("kernel wider than the padded input")?,
                ),
            };
            let out_c = w.groups * w.group_out;
            set(
                shapes,
                c.y,
                Dims::new(&[xd.get(0), oh, ow, out_c]).unwrap_or_default(),
            );
        }
        Op::Pool(p) => {
            let xd = get(shapes, p.x);
            if xd.rank() != 4 {
                return Err("pooling input must be NHWC (rank 4)");
            }
            let w = &p.window;
            let oh = w
                .output_height(xd.get(1))
                .ok_or("pooling window taller than the padded input")?;
            let ow = w
                .output_width(xd.get(2))
                .ok_or("pooling window wider than the padded input")?;
            set(
                shapes,
                p.y,
                Dims::new(&[xd.get(0), oh, ow, xd.get(3)]).unwrap_or_default(),
            );
        }
        Op::GlobalAvgPool {
            x, y, keep_dims, ..
        } => {
            let xd = get(shapes, *x);
            let r = xd.rank();
            if r < 3 {
                return Err("global average pooling needs rank 3 or more");
            }
            // The pooled height and width (dims r-3 and r-2) become 1 or go.
            let mut out = [0usize; crate::dims::MAX_DIMS];
            let mut n = 0;
            for (i, &d) in xd.as_slice().iter().enumerate() {
                let pooled = i == r - 3 || i == r - 2;
                if !pooled || *keep_dims {
                    out[n] = if pooled { 1 } else { d };
                    n += 1;
                }
            }
            set(shapes, *y, Dims::new(&out[..n]).unwrap_or_default());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows() {
        assert_eq!(window_out(224, 2, 3, 1, 2), Some(112));
        assert_eq!(window_out(7, 0, 7, 1, 1), Some(1));
        assert_eq!(window_out(2, 0, 3, 1, 1), None);
    }
}
