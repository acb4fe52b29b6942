//! `_softmax` and `_log_softmax` along one dim, numerically stable: the row maximum
//! is subtracted before `exp`. f16/bf16 compute in f32; `half_to_float` writes an f32
//! out from a 16-bit input.

use etch_base::ScalarType;

use super::elementwise::BLOCK;
use super::elementwise::dtype::{In, Out};
use super::elementwise::num::Num;
use crate::ops::shape::common::strided_offset;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, GRAIN_SIZE, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::_softmax.out", |c, a| softmax(c, a, false));
    r.register("aten::_log_softmax.out", |c, a| softmax(c, a, true));
}

op_args! {
    /// `_softmax.out(Tensor self, int dim, bool half_to_float, *, Tensor(a!) out)` (and
    /// `_log_softmax.out`).
    struct SoftmaxArgs = "aten::<_softmax|_log_softmax>.out" {
        input: Tensor,
        dim: i64,
        half_to_float: bool,
        out: OutArg,
    } returns 1
}

fn softmax(ctx: &KernelContext<'_>, a: &mut Args<'_>, log: bool) -> Result<(), KernelError> {
    let SoftmaxArgs {
        input: x,
        dim,
        half_to_float,
        out,
    } = SoftmaxArgs::unpack(a)?;
    let dim = x.normalize_dim(dim)?;
    if !x.dtype().is_floating_point() {
        return Err(KernelError::UnsupportedDtype {
            dtype: x.dtype(),
            what: "softmax (floating point only)",
        });
    }
    let expected = if half_to_float {
        if !matches!(x.dtype(), ScalarType::Half | ScalarType::BFloat16) {
            return Err(KernelError::invalid(
                "softmax: half_to_float needs a Half or BFloat16 input",
            ));
        }
        ScalarType::Float
    } else {
        x.dtype()
    };
    let out = out.resize(a, x.sizes())?;
    if out.dtype() != expected {
        return Err(KernelError::DtypeMismatch {
            expected,
            found: out.dtype(),
        });
    }
    if x.dim_order() != out.dim_order() {
        return Err(KernelError::invalid(
            "softmax: input and out must have the same dim order",
        ));
    }
    if x.numel() == 0 {
        return Ok(());
    }
    if x.dtype() == ScalarType::Double {
        run::<f64>(ctx, &x, &out, dim, log)
    } else {
        run::<f32>(ctx, &x, &out, dim, log)
    }
}

/// Rows of the softmax: every index of the other dims, with the row's elements at
/// `base + i * stride` (the same offsets in input and out, which share a layout).
struct Rows {
    rank: usize,
    sizes: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    len: usize,
    stride: usize,
}

impl Rows {
    fn new(x: &Tensor, dim: usize) -> Self {
        let mut r = Rows {
            rank: 0,
            sizes: [0; MAX_RANK],
            strides: [0; MAX_RANK],
            len: 1,
            stride: 1,
        };
        if x.rank() == 0 {
            return r;
        }
        r.len = x.sizes()[dim];
        r.stride = x.strides()[dim];
        for (d, (&s, &st)) in x.sizes().iter().zip(x.strides()).enumerate() {
            if d != dim {
                r.sizes[r.rank] = s;
                r.strides[r.rank] = st;
                r.rank += 1;
            }
        }
        r
    }

    fn count(&self) -> usize {
        self.sizes[..self.rank].iter().product()
    }

    fn base(&self, i: usize) -> usize {
        strided_offset(i, &self.sizes[..self.rank], &self.strides)
    }
}

