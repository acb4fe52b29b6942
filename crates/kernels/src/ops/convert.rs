//! Copies and dtype conversions: `_to_copy`, `clone`, `detach_copy`,
//! `lift_fresh_copy`, `copy` (a broadcasting, casting copy into `self`'s shape), and
//! the dim-order variants `_to_dim_order_copy` and `_clone_dim_order`.
//!
//! Each element is cast straight from the input dtype to the out dtype with PyTorch's
//! conversions (float to int truncates toward zero, to bool tests `!= 0`, f32 to
//! f16/bf16 rounds to nearest even). Out may have a different dim order than the
//! input: elements are matched by logical index.

use super::elementwise::dtype::{is_supported, unsupported, with_elem};
use super::elementwise::{Operand, Spec, Src, map, zip1};
use super::same_dtype;
use super::shape::common::{
    MAX_DIMS, Strided, broadcast_strides, copy_tensor_cast, require_contiguous,
};
use crate::schema::{MemoryFormat, OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::_to_copy.out", to_copy);
    r.register("aten::clone.out", clone);
    r.register("aten::detach_copy.out", same_copy);
    r.register("aten::lift_fresh_copy.out", same_copy);
    r.register("et_copy::_h2d_copy.out", device_copy);
    r.register("et_copy::_d2h_copy.out", device_copy);
    r.register("aten::copy.out", copy_out);
    r.register("dim_order_ops::_to_dim_order_copy.out", |c, a| {
        dim_order_copy(c, a, false)
    });
    r.register("dim_order_ops::_clone_dim_order.out", |c, a| {
        dim_order_copy(c, a, true)
    });
}

