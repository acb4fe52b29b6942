//! `StaticTranspose`: output axis `i` is input axis `perm[i]` (the NCHW <-> NHWC edges
//! of a delegated CNN), for fp32 and int8 values.

use etch_kernels::{BackendError, KernelError};

use crate::dims::{Dims, MAX_DIMS};
use crate::graph::{NodeDef, Params, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, int8, int8_mut, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::nodes::strided::{contiguous_strides, for_each_run};
use crate::plan_builder::Builder;

/// A transpose node.
#[derive(Debug, Clone)]
pub struct Transpose {
    x: usize,
    y: usize,
    perm: Dims,
    /// Whether the values are qint8 (bytes) rather than fp32.
    int8: bool,
}

/// Reads a `StaticTranspose` node: `perm` must be a permutation of `num_dims` axes.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    let perm = r.dims(1, "perm")?;
    let n = r.usize(0, "num_dims")?;
    if n != perm.rank() {
        return Err(invalid(
            r.field("num_dims"),
            format!("{n} but perm has {}", perm.rank()),
        ));
    }
    let mut seen = [false; MAX_DIMS];
    for &p in perm.as_slice() {
        if p >= perm.rank() || std::mem::replace(&mut seen[p], true) {
            return Err(invalid(
                r.field("perm"),
                format!("{perm:?} is not a permutation"),
            ));
        }
    }
    node.params = Params::Transpose(perm);
    r.one_input(node, 2, 0)
}

/// Plans a `StaticTranspose` node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Transpose, BackendError> {
    let Params::Transpose(perm) = node.params else {
        return Err(invalid(b.field(i, node, "perm"), "missing"));
    };
    let y = b.output(node);
    Ok(Transpose {
        x: b.input(node, 0),
        y,
        perm,
        int8: b.is_int8(y),
    })
}

impl NodeOp for Transpose {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let xd = get(shapes, self.x);
        if xd.rank() != self.perm.rank() {
            return Err("permutation rank differs from the input's");
        }
        let mut d = xd;
        for (i, &p) in self.perm.as_slice().iter().enumerate() {
            d.as_mut_slice()[i] = xd.get(p);
        }
        set(shapes, self.y, d);
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let xd = &call.shapes[self.x];
        let (x, out) = (call.inputs[0], call.output);
        if !self.int8 {
            return transpose(xd, &self.perm, x, out);
        }
        let n = xd.numel().unwrap_or(0);
        let src = int8(x).get(..n).ok_or_else(|| short("transpose"))?;
        let dst = int8_mut(out)
            .get_mut(..n)
            .ok_or_else(|| short("transpose"))?;
        transpose(xd, &self.perm, src, dst)
    }
}

/// `out = transpose(x, perm)`: output axis `i` is input axis `perm[i]`.
pub fn transpose<T: Copy>(
    xd: &Dims,
    perm: &Dims,
    x: &[T],
    out: &mut [T],
) -> Result<(), KernelError> {
    let xs = contiguous_strides(xd);
    let mut yd = *xd;
    let mut src = [0usize; MAX_DIMS];
    for (i, &p) in perm.as_slice().iter().enumerate() {
        yd.as_mut_slice()[i] = xd.get(p);
        src[i] = xs[p];
    }
    let dst = contiguous_strides(&yd);
    let r = xd.rank();
    if r > 0 && yd.get(r - 1) < xd.get(r - 1) {
        // The output's innermost axis is the shorter (an NCHW image to NHWC: runs of 3
        // channels): walk the input's axes instead, reading runs of its innermost axis
        // and writing them strided, for far fewer and longer runs.
        let mut dst_of_x = [0usize; MAX_DIMS];
        for (i, &p) in perm.as_slice().iter().enumerate() {
            dst_of_x[p] = dst[i];
        }
        let dst_step = dst_of_x[r - 1];
        return for_each_run(xd, &xs, &dst_of_x, |so, d, run, _| {
            let src = x.get(so..so + run).ok_or_else(|| short("transpose"))?;
            for (j, &v) in src.iter().enumerate() {
                *out.get_mut(d + j * dst_step)
                    .ok_or_else(|| short("transpose"))? = v;
            }
            Ok(())
        });
    }
    for_each_run(&yd, &src, &dst, |so, d, run, step| {
        let o = out.get_mut(d..d + run).ok_or_else(|| short("transpose"))?;
        if step == 1 {
            o.copy_from_slice(x.get(so..so + run).ok_or_else(|| short("transpose"))?);
        } else {
            for (j, v) in o.iter_mut().enumerate() {
                *v = *x.get(so + j * step).ok_or_else(|| short("transpose"))?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both walks (output-major and input-major) against index arithmetic, on every
    /// permutation of a 4-d tensor with axes of different lengths.
    #[test]
    fn transposes_every_permutation_of_four_axes() {
        let xd = Dims::new(&[2, 3, 5, 4]).unwrap();
        let x: Vec<u16> = (0..120).collect();
        let perms = [
            [0, 1, 2, 3],
            [0, 2, 3, 1],
            [0, 3, 1, 2],
            [3, 2, 1, 0],
            [1, 0, 3, 2],
            [2, 3, 0, 1],
            [0, 1, 3, 2],
            [3, 0, 1, 2],
        ];
        for perm in perms {
            let mut out = vec![0u16; 120];
            transpose(&xd, &Dims::new(&perm).unwrap(), &x, &mut out).unwrap();
            let yd: Vec<usize> = perm.iter().map(|&p| xd.get(p)).collect();
            let xs = [60, 20, 4, 1];
            let mut k = 0;
            for a in 0..yd[0] {
                for b in 0..yd[1] {
                    for c in 0..yd[2] {
                        for d in 0..yd[3] {
                            let idx = [a, b, c, d];
                            let mut src = 0;
                            for i in 0..4 {
                                src += idx[i] * xs[perm[i]];
                            }
                            assert_eq!(out[k], x[src], "{perm:?} at {idx:?}");
                            k += 1;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn transposes_a_matrix() {
        let d = |v: &[usize]| Dims::new(v).unwrap();
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let mut out = [0f32; 6];
        transpose(&d(&[2, 3]), &d(&[1, 0]), &x, &mut out).unwrap();
        assert_eq!(out, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }
}