fn run<A: Num>(
    ctx: &KernelContext<'_>,
    x: &Tensor,
    out: &Tensor,
    dim: usize,
    log: bool,
) -> Result<(), KernelError> {
    let rows = Rows::new(x, dim);
    let data = In::read(ctx, x)?;
    let mut dst = Out::write(ctx, out)?;
    if data.len() != x.numel() || dst.len() != x.numel() {
        return Err(KernelError::invalid("softmax: unexpected storage length"));
    }
    let n_rows = rows.count();
    // The common case: the dim is innermost, so rows are contiguous in both tensors.
    if rows.stride == 1 && rows.len * n_rows == x.numel() && x.is_contiguous() {
        let len = rows.len;
        let direct_in = data.as_slice::<A>();
        let work = |row0: usize, part: &mut Out<'_>| {
            let mut buf = [A::ZERO; BLOCK];
            let n = part.len() / len;
            for r in 0..n {
                let off = (row0 + r) * len;
                if let (Some(src), Some(o)) = (direct_in, part.as_mut_slice::<A>()) {
                    row_in_place(&src[off..off + len], &mut o[r * len..(r + 1) * len], log);
                } else {
                    row_streamed(&data, off, 1, part, r * len, 1, len, log, &mut buf);
                }
            }
        };
        let threads = ctx.pool().threads();
        if threads > 1 && x.numel() >= GRAIN_SIZE && n_rows >= 2 {
            let rows_per = n_rows.div_ceil(threads * 4).max(1);
            dst.par_chunks(ctx.pool(), rows_per * len, &|start, mut part| {
                work(start / len, &mut part)
            });
        } else {
            work(0, &mut dst);
        }
        return Ok(());
    }
    let mut buf = [A::ZERO; BLOCK];
    for r in 0..n_rows {
        let base = rows.base(r);
        row_streamed(
            &data,
            base,
            rows.stride,
            &mut dst,
            base,
            rows.stride,
            rows.len,
            log,
            &mut buf,
        );
    }
    Ok(())
}

/// One contiguous row of the compute type, written straight into the out row.
fn row_in_place<A: Num>(x: &[A], o: &mut [A], log: bool) {
    let mut max = A::from_f64(f64::NEG_INFINITY);
    for &v in x {
        max = max.maximum(v);
    }
    if log {
        let mut sum = A::ZERO;
        for &v in x {
            sum = sum.add(v.sub(max).exp());
        }
        let shift = max.add(sum.ln());
        for (d, &v) in o.iter_mut().zip(x) {
            *d = v.sub(shift);
        }
    } else {
        for (d, &v) in o.iter_mut().zip(x) {
            *d = v.sub(max).exp();
        }
        let sum = super::reduce::pairwise_sum(o);
        for d in o.iter_mut() {
            *d = d.div(sum);
        }
    }
}

/// Loads the `len` elements at `off + j * stride` of `data` into `buf` block by block
/// and calls `f(j, block)` for the block that starts at element `j`.
#[inline(always)]
fn for_each_block<A: Num>(
    data: &In<'_>,
    off: usize,
    stride: usize,
    len: usize,
    buf: &mut [A; BLOCK],
    mut f: impl FnMut(usize, &mut [A]),
) {
    let mut j = 0;
    while j < len {
        let n = BLOCK.min(len - j);
        let b = &mut buf[..n];
        data.load(off + j * stride, stride, b);
        f(j, b);
        j += n;
    }
}

