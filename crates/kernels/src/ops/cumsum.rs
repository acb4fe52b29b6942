//! `cumsum.out`: running sums along one dim.
//!
//! As the portable kernel, every input element is cast to the out dtype and added to
//! the previous out element in the out dtype (f16/bf16 sums are rounded at every
//! step), the first element of each line is the input's own value. Both tensors
//! must be contiguous. The work walks `[leading, size, trailing]` in blocks of
//! [`BLOCK`] trailing elements held on the stack.

use etch_base::ScalarType;

use super::elementwise::BLOCK;
use super::elementwise::dtype::{
    Element, In, Out, is_supported, narrow_slice, unsupported, with_compute,
};
use super::elementwise::num::Num;
use super::shape::common::require_contiguous;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::cumsum.out", cumsum);
}

op_args! {
    /// `cumsum.out(Tensor self, int dim, *, ScalarType? dtype=None, Tensor(a!) out)`.
    struct CumsumArgs = "aten::cumsum.out" {
        input: Tensor,
        dim: i64,
        dtype: Option<ScalarType>,
        out: OutArg,
    } returns 1
}

fn cumsum(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let CumsumArgs {
        input: x,
        dim,
        dtype,
        out,
    } = CumsumArgs::unpack(a)?;
    let dim = x.normalize_dim(dim)?;
    let out = out.resize(a, x.sizes())?;
    for t in [x.dtype(), out.dtype()] {
        if !is_supported(t) {
            return Err(unsupported(t, "cumsum"));
        }
    }
    match dtype {
        Some(d) if d != out.dtype() => {
            return Err(KernelError::DtypeMismatch {
                expected: d,
                found: out.dtype(),
            });
        }
        None if !etch_base::can_cast(x.dtype(), out.dtype()) => {
            return Err(KernelError::invalid(format!(
                "cumsum: cannot cast {:?} input to a {:?} out",
                x.dtype(),
                out.dtype()
            )));
        }
        _ => {}
    }
    require_contiguous(&x, "cumsum input")?;
    require_contiguous(&out, "cumsum out")?;
    let numel = x.numel();
    if numel == 0 {
        return Ok(());
    }
    let (leading, size, trailing) = if x.rank() == 0 {
        (1, 1, 1)
    } else {
        let s = x.sizes();
        (
            s[..dim].iter().product::<usize>(),
            s[dim],
            s[dim + 1..].iter().product::<usize>(),
        )
    };
    let src = In::read(ctx, &x)?;
    let mut dst = Out::write(ctx, &out)?;
    if src.len() < numel || dst.len() < numel {
        return Err(KernelError::invalid("cumsum: tensor storage is too small"));
    }
    let out_dtype = out.dtype();
    with_compute!(out_dtype, A => {
        running_sums::<A>(&src, &mut dst, out_dtype, leading, size, trailing);
        Ok(())
    })
}

