//! `glu.out`: the gated linear unit, `a * sigmoid(b)` where `a` and `b` are the two
//! halves of the input along `dim`.
//!
//! As the portable kernel, it takes float inputs (f32, f64, f16, bf16) and computes
//! `a * (1 / (1 + exp(-b)))` in the input's compute type (f32 for the 16-bit types),
//! casting to the out dtype on store. Both tensors must be contiguous; the halves are
//! walked as `[leading, 2, half, trailing]` in stack blocks of [`BLOCK`] elements.

use etch_base::ScalarType;

use super::elementwise::BLOCK;
use super::elementwise::dtype::{Element, In, Out, narrow_slice, with_compute};
use super::elementwise::num::Num;
use super::shape::common::require_contiguous;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::glu.out", glu);
}

op_args! {
    /// `glu.out(Tensor self, int dim=-1, *, Tensor(a!) out)`.
    struct GluArgs = "aten::glu.out" {
        input: Tensor,
        dim: i64,
        out: OutArg,
    } returns 1
}

fn glu(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let GluArgs { input: x, dim, out } = GluArgs::unpack(a)?;
    if x.rank() == 0 {
        return Err(KernelError::invalid("glu of a 0-d tensor"));
    }
    let dim = x.normalize_dim(dim)?;
    let size = x.sizes()[dim];
    if size % 2 != 0 {
        return Err(KernelError::invalid(format!(
            "glu: dim {dim} has odd size {size}; it must split in halves"
        )));
    }
    for t in [x.dtype(), out.tensor().dtype()] {
        if !t.is_floating_point() {
            return Err(KernelError::UnsupportedDtype {
                dtype: t,
                what: "glu (floating point only)",
            });
        }
    }
    let rank = x.rank();
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(x.sizes());
    sizes[dim] = size / 2;
    let out = out.resize(a, &sizes[..rank])?;
    require_contiguous(&x, "glu input")?;
    require_contiguous(&out, "glu out")?;
    let numel = out.numel();
    if numel == 0 {
        return Ok(());
    }
    let leading: usize = x.sizes()[..dim].iter().product();
    let trailing: usize = x.sizes()[dim + 1..].iter().product();
    // Each leading row holds the `a` half, then the `b` half, of `half` elements each.
    let half = size / 2 * trailing;
    let src = In::read(ctx, &x)?;
    let mut dst = Out::write(ctx, &out)?;
    if src.len() < 2 * numel || dst.len() < numel {
        return Err(KernelError::invalid("glu: tensor storage is too small"));
    }
    let compute = x.dtype();
    with_compute!(compute, C => {
        gate::<C>(&src, &mut dst, compute, leading, half);
        Ok(())
    })
}

/// `dst[l, j] = a * sigmoid(b)` with `a = src[l, j]`, `b = src[l, half + j]`, in `C`
/// rounded through `dtype` (the input's), for every leading row `l`.
fn gate<C: Element + Num>(
    src: &In<'_>,
    dst: &mut Out<'_>,
    dtype: ScalarType,
    leading: usize,
    half: usize,
) {
    let mut av = [C::default(); BLOCK];
    let mut bv = [C::default(); BLOCK];
    for l in 0..leading {
        let mut j = 0;
        while j < half {
            let n = BLOCK.min(half - j);
            let (av, bv) = (&mut av[..n], &mut bv[..n]);
            src.load(l * 2 * half + j, 1, av);
            src.load(l * 2 * half + half + j, 1, bv);
            for (x, &g) in av.iter_mut().zip(bv.iter()) {
                *x = x.mul(C::ONE.div(C::ONE.add(C::from_f64((-g.to_f64()).exp()))));
            }
            narrow_slice(dtype, av);
            dst.store(l * half + j, 1, av);
            j += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;

    use crate::ops::elementwise::testutil::{Lcg, assert_close, assert_refused, read, tensor};
    use crate::testing::Harness;

    #[test]
    fn matches_reference_on_every_dim() {
        let shape = [2usize, 4, 6];
        let n: usize = shape.iter().product();
        let vals = Lcg(7).vec(n, 3.0);
        for dim in 0..3 {
            let lead: usize = shape[..dim].iter().product();
            let trail: usize = shape[dim + 1..].iter().product();
            let h2 = shape[dim] / 2;
            let mut want = Vec::new();
            for l in 0..lead {
                for j in 0..h2 * trail {
                    let a = vals[l * 2 * h2 * trail + j];
                    let b = vals[l * 2 * h2 * trail + h2 * trail + j];
                    want.push(a / (1.0 + (-b).exp()));
                }
            }
            let mut out_shape = shape;
            out_shape[dim] /= 2;
            for dtype in [ScalarType::Float, ScalarType::Double] {
                let mut h = Harness::new();
                let x = tensor(&mut h, dtype, &shape, &vals);
                let d = h.int(dim as i64 - 3);
                let out = h.out(dtype, &out_shape);
                h.call("aten::glu.out", &[x, d, out, out]).unwrap();
                assert_eq!(h.tensor_meta(out).sizes(), &out_shape);
                assert_close(&read(&mut h, out), &want, 1e-6, 1e-6);
            }
        }
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut h = Harness::new();
        let x = tensor(&mut h, ScalarType::Float, &[2, 3], &[0.0; 6]);
        let out = h.out(ScalarType::Float, &[2, 3]);
        let (d0, d1, d2) = (h.int(0), h.int(1), h.int(2));
        h.call("aten::glu.out", &[x, d0, out, out]).unwrap();
        assert_refused(&mut h, "aten::glu.out", &[x, d1, out, out]);
        assert_refused(&mut h, "aten::glu.out", &[x, d2, out, out]);
        let xi = tensor(&mut h, ScalarType::Int, &[2, 2], &[0.0; 4]);
        assert_refused(&mut h, "aten::glu.out", &[xi, d0, out, out]);
        let oi = h.out(ScalarType::Int, &[1, 3]);
        assert_refused(&mut h, "aten::glu.out", &[x, d0, oi, oi]);
        let s = tensor(&mut h, ScalarType::Float, &[], &[1.0]);
        assert_refused(&mut h, "aten::glu.out", &[s, d0, out, out]);
    }
}