/// Copies `x` into `out` (resized to `x`'s shape), casting to `out`'s dtype.
pub fn copy_cast(ctx: &KernelContext<'_>, x: &Tensor, out: &Tensor) -> Result<(), KernelError> {
    for t in [x.dtype(), out.dtype()] {
        if !is_supported(t) {
            return Err(unsupported(t, "copy"));
        }
    }
    if x.sizes() != out.sizes() {
        return Err(KernelError::invalid(format!(
            "copy of shape {:?} into {:?}",
            x.sizes(),
            out.sizes()
        )));
    }
    if x.numel() == 0 {
        return Ok(());
    }
    if x.dtype() == out.dtype() && x.dim_order() == out.dim_order() {
        let src = ctx.read_bytes(x)?;
        let dst = ctx.write_bytes(out)?;
        if src.len() != dst.len() {
            return Err(KernelError::invalid("copy: byte lengths differ"));
        }
        dst.copy_from_slice(src);
        return Ok(());
    }
    let spec = Spec {
        common: x.dtype(),
        narrow_result: false,
    };
    with_elem!(x.dtype(), E => map::<1, E, E, _>(ctx, &[Operand::Tensor(*x)], out, spec, |s: &[Src<'_, E>; 1], o: &mut [E]| zip1(s[0], o, |v| v)),
        Err(unsupported(x.dtype(), "copy")))
}

op_args! {
    /// `_to_copy.out(Tensor self, *, bool non_blocking=False, MemoryFormat? memory_format=None,
    /// Tensor(a!) out)`: a cast to out's dtype.
    struct ToCopyArgs = "aten::_to_copy.out" {
        input: Tensor,
        non_blocking: bool,
        memory_format: MemoryFormat,
        out: OutArg,
    } returns 1
}

fn to_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ToCopyArgs { input, out, .. } = ToCopyArgs::unpack(a)?;
    let out = out.resize(a, input.sizes())?;
    copy_cast(ctx, &input, &out)
}

op_args! {
    /// `clone.out(Tensor self, *, MemoryFormat? memory_format=None, Tensor(a!) out)`.
    struct CloneArgs = "aten::clone.out" {
        input: Tensor,
        memory_format: MemoryFormat,
        out: OutArg,
    } returns 1
}

fn clone(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let CloneArgs { input, out, .. } = CloneArgs::unpack(a)?;
    copy_same_dtype(ctx, a, &input, out)
}

/// Resizes `out` to `input`'s shape and copies `input` into it (the dtypes must match).
fn copy_same_dtype(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    out: OutArg,
) -> Result<(), KernelError> {
    let out = out.resize(a, input.sizes())?;
    same_dtype(input, &out)?;
    copy_cast(ctx, input, &out)
}

op_args! {
    /// `detach_copy.out(Tensor self, *, Tensor(a!) out)` and `lift_fresh_copy.out`.
    struct SameCopyArgs = "aten::<detach_copy|lift_fresh_copy>.out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

/// `detach_copy` and `lift_fresh_copy`: a copy of the same dtype.
fn same_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let SameCopyArgs { input, out } = SameCopyArgs::unpack(a)?;
    copy_same_dtype(ctx, a, &input, out)
}

op_args! {
    /// `et_copy::_h2d_copy.out(Tensor self, *, Tensor(a!) out)` and `_d2h_copy.out`:
    /// copies between host and device memory.
    struct DeviceCopyArgs = "et_copy::<_h2d_copy|_d2h_copy>.out" {
        input: Tensor,
        out: OutArg,
    } returns 1
}

/// etch runs on the host only, so a device copy is a plain copy of the same dtype.
/// (Upstream's CPU build refuses these ops unless `out` or `self` sits on a device
/// with a registered allocator.)
fn device_copy(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let DeviceCopyArgs { input, out } = DeviceCopyArgs::unpack(a)?;
    copy_same_dtype(ctx, a, &input, out)
}

op_args! {
    /// `copy.out(Tensor self, Tensor src, bool non_blocking=False, *, Tensor(a!) out)`:
    /// `src` broadcast to `self`'s shape and cast to `self`'s dtype.
    struct CopyArgs = "aten::copy.out" {
        input: Tensor,
        src: Tensor,
        non_blocking: bool,
        out: OutArg,
    } returns 1
}

fn copy_out(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let CopyArgs {
        input, src, out, ..
    } = CopyArgs::unpack(a)?;
    let out = out.resize(a, input.sizes())?;
    same_dtype(&input, &out)?;
    broadcast_copy(ctx, &src, &out, "copy")
}

/// Copies `src` broadcast to `out`'s shape, cast to `out`'s dtype (both contiguous).
pub(crate) fn broadcast_copy(
    ctx: &KernelContext<'_>,
    src: &Tensor,
    out: &Tensor,
    what: &'static str,
) -> Result<(), KernelError> {
    require_contiguous(src, what)?;
    require_contiguous(out, what)?;
    let mut buf = [0usize; MAX_DIMS];
    let strides = broadcast_strides(src.sizes(), src.strides(), out.sizes(), &mut buf)?;
    let layout = Strided::new(out.sizes(), strides)?;
    copy_tensor_cast(ctx, src, out, 0, &layout, what)
}

op_args! {
    /// `_to_dim_order_copy.out(Tensor self, *, bool non_blocking=False,
    /// int[]? dim_order=None, Tensor(a!) out)`; `_clone_dim_order.out` has the same
    /// arguments.
    struct DimOrderCopyArgs<'a> = "dim_order_ops::_to_dim_order_copy.out" {
        input: Tensor,
        non_blocking: bool,
        dim_order: Option<IntList<'a>>,
        out: OutArg,
    } returns 1
}

/// `_to_dim_order_copy.out` and `_clone_dim_order.out` (same dtype): the out tensor's
/// dim order must be the requested one (contiguous when absent).
fn dim_order_copy(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    same_dtype: bool,
) -> Result<(), KernelError> {
    let DimOrderCopyArgs {
        input: x,
        dim_order,
        out,
        ..
    } = DimOrderCopyArgs::unpack(a)?;
    let mut buf = [0i64; MAX_RANK];
    let order = dim_order.map(|l| l.read_into(&mut buf)).transpose()?;
    let out = out.resize(a, x.sizes())?;
    match order {
        Some(order) => {
            let matches = order.len() == out.rank()
                && order
                    .iter()
                    .zip(out.dim_order())
                    .all(|(&d, &o)| d == o as i64);
            if !matches {
                return Err(KernelError::invalid(format!(
                    "dim_order {order:?} does not match the out tensor's {:?}",
                    out.dim_order()
                )));
            }
        }
        None => {
            if !out.is_contiguous() {
                return Err(KernelError::invalid(
                    "dim_order None asks for a contiguous out tensor",
                ));
            }
        }
    }
    if same_dtype && out.dtype() != x.dtype() {
        return Err(KernelError::DtypeMismatch {
            expected: x.dtype(),
            found: out.dtype(),
        });
    }
    copy_cast(ctx, &x, &out)
}