/// One row of any dtype or stride: three passes over the input through a block
/// buffer (max, sum of exponentials, result), no scratch.
#[allow(clippy::too_many_arguments)]
fn row_streamed<A: Num>(
    data: &In<'_>,
    in_off: usize,
    in_stride: usize,
    out: &mut Out<'_>,
    out_off: usize,
    out_stride: usize,
    len: usize,
    log: bool,
    buf: &mut [A; BLOCK],
) {
    let mut max = A::from_f64(f64::NEG_INFINITY);
    for_each_block(data, in_off, in_stride, len, buf, |_, b| {
        for &v in b.iter() {
            max = max.maximum(v);
        }
    });
    let mut sum = super::reduce::Pairwise::new();
    for_each_block(data, in_off, in_stride, len, buf, |_, b| {
        for v in b.iter_mut() {
            *v = v.sub(max).exp();
        }
        sum.push(super::reduce::block_sum(b));
    });
    let sum = sum.total();
    let shift = max.add(sum.ln());
    for_each_block(data, in_off, in_stride, len, buf, |j, b| {
        for v in b.iter_mut() {
            *v = if log {
                v.sub(shift)
            } else {
                v.sub(max).exp().div(sum)
            };
        }
        out.store(out_off + j * out_stride, out_stride, b);
    });
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ops::elementwise::testutil::{Lcg, assert_close, harness, read, tensor, tol};
    use crate::testing::Harness;

    fn reference(shape: &[usize], dim: usize, vals: &[f64], log: bool) -> Vec<f64> {
        let inner: usize = shape[dim + 1..].iter().product();
        let len = shape[dim];
        let outer: usize = shape[..dim].iter().product();
        let mut out = vec![0.0; vals.len()];
        for o in 0..outer {
            for i in 0..inner {
                let idx = |k: usize| (o * len + k) * inner + i;
                let m = (0..len)
                    .map(|k| vals[idx(k)])
                    .fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = (0..len).map(|k| (vals[idx(k)] - m).exp()).sum();
                for k in 0..len {
                    out[idx(k)] = if log {
                        vals[idx(k)] - m - s.ln()
                    } else {
                        (vals[idx(k)] - m).exp() / s
                    };
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn matches_reference(shape in proptest::collection::vec(1usize..6, 1..4), dim_pick in 0usize..4, dt in 0usize..4, log in any::<bool>(), seed in any::<u64>(), threads in 1usize..=2) {
            let dtype = [ScalarType::Float, ScalarType::Double, ScalarType::Half, ScalarType::BFloat16][dt];
            let dim = dim_pick % shape.len();
            let n: usize = shape.iter().product();
            let mut rng = Lcg(seed);
            let vals: Vec<f64> = rng.vec(n, 10.0).into_iter().map(|v| crate::ops::elementwise::testutil::round_through(dtype, v)).collect();
            let mut h = harness(threads);
            let x = tensor(&mut h, dtype, &shape, &vals);
            let d = h.int(dim as i64 - shape.len() as i64);
            let f = h.bool(false);
            let out = h.out(dtype, &shape);
            let name = if log { "aten::_log_softmax.out" } else { "aten::_softmax.out" };
            h.call(name, &[x, d, f, out, out]).unwrap();
            let want: Vec<f64> = reference(&shape, dim, &vals, log);
            let t = tol(dtype).max(1e-6) * if log { 40.0 } else { 4.0 };
            assert_close(&read(&mut h, out), &want, t, t);
        }
    }

    #[test]
    fn large_rows_on_a_pool_and_half_to_float() {
        for threads in [1, 3] {
            let mut h = harness(threads);
            let (rows, len) = (64, 1000);
            let mut rng = Lcg(5);
            let vals = rng.vec(rows * len, 30.0);
            let x = tensor(&mut h, ScalarType::Float, &[rows, len], &vals);
            let d = h.int(1);
            let f = h.bool(false);
            let out = h.out(ScalarType::Float, &[rows, len]);
            h.call("aten::_softmax.out", &[x, d, f, out, out]).unwrap();
            let want = reference(
                &[rows, len],
                1,
                &vals.iter().map(|&v| v as f32 as f64).collect::<Vec<_>>(),
                false,
            );
            assert_close(&read(&mut h, out), &want, 1e-5, 1e-7);
        }
        let mut h = Harness::new();
        let x = tensor(
            &mut h,
            ScalarType::Half,
            &[2, 3],
            &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0],
        );
        let d = h.int(-1);
        let t = h.bool(true);
        let out = h.out(ScalarType::Float, &[2, 3]);
        h.call("aten::_softmax.out", &[x, d, t, out, out]).unwrap();
        let want = reference(&[2, 3], 1, &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0], false);
        assert_close(&read(&mut h, out), &want, 1e-6, 1e-7);
        // Extreme values stay finite.
        let x = tensor(&mut h, ScalarType::Float, &[3], &[1e30, -1e30, 0.0]);
        let out = h.out(ScalarType::Float, &[3]);
        let f = h.bool(false);
        h.call("aten::_softmax.out", &[x, d, f, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1.0, 0.0, 0.0]);
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut h = Harness::new();
        let x = tensor(&mut h, ScalarType::Float, &[2, 3], &[0.0; 6]);
        let d = h.int(2);
        let f = h.bool(false);
        let t = h.bool(true);
        let out = h.out(ScalarType::Float, &[2, 3]);
        assert!(h.call("aten::_softmax.out", &[x, d, f, out, out]).is_err());
        let d = h.int(1);
        assert!(h.call("aten::_softmax.out", &[x, d, t, out, out]).is_err());
        let outh = h.out(ScalarType::Half, &[2, 3]);
        assert!(
            h.call("aten::_softmax.out", &[x, d, f, outh, outh])
                .is_err()
        );
        let i = tensor(&mut h, ScalarType::Int, &[2, 3], &[0.0; 6]);
        let outi = h.out(ScalarType::Int, &[2, 3]);
        assert!(
            h.call("aten::_softmax.out", &[i, d, f, outi, outi])
                .is_err()
        );
        assert!(h.call("aten::_softmax.out", &[x, d, f, out]).is_err());
    }
}
