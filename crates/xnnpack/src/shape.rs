//! Shape inference per node kind: with the real input dims of a call, every node's
//! output dims follow from its inputs (`XNNExecutor.cpp` reshapes the runtime the same
//! way each call). Serialized dims are only upper bounds.

use crate::dims::{Dims, MAX_DIMS};
use crate::graph::Window;
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

/// The output shape of a fully connected node from `x` (`[..., k]`) to `y` (`[..., n]`).
fn fully_connected(shapes: &mut [Dims], x: usize, y: usize, n: usize, k: usize) -> ShapeResult {
    let xd = get(shapes, x);
    if xd.rank() == 0 || xd.get(xd.rank() - 1) != k {
        return Err("input's last dimension differs from the filter's input channels");
    }
    let mut d = xd;
    d.as_mut_slice()[xd.rank() - 1] = n;
    set(shapes, y, d);
    Ok(())
}

/// Infers the output shapes of `op` from its inputs' shapes in `shapes`.
pub fn infer(op: &Op, shapes: &mut [Dims]) -> ShapeResult {
    match op {
        Op::QuantizedFullyConnected { x, y, w, .. } => {
            fully_connected(shapes, *x, *y, w.n(), w.k())?
        }
        Op::Qs8FullyConnected { x, y, w, .. } => fully_connected(shapes, *x, *y, w.n(), w.k())?,
        Op::Unary { x, y, .. }
        | Op::Qs8Unary { x, y, .. }
        | Op::Copy { x, y }
        | Op::Softmax { x, y }
        | Op::QuantizeRows { x, y, .. } => {
            let d = get(shapes, *x);
            if matches!(op, Op::Softmax { .. }) && d.rank() == 0 {
                return Err("softmax needs at least one dimension");
            }
            set(shapes, *y, d);
        }
        Op::Binary { a, b, y, .. } | Op::Qs8Binary { a, b, y, .. } => {
            let d = broadcast(&get(shapes, *a), &get(shapes, *b))
                .ok_or("input shapes do not broadcast")?;
            set(shapes, *y, d);
        }
        Op::FullyConnected { x, y, filter, .. } => {
            let (n, k) = filter.dims(shapes);
            fully_connected(shapes, *x, *y, n, k)?
        }
        Op::BatchMatMul {
            a,
            b,
            y,
            transpose_b,
        } => {
            let ad = get(shapes, *a);
            let bd = get(shapes, *b);
            if ad.rank() < 2 || bd.rank() < 2 {
                return Err("batch matrix multiply needs rank 2 or more");
            }
            let (m, k) = (ad.get(ad.rank() - 2), ad.get(ad.rank() - 1));
            let (kb, n) = if *transpose_b {
                (bd.get(bd.rank() - 1), bd.get(bd.rank() - 2))
            } else {
                (bd.get(bd.rank() - 2), bd.get(bd.rank() - 1))
            };
            if k != kb {
                return Err("inner dimensions differ");
            }
            let ab = Dims::new(&ad.as_slice()[..ad.rank() - 2]).unwrap_or_default();
            let bb = Dims::new(&bd.as_slice()[..bd.rank() - 2]).unwrap_or_default();
            let batch = broadcast(&ab, &bb).ok_or("batch dimensions do not broadcast")?;
            let lead = batch.rank();
            let mut out = [0usize; crate::dims::MAX_DIMS + 2];
            out[..lead].copy_from_slice(batch.as_slice());
            out[lead..lead + 2].copy_from_slice(&[m, n]);
            set(
                shapes,
                *y,
                Dims::new(&out[..lead + 2]).ok_or("too many dimensions")?,
            );
        }
        Op::Transpose { x, y, perm } => {
            let xd = get(shapes, *x);
            if xd.rank() != perm.rank() {
                return Err("permutation rank differs from the input's");
            }
            let mut d = xd;
            for (i, &p) in perm.as_slice().iter().enumerate() {
                d.as_mut_slice()[i] = xd.get(p);
            }
            set(shapes, *y, d);
        }
        Op::Reshape { x, y, shape } => {
            let n = get(shapes, *x).numel().ok_or("input size overflows")?;
            let mut d = *shape;
            let inferred = d.as_slice().iter().position(|&v| v == 0);
            if let Some(k) = inferred {
                d.as_mut_slice()[k] = 1;
                let rest = d.numel().ok_or("shape overflows")?;
                if rest == 0 || n % rest != 0 {
                    return Err("cannot infer the reshape dimension");
                }
                d.as_mut_slice()[k] = n / rest;
            } else if d.numel() != Some(n) {
                return Err("reshape changes the element count");
            }
            set(shapes, *y, d);
        }
        Op::Slice {
            x,
            y,
            offsets,
            sizes,
        } => {
            let xd = get(shapes, *x);
            if xd.rank() != offsets.rank() {
                return Err("slice rank differs from the input's");
            }
            let mut d = xd;
            for i in 0..xd.rank() {
                let (o, s) = slice_extent(xd.get(i), offsets.get(i), sizes.get(i));
                let _ = o;
                d.as_mut_slice()[i] = s;
            }
            set(shapes, *y, d);
        }
        Op::Concat { xs, n, axis, y } => {
            let first = get(shapes, xs[0]);
            if *axis >= first.rank() {
                return Err("concatenation axis out of range");
            }
            let mut d = first;
            let mut total = 0usize;
            for &v in &xs[..*n] {
                let vd = get(shapes, v);
                if vd.rank() != first.rank() {
                    return Err("inputs differ in rank");
                }
                for i in 0..vd.rank() {
                    if i != *axis && vd.get(i) != first.get(i) {
                        return Err("inputs differ outside the concatenation axis");
                    }
                }
                total = total.checked_add(vd.get(*axis)).ok_or("size overflows")?;
            }
            d.as_mut_slice()[*axis] = total;
            set(shapes, *y, d);
        }
        Op::Pad {
            x, y, pre, post, ..
        } => {
            let xd = get(shapes, *x);
            if xd.rank() > pre.rank() {
                return Err("fewer paddings than input dimensions");
            }
            let mut d = xd;
            for i in 0..xd.rank() {
                d.as_mut_slice()[i] = xd.get(i) + pre.get(i) + post.get(i);
            }
            set(shapes, *y, d);
        }
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
        Op::Resize {
            x,
            y,
            height,
            width,
            ..
        } => {
            let xd = get(shapes, *x);
            if xd.rank() != 4 {
                return Err("bilinear resize input must be NHWC (rank 4)");
            }
            if xd.get(1) == 0 || xd.get(2) == 0 {
                return Err("bilinear resize of an empty image");
            }
            set(
                shapes,
                *y,
                Dims::new(&[xd.get(0), *height, *width, xd.get(3)]).unwrap_or_default(),
            );
        }
    }
    Ok(())
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

    #[test]
    fn slices() {
        assert_eq!(slice_extent(10, 2, 3), (2, 3));
        assert_eq!(slice_extent(10, 0, 0), (0, 10));
        assert_eq!(slice_extent(4, 2, 8), (2, 2));
        assert_eq!(slice_extent(4, 6, 1), (4, 0));
    }

    #[test]
    fn windows() {
        assert_eq!(window_out(224, 2, 3, 1, 2), Some(112));
        assert_eq!(window_out(7, 0, 7, 1, 1), Some(1));
        assert_eq!(window_out(2, 0, 3, 1, 1), None);
    }
}