/// The running sums of `src` (`[leading, size, trailing]`, in bounds) into `dst`,
/// in `A` rounded through `out_dtype` after every cast and every add.
fn running_sums<A: Element + Num>(
    src: &In<'_>,
    dst: &mut Out<'_>,
    out_dtype: ScalarType,
    leading: usize,
    size: usize,
    trailing: usize,
) {
    let mut acc = [A::default(); BLOCK];
    let mut x = [A::default(); BLOCK];
    for l in 0..leading {
        let base = l * size * trailing;
        let mut t0 = 0;
        while t0 < trailing {
            let n = BLOCK.min(trailing - t0);
            let (acc, x) = (&mut acc[..n], &mut x[..n]);
            for j in 0..size {
                let at = base + j * trailing + t0;
                src.load(at, 1, x);
                narrow_slice(out_dtype, x);
                if j == 0 {
                    acc.copy_from_slice(x);
                } else {
                    for (s, &v) in acc.iter_mut().zip(x.iter()) {
                        *s = s.add(v);
                    }
                    narrow_slice(out_dtype, acc);
                }
                dst.store(at, 1, acc);
            }
            t0 += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ops::elementwise::testutil::{Lcg, assert_refused, read, small_ints, tensor};
    use crate::testing::Harness;

    /// Reference running sums along `dim` of row-major `vals`.
    fn reference(shape: &[usize], dim: usize, vals: &[f64]) -> Vec<f64> {
        let lead: usize = shape[..dim].iter().product();
        let trail: usize = shape[dim + 1..].iter().product();
        let size = shape[dim];
        let mut out = vals.to_vec();
        for l in 0..lead {
            for t in 0..trail {
                for j in 1..size {
                    let at = (l * size + j) * trail + t;
                    out[at] += out[at - trail];
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn matches_reference(
            shape in proptest::collection::vec(0usize..5, 1..5),
            pick in any::<usize>(),
            dt in 0usize..4,
            seed in any::<u64>(),
        ) {
            let dtype = [ScalarType::Float, ScalarType::Int, ScalarType::Long, ScalarType::Double][dt];
            let n: usize = shape.iter().product();
            let vals = small_ints(&mut Lcg(seed), dtype, n);
            let dim = pick % shape.len();
            let mut h = Harness::new();
            let x = tensor(&mut h, dtype, &shape, &vals);
            let d = h.int(dim as i64 - if pick % 2 == 1 { shape.len() as i64 } else { 0 });
            let none = h.none();
            let out = h.out(dtype, &shape);
            h.call("aten::cumsum.out", &[x, d, none, out, out]).unwrap();
            // Small integers: every sum is exact in each dtype.
            prop_assert_eq!(read(&mut h, out), reference(&shape, dim, &vals));
        }
    }

    #[test]
    fn dtype_argument_and_rounding() {
        let mut h = Harness::new();
        // An int input summed into f32 with dtype=float.
        let x = tensor(
            &mut h,
            ScalarType::Int,
            &[2, 3],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        );
        let d = h.int(1);
        let f = h.int(ScalarType::Float as i64);
        let out = h.out(ScalarType::Float, &[2, 3]);
        h.call("aten::cumsum.out", &[x, d, f, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1., 3., 6., 4., 9., 15.]);
        // f16: every partial sum is rounded to f16 (2048 + 1 rounds back to 2048).
        let big = tensor(&mut h, ScalarType::Half, &[3], &[2048.0, 1.0, 1.0]);
        let z = h.int(0);
        let none = h.none();
        let oh = h.out(ScalarType::Half, &[3]);
        h.call("aten::cumsum.out", &[big, z, none, oh, oh]).unwrap();
        assert_eq!(read(&mut h, oh), vec![2048.0, 2048.0, 2048.0]);
        // A 0-d input is copied; -0.0 stays the first element.
        let s = tensor(&mut h, ScalarType::Float, &[], &[-0.0]);
        let m1 = h.int(-1);
        let os = h.out(ScalarType::Float, &[]);
        h.call("aten::cumsum.out", &[s, m1, none, os, os]).unwrap();
        assert!(h.read::<f32>(os)[0].is_sign_negative());
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut h = Harness::new();
        let x = tensor(&mut h, ScalarType::Float, &[2, 3], &[0.0; 6]);
        let none = h.none();
        let out = h.out(ScalarType::Float, &[2, 3]);
        let far = h.int(2);
        assert_refused(&mut h, "aten::cumsum.out", &[x, far, none, out, out]);
        let d = h.int(0);
        let oi = h.out(ScalarType::Int, &[2, 3]);
        assert_refused(&mut h, "aten::cumsum.out", &[x, d, none, oi, oi]);
        let long = h.int(ScalarType::Long as i64);
        assert_refused(&mut h, "aten::cumsum.out", &[x, d, long, out, out]);
        let small = h.out(ScalarType::Float, &[2, 2]);
        assert_refused(&mut h, "aten::cumsum.out", &[x, d, none, small, small]);
    }
}