#[cfg(test)]
mod tests {
    use etch_base::{ScalarType, ShapeDynamism};
    use proptest::prelude::*;

    use crate::ops::elementwise::testutil::{DTYPES, Lcg, read, round_through, tensor};
    use crate::testing::Harness;
    use crate::{EValue, Tensor};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Every dtype pair: each element cast once, as PyTorch does.
        #[test]
        fn casts(from in 0usize..10, to in 0usize..10, shape in proptest::collection::vec(0usize..4, 0..4), seed in any::<u64>()) {
            let (from, to) = (DTYPES[from], DTYPES[to]);
            let n: usize = shape.iter().product();
            let mut rng = Lcg(seed);
            let vals: Vec<f64> = rng.vec(n, 300.0).into_iter().map(|v| round_through(from, v)).collect();
            let mut h = Harness::new();
            let x = tensor(&mut h, from, &shape, &vals);
            let f = h.bool(false);
            let none = h.none();
            let out = h.out(to, &shape);
            h.call("aten::_to_copy.out", &[x, f, none, out, out]).unwrap();
            let want: Vec<f64> = vals.iter().map(|&v| {
                if to == ScalarType::Bool {
                    (v != 0.0) as u8 as f64
                } else if from.is_floating_point() && !to.is_floating_point() {
                    round_through(to, v.trunc())
                } else if to == ScalarType::Half || to == ScalarType::BFloat16 {
                    round_through(to, v as f32 as f64)
                } else {
                    round_through(to, v)
                }
            }).collect();
            prop_assert_eq!(read(&mut h, out), want);
        }
    }

    #[test]
    fn specific_casts() {
        let mut h = Harness::new();
        let f = h.bool(false);
        let none = h.none();
        let x = tensor(&mut h, ScalarType::Double, &[3], &[0.1, -2.7, 1e10]);
        let out = h.out(ScalarType::Float, &[3]);
        h.call("aten::_to_copy.out", &[x, f, none, out, out])
            .unwrap();
        assert_eq!(h.read::<f32>(out), vec![0.1f32, -2.7f32, 1e10f32]);
        let l = h.tensor(&[3], &[300i64, -129, 5]);
        let out8 = h.out(ScalarType::Char, &[3]);
        h.call("aten::_to_copy.out", &[l, f, none, out8, out8])
            .unwrap();
        assert_eq!(h.read::<i8>(out8), vec![44, 127, 5]);
        let fl = h.tensor(&[3], &[-2.7f32, 2.7, 0.0]);
        let outi = h.out(ScalarType::Int, &[3]);
        h.call("aten::_to_copy.out", &[fl, f, none, outi, outi])
            .unwrap();
        assert_eq!(h.read::<i32>(outi), vec![-2, 2, 0]);
        let outh = h.out(ScalarType::Half, &[3]);
        let r = h.tensor(&[3], &[1.0f32 + 1.0 / 2048.0, 65520.0, 1e-8]);
        h.call("aten::_to_copy.out", &[r, f, none, outh, outh])
            .unwrap();
        let got = h.read::<half::f16>(outh);
        assert_eq!(got[0], half::f16::from_f32(1.0));
        assert!(got[1].is_infinite());
        let outbf = h.out(ScalarType::BFloat16, &[3]);
        h.call("aten::_to_copy.out", &[r, f, none, outbf, outbf])
            .unwrap();
        assert_eq!(h.read::<half::bf16>(outbf)[0], half::bf16::from_f32(1.0));
    }

    #[test]
    fn dim_orders_and_clones() {
        let mut h = Harness::new();
        let vals: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let x = h.tensor(&[2, 3, 4], &vals);
        // A channels-last-style out: dim order [0, 2, 1].
        let region = h
            .storage
            .add_buffer(etch_memory::AlignedBuffer::zeroed(96, 64).unwrap());
        let span = etch_memory::Span {
            region,
            offset: 0,
            len: 96,
        };
        let t = Tensor::with_layout(
            ScalarType::Float,
            &[2, 3, 4],
            &[0, 2, 1],
            ShapeDynamism::Static,
            Some(span),
        )
        .unwrap();
        let out = h.push(EValue::Tensor(t));
        let f = h.bool(false);
        let order = h.int_list(&[0, 2, 1]);
        h.call(
            "dim_order_ops::_to_dim_order_copy.out",
            &[x, f, order, out, out],
        )
        .unwrap();
        let raw = h.read::<f32>(out);
        // Memory order of out is [n][w][c]: element (n, c, w) at n*12 + w*3 + c.
        for n in 0..2 {
            for c in 0..3 {
                for w in 0..4 {
                    assert_eq!(raw[n * 12 + w * 3 + c], vals[n * 12 + c * 4 + w]);
                }
            }
        }
        // And back to contiguous.
        let back = h.out(ScalarType::Float, &[2, 3, 4]);
        let none = h.none();
        h.call(
            "dim_order_ops::_clone_dim_order.out",
            &[out, f, none, back, back],
        )
        .unwrap();
        assert_eq!(h.read::<f32>(back), vals);
        // Mismatched dim order, or a dtype change in a clone.
        let wrong = h.int_list(&[0, 1, 2]);
        assert!(
            h.call(
                "dim_order_ops::_to_dim_order_copy.out",
                &[x, f, wrong, out, out]
            )
            .is_err()
        );
        let outd = h.out(ScalarType::Double, &[2, 3, 4]);
        assert!(
            h.call(
                "dim_order_ops::_clone_dim_order.out",
                &[x, f, none, outd, outd]
            )
            .is_err()
        );
        h.call(
            "dim_order_ops::_to_dim_order_copy.out",
            &[x, f, none, outd, outd],
        )
        .unwrap();
        assert_eq!(
            h.read::<f64>(outd),
            vals.iter().map(|&v| v as f64).collect::<Vec<_>>()
        );
        h.call("aten::clone.out", &[x, none, back, back]).unwrap();
        assert_eq!(h.read::<f32>(back), vals);
        assert!(h.call("aten::clone.out", &[x, none, outd, outd]).is_err());
        let small = h.out(ScalarType::Float, &[2, 3]);
        assert!(h.call("aten::clone.out", &[x, none, small, small]).is_err());
        let q = h.tensor_raw(ScalarType::QInt8, &[2], &[0, 0]);
        let outq = h.out(ScalarType::Float, &[2]);
        assert!(
            h.call("aten::_to_copy.out", &[q, f, none, outq, outq])
                .is_err()
        );
        assert!(h.call("aten::_to_copy.out", &[x, f, none, back]).is_err());
    }

    #[test]
    fn detach_lift_and_copy() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let out = h.out(ScalarType::Float, &[3, 2]);
        for op in ["aten::detach_copy.out", "aten::lift_fresh_copy.out"] {
            h.call(op, &[x, out, out]).unwrap();
            assert_eq!(h.tensor_meta(out).sizes(), &[2, 3]);
            assert_eq!(h.read::<f32>(out), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        }
        let outi = h.out(ScalarType::Int, &[2, 3]);
        assert!(h.call("aten::detach_copy.out", &[x, outi, outi]).is_err());
        // copy: src [3] (int) broadcast over self [2, 3] (float), cast.
        let src = h.tensor(&[3], &[7i64, -8, 9]);
        let f = h.bool(false);
        h.call("aten::copy.out", &[x, src, f, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![7.0, -8.0, 9.0, 7.0, -8.0, 9.0]);
        // A src that does not broadcast to self's shape is refused.
        let bad = h.tensor(&[2], &[1.0f32, 2.0]);
        assert!(h.call("aten::copy.out", &[x, bad, f, out, out]).is_err());
        // The out dtype must be self's.
        assert!(h.call("aten::copy.out", &[x, src, f, outi, outi]).is_err());
    }

    #[test]
    fn device_copies_are_host_copies() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 2], &[1i32, -2, 3, -4]);
        for op in ["et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"] {
            let out = h.out(ScalarType::Int, &[4, 2]);
            h.call(op, &[x, out, out]).unwrap();
            assert_eq!(h.read::<i32>(out), vec![1, -2, 3, -4]);
            let f = h.out(ScalarType::Float, &[2, 2]);
            assert!(h.call(op, &[x, f, f]).is_err());
        }
    }
}
