//! `constant_pad_nd`: pads the trailing dims of a tensor (any dtype) with a constant,
//! `pad = [last_before, last_after, second_last_before, ...]`, every amount
//! non-negative (as ExecuTorch's portable kernel requires).

use super::elementwise::dtype::{is_supported, unsupported, with_elem};
use super::layout::{NchwOut, read_nchw, require_nchw_or_channels_last};
use crate::ops::same_dtype;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor};
use etch_base::Element;

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::constant_pad_nd.out", constant_pad_nd);
}

op_args! {
    /// `constant_pad_nd.out(Tensor self, SymInt[] pad, Scalar value=0, *,
    /// Tensor(a!) out)`.
    struct ConstantPadArgs<'a> = "aten::constant_pad_nd.out" {
        input: Tensor,
        pad: IntList<'a>,
        value: Scalar,
        out: OutArg,
    } returns 1
}

fn constant_pad_nd(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ConstantPadArgs {
        input: x,
        pad,
        value,
        out,
    } = ConstantPadArgs::unpack(a)?;
    let mut pbuf = [0i64; 2 * MAX_RANK];
    let pad = pad.read_into(&mut pbuf)?;
    let rank = x.rank();
    if pad.len() % 2 != 0 || pad.len() / 2 > rank {
        return Err(KernelError::invalid(format!(
            "constant_pad_nd: {} pad values for a rank-{rank} tensor",
            pad.len()
        )));
    }
    if let Some(p) = pad.iter().find(|&&p| p < 0) {
        return Err(KernelError::invalid(format!(
            "constant_pad_nd: pad values must be non-negative, got {p}"
        )));
    }
    if !is_supported(x.dtype()) {
        return Err(unsupported(x.dtype(), "constant_pad_nd"));
    }
    // before[d], after[d] per dim.
    let mut before = [0usize; MAX_RANK];
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(x.sizes());
    for (i, pair) in pad.chunks_exact(2).enumerate() {
        let d = rank - 1 - i;
        before[d] = pair[0] as usize;
        sizes[d] = sizes[d]
            .checked_add(pair[0] as usize)
            .and_then(|s| s.checked_add(pair[1] as usize))
            .ok_or_else(|| KernelError::invalid("constant_pad_nd: padded size overflows"))?;
    }
    let out = out.resize(a, &sizes[..rank])?;
    same_dtype(&x, &out)?;
    require_nchw_or_channels_last(&x, "constant_pad_nd input")?;
    require_nchw_or_channels_last(&out, "constant_pad_nd out")?;
    with_elem!(
        x.dtype(),
        E => copy_padded::<E>(ctx, &x, &out, value.cast::<E>(), &before[..rank]),
        Err(unsupported(x.dtype(), "constant_pad_nd"))
    )
}

/// Fills `out` with `value` and copies `x` into it, shifted by `before` per dim (in
/// row-major logical order; channels-last tensors pass through NCHW scratch).
fn copy_padded<E: Element>(
    ctx: &KernelContext<'_>,
    x: &Tensor,
    out: &Tensor,
    value: E,
    before: &[usize],
) -> Result<(), KernelError> {
    let src = read_nchw::<E>(ctx, x, "constant_pad_nd input")?;
    let mut staged = NchwOut::<E>::new(ctx, out, "constant_pad_nd out")?;
    let dst = staged.data();
    dst.fill(value);
    let rank = x.rank();
    if x.numel() == 0 {
        return staged.finish("constant_pad_nd out");
    }
    if rank == 0 {
        dst[0] = src[0];
        return staged.finish("constant_pad_nd out");
    }
    let row = x.sizes()[rank - 1];
    // Row-major strides of out's logical sizes.
    let mut out_strides = [1usize; MAX_RANK];
    for d in (0..rank - 1).rev() {
        out_strides[d] = out_strides[d + 1] * out.sizes()[d + 1];
    }
    for (r, chunk) in src.chunks_exact(row).enumerate() {
        // Coordinates of input row r over dims 0..rank-1, shifted by the padding.
        let mut rem = r;
        let mut at = before[rank - 1];
        for d in (0..rank - 1).rev() {
            let c = rem % x.sizes()[d];
            rem /= x.sizes()[d];
            at += (c + before[d]) * out_strides[d];
        }
        dst[at..at + row].copy_from_slice(chunk);
    }
    staged.finish("constant_pad_nd out")
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ops::elementwise::testutil::{Lcg, assert_close, read, tensor};
    use crate::testing::Harness;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn matches_reference(shape in proptest::collection::vec(1usize..4, 1..4), pads in proptest::collection::vec(0usize..3, 0..7), int in any::<bool>(), seed in any::<u64>()) {
            let rank = shape.len();
            let pads: Vec<usize> = pads.into_iter().take(2 * rank).collect();
            let pads = &pads[..pads.len() / 2 * 2];
            let dtype = if int { ScalarType::Int } else { ScalarType::Float };
            let n: usize = shape.iter().product();
            let mut rng = Lcg(seed);
            let x: Vec<f64> = rng.vec(n, 8.0).into_iter().map(|v| v.round()).collect();
            let mut out_shape = shape.clone();
            for (i, p) in pads.chunks(2).enumerate() {
                out_shape[rank - 1 - i] += p[0] + p[1];
            }
            let mut h = Harness::new();
            let xt = tensor(&mut h, dtype, &shape, &x);
            let pl: Vec<i64> = pads.iter().map(|&p| p as i64).collect();
            let pad = h.int_list(&pl);
            let v = h.double(-3.0);
            let out = h.out(dtype, &out_shape);
            h.call("aten::constant_pad_nd.out", &[xt, pad, v, out, out]).unwrap();
            let total: usize = out_shape.iter().product();
            let mut want = vec![-3.0; total];
            for (i, &xv) in x.iter().enumerate() {
                let mut rem = i;
                let mut at = 0;
                let mut stride = 1;
                for d in (0..rank).rev() {
                    let c = rem % shape[d];
                    rem /= shape[d];
                    let k = rank - 1 - d;
                    let b = if 2 * k < pads.len() { pads[2 * k] } else { 0 };
                    at += (c + b) * stride;
                    stride *= out_shape[d];
                }
                want[at] = xv;
            }
            assert_close(&read(&mut h, out), &want, 0.0, 0.0);
        }
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 2], &[0.0f32; 4]);
        let odd = h.int_list(&[1]);
        let neg = h.int_list(&[-1, 1]);
        let many = h.int_list(&[1, 1, 1, 1, 1, 1]);
        let v = h.double(0.0);
        let out = h.out(ScalarType::Float, &[4, 4]);
        let out_i = h.out(ScalarType::Int, &[4, 4]);
        let ok = h.int_list(&[1, 1, 1, 1]);
        let op = "aten::constant_pad_nd.out";
        h.call(op, &[x, ok, v, out, out]).unwrap();
        assert!(h.call(op, &[x, odd, v, out, out]).is_err());
        assert!(h.call(op, &[x, neg, v, out, out]).is_err());
        assert!(h.call(op, &[x, many, v, out, out]).is_err());
        assert!(h.call(op, &[x, ok, v, out_i, out_i]).is_err());
    }
}
