//! Tensor creation: `arange`, `full`, `full_like`, `fill`, `zeros`, `ones`, `empty`,
//! `_empty_dim_order`, `scalar_tensor`. Fill values are cast to the out dtype with PyTorch's conversions.

use super::elementwise::dtype::{Out, is_supported, unsupported};
use crate::schema::{MemoryFormat, OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::arange.start_out", arange_start);
    r.register("aten::arange.out", arange_end);
    r.register("aten::full.out", full);
    r.register("aten::full_like.out", full_like);
    r.register("aten::zeros.out", |c, a| fill_sized(c, a, Scalar::Int(0)));
    r.register("aten::ones.out", |c, a| fill_sized(c, a, Scalar::Int(1)));
    r.register("aten::scalar_tensor.out", scalar_tensor);
    r.register("aten::fill.Scalar_out", fill_scalar);
    r.register("aten::fill.Tensor_out", fill_tensor);
    r.register("aten::empty.out", empty);
    r.register("dim_order_ops::_empty_dim_order.out", empty_dim_order);
}

/// Resizes `out` to `sizes` and fills it with `v` (cast to its dtype).
fn fill(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    out: OutArg,
    sizes: &[usize],
    v: Scalar,
) -> Result<(), KernelError> {
    let out = out.resize(a, sizes)?;
    if !is_supported(out.dtype()) {
        return Err(unsupported(out.dtype(), "fill"));
    }
    if out.numel() == 0 {
        return Ok(());
    }
    Out::write(ctx, &out)?.fill_scalar(v);
    Ok(())
}

/// Sizes from an int-list argument.
fn sizes_of<'b>(
    list: IntList<'_>,
    buf: &'b mut [usize; MAX_RANK],
) -> Result<&'b [usize], KernelError> {
    let mut ints = [0i64; MAX_RANK];
    let list = list.read_into(&mut ints)?;
    for (b, &v) in buf.iter_mut().zip(list) {
        *b = usize::try_from(v)
            .map_err(|_| KernelError::invalid(format!("negative size {v} in {list:?}")))?;
    }
    Ok(&buf[..list.len()])
}

op_args! {
    /// `full.out(SymInt[] size, Scalar fill_value, *, Tensor(a!) out)`.
    struct FullArgs<'a> = "aten::full.out" {
        size: IntList<'a>,
        fill_value: Scalar,
        out: OutArg,
    } returns 1
}

fn full(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let FullArgs {
        size,
        fill_value,
        out,
    } = FullArgs::unpack(a)?;
    let mut buf = [0usize; MAX_RANK];
    let sizes = sizes_of(size, &mut buf)?;
    fill(ctx, a, out, sizes, fill_value)
}

op_args! {
    /// `zeros.out(SymInt[] size, *, Tensor(a!) out)` and `ones.out`.
    struct SizedArgs<'a> = "aten::<zeros|ones>.out" {
        size: IntList<'a>,
        out: OutArg,
    } returns 1
}

fn fill_sized(ctx: &KernelContext<'_>, a: &mut Args<'_>, v: Scalar) -> Result<(), KernelError> {
    let SizedArgs { size, out } = SizedArgs::unpack(a)?;
    let mut buf = [0usize; MAX_RANK];
    let sizes = sizes_of(size, &mut buf)?;
    fill(ctx, a, out, sizes, v)
}

op_args! {
    /// `full_like.out(Tensor self, Scalar fill_value, *, MemoryFormat? memory_format=None,
    /// Tensor(a!) out)`.
    struct FullLikeArgs = "aten::full_like.out" {
        input: Tensor,
        fill_value: Scalar,
        memory_format: MemoryFormat,
        out: OutArg,
    } returns 1
}

fn full_like(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let FullLikeArgs {
        input,
        fill_value,
        out,
        ..
    } = FullLikeArgs::unpack(a)?;
    fill(ctx, a, out, input.sizes(), fill_value)
}

op_args! {
    /// `fill.Scalar_out(Tensor self, Scalar value, *, Tensor(a!) out)`.
    struct FillScalarArgs = "aten::fill.Scalar_out" {
        input: Tensor,
        value: Scalar,
        out: OutArg,
    } returns 1
}

fn fill_scalar(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let FillScalarArgs { input, value, out } = FillScalarArgs::unpack(a)?;
    fill(ctx, a, out, input.sizes(), value)
}

op_args! {
    /// `fill.Tensor_out(Tensor self, Tensor value, *, Tensor(a!) out)`: `value` is 0-d.
    struct FillTensorArgs = "aten::fill.Tensor_out" {
        input: Tensor,
        value: Tensor,
        out: OutArg,
    } returns 1
}

fn fill_tensor(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let FillTensorArgs { input, value, out } = FillTensorArgs::unpack(a)?;
    if value.rank() != 0 {
        return Err(KernelError::invalid(format!(
            "fill.Tensor: value must be a 0-dim tensor, got shape {:?}",
            value.sizes()
        )));
    }
    let out = out.resize(a, input.sizes())?;
    super::convert::broadcast_copy(ctx, &value, &out, "fill")
}

op_args! {
    /// `empty.out(SymInt[] size, *, MemoryFormat? memory_format=None, Tensor(a!) out)`:
    /// resizes `out` and leaves its contents as they are, as upstream does.
    struct EmptyArgs<'a> = "aten::empty.out" {
        size: IntList<'a>,
        memory_format: MemoryFormat,
        out: OutArg,
    } returns 1
}

fn empty(_: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let EmptyArgs { size, out, .. } = EmptyArgs::unpack(a)?;
    let mut buf = [0usize; MAX_RANK];
    let sizes = sizes_of(size, &mut buf)?;
    out.resize(a, sizes)?;
    Ok(())
}

op_args! {
    /// `_empty_dim_order.out(int[] size, *, int[]? dim_order=None, Tensor(a!) out)`:
    /// `empty` whose out must already have `dim_order` (the contiguous one when None).
    struct EmptyDimOrderArgs<'a> = "dim_order_ops::_empty_dim_order.out" {
        size: IntList<'a>,
        dim_order: Option<IntList<'a>>,
        out: OutArg,
    } returns 1
}

/// Resizes `out` and leaves its contents. The dim order, when given, must be the
/// contiguous or the channels-last one and be `out`'s; without one `out` must be
/// contiguous. (Upstream computes this check but ignores its result.)
fn empty_dim_order(_: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let EmptyDimOrderArgs {
        size,
        dim_order,
        out,
    } = EmptyDimOrderArgs::unpack(a)?;
    let out_t = out.tensor();
    let have = out_t.dim_order();
    let fits = match dim_order {
        None => out.tensor().is_contiguous(),
        Some(list) => {
            let mut buf = [0i64; MAX_RANK];
            let want = list.read_into(&mut buf)?;
            let n = want.len();
            let contiguous = want.iter().enumerate().all(|(i, &d)| d == i as i64);
            // [0, 2, 3, ..., 1]: channels last.
            let channels_last = n >= 3
                && want[0] == 0
                && want[n - 1] == 1
                && want[1..n - 1]
                    .iter()
                    .enumerate()
                    .all(|(i, &d)| d == i as i64 + 2);
            (contiguous || channels_last)
                && want.len() == have.len()
                && want.iter().zip(have).all(|(&w, &h)| w == h as i64)
        }
    };
    if !fits {
        return Err(KernelError::invalid(format!(
            "_empty_dim_order: out has dim order {have:?}, which is not the one requested"
        )));
    }
    let mut buf = [0usize; MAX_RANK];
    let sizes = sizes_of(size, &mut buf)?;
    out.resize(a, sizes)?;
    Ok(())
}

op_args! {
    /// `scalar_tensor.out(Scalar s, *, Tensor(a!) out)`: a 0-d tensor.
    struct ScalarTensorArgs = "aten::scalar_tensor.out" {
        s: Scalar,
        out: OutArg,
    } returns 1
}

fn scalar_tensor(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ScalarTensorArgs { s, out } = ScalarTensorArgs::unpack(a)?;
    fill(ctx, a, out, &[], s)
}

op_args! {
    /// `arange.out(Scalar end, *, Tensor(a!) out)`.
    struct ArangeArgs = "aten::arange.out" {
        end: Scalar,
        out: OutArg,
    } returns 1
}

fn arange_end(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ArangeArgs { end, out } = ArangeArgs::unpack(a)?;
    arange(ctx, a, Scalar::Int(0), end, Scalar::Int(1), out)
}

op_args! {
    /// `arange.start_out(Scalar start, Scalar end, Scalar step=1, *, Tensor(a!) out)`.
    struct ArangeStartArgs = "aten::arange.start_out" {
        start: Scalar,
        end: Scalar,
        step: Scalar,
        out: OutArg,
    } returns 1
}

fn arange_start(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ArangeStartArgs {
        start,
        end,
        step,
        out,
    } = ArangeStartArgs::unpack(a)?;
    arange(ctx, a, start, end, step, out)
}

fn arange(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    start: Scalar,
    end: Scalar,
    step: Scalar,
    out: OutArg,
) -> Result<(), KernelError> {
    let (s, e, st) = (start.to_f64(), end.to_f64(), step.to_f64());
    if st == 0.0 || st.is_nan() {
        return Err(KernelError::invalid("arange: step must be nonzero"));
    }
    if !s.is_finite() || !e.is_finite() {
        return Err(KernelError::invalid(format!(
            "arange: unsupported range {s} -> {e}"
        )));
    }
    if (st > 0.0 && e < s) || (st < 0.0 && e > s) {
        return Err(KernelError::invalid(
            "arange: upper bound and larger bound inconsistent with step sign",
        ));
    }
    let size_f = ((e - s) / st).ceil();
    if !(0.0..=(isize::MAX as f64)).contains(&size_f) {
        return Err(KernelError::invalid(format!(
            "arange: invalid length {size_f}"
        )));
    }
    let n = size_f as usize;
    let out = out.resize(a, &[n])?;
    if out.rank() != 1 {
        return Err(KernelError::invalid("arange: out must be 1-D"));
    }
    let all_int = [start, end, step]
        .iter()
        .all(|v| !matches!(v, Scalar::Double(_)));
    let dtype = out.dtype();
    if !is_supported(dtype) {
        return Err(unsupported(dtype, "arange"));
    }
    if n == 0 {
        return Ok(());
    }
    let mut dst = Out::write(ctx, &out)?;
    if dtype.is_floating_point() || !all_int {
        // Accumulate in f64, as ATen's accscalar for float outputs.
        for i in 0..n {
            dst.set(i, s + i as f64 * st);
        }
    } else {
        let (si, sti) = (start.to_i64(), step.to_i64());
        for i in 0..n {
            dst.set(i, si.wrapping_add((i as i64).wrapping_mul(sti)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;

    use crate::ops::elementwise::testutil::read;
    use crate::testing::Harness;

    #[test]
    fn arange_variants() {
        let mut h = Harness::new();
        let (s, e, st) = (h.int(2), h.int(11), h.int(3));
        let out = h.out(ScalarType::Long, &[8]);
        h.call("aten::arange.start_out", &[s, e, st, out, out])
            .unwrap();
        assert_eq!(h.read::<i64>(out), vec![2, 5, 8]);
        let e5 = h.int(5);
        h.call("aten::arange.out", &[e5, out, out]).unwrap();
        assert_eq!(h.read::<i64>(out), vec![0, 1, 2, 3, 4]);
        let (fs, fe, fst) = (h.double(0.0), h.double(1.0), h.double(0.25));
        let outf = h.out(ScalarType::Float, &[8]);
        h.call("aten::arange.start_out", &[fs, fe, fst, outf, outf])
            .unwrap();
        assert_eq!(h.read::<f32>(outf), vec![0.0, 0.25, 0.5, 0.75]);
        let neg = h.int(-2);
        h.call("aten::arange.start_out", &[e5, s, neg, out, out])
            .unwrap();
        assert_eq!(h.read::<i64>(out), vec![5, 3]);
        // Float bounds into an int out truncate each value.
        let fe2 = h.double(2.5);
        let half = h.double(0.5);
        let out2 = h.out(ScalarType::Int, &[8]);
        h.call("aten::arange.start_out", &[fs, fe2, half, out2, out2])
            .unwrap();
        assert_eq!(h.read::<i32>(out2), vec![0, 0, 1, 1, 2]);
        // Errors: zero step, wrong sign, too long for the bound.
        let zero = h.int(0);
        assert!(
            h.call("aten::arange.start_out", &[s, e, zero, out, out])
                .is_err()
        );
        assert!(
            h.call("aten::arange.start_out", &[e, s, st, out, out])
                .is_err()
        );
        let big = h.int(100);
        assert!(h.call("aten::arange.out", &[big, out, out]).is_err());
        let empty = h.out(ScalarType::Long, &[1]);
        h.call("aten::arange.start_out", &[s, s, st, empty, empty])
            .unwrap();
        assert_eq!(h.tensor_meta(empty).sizes(), &[0]);
    }

    #[test]
    fn fills() {
        let mut h = Harness::new();
        let size = h.int_list(&[2, 3]);
        let v = h.double(2.5);
        let out = h.out(ScalarType::Float, &[6, 1]);
        h.call("aten::full.out", &[size, v, out, out]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[2, 3]);
        assert_eq!(h.read::<f32>(out), vec![2.5; 6]);
        let outi = h.out(ScalarType::Int, &[2, 3]);
        h.call("aten::full.out", &[size, v, outi, outi]).unwrap();
        assert_eq!(h.read::<i32>(outi), vec![2; 6]);
        h.call("aten::zeros.out", &[size, outi, outi]).unwrap();
        assert_eq!(h.read::<i32>(outi), vec![0; 6]);
        h.call("aten::ones.out", &[size, outi, outi]).unwrap();
        assert_eq!(h.read::<i32>(outi), vec![1; 6]);
        let x = h.tensor(&[3], &[1i64, 2, 3]);
        let b = h.bool(true);
        let none = h.none();
        let outb = h.out(ScalarType::Bool, &[3]);
        h.call("aten::full_like.out", &[x, b, none, outb, outb])
            .unwrap();
        assert_eq!(read(&mut h, outb), vec![1.0; 3]);
        let ninf = h.double(f64::NEG_INFINITY);
        let out0 = h.out(ScalarType::Float, &[]);
        h.call("aten::scalar_tensor.out", &[ninf, out0, out0])
            .unwrap();
        assert_eq!(h.read::<f32>(out0), vec![f32::NEG_INFINITY]);
        let outh = h.out(ScalarType::Half, &[]);
        h.call("aten::scalar_tensor.out", &[v, outh, outh]).unwrap();
        assert_eq!(read(&mut h, outh), vec![2.5]);
        // Bad calls.
        let negsize = h.int_list(&[-1, 3]);
        assert!(h.call("aten::full.out", &[negsize, v, out, out]).is_err());
        let big = h.int_list(&[4, 3]);
        assert!(h.call("aten::full.out", &[big, v, out, out]).is_err());
        assert!(h.call("aten::full.out", &[size, size, out, out]).is_err());
        assert!(h.call("aten::scalar_tensor.out", &[v, out, out]).is_err());
        let q = h.tensor_raw(ScalarType::QInt8, &[], &[0]);
        assert!(h.call("aten::scalar_tensor.out", &[v, q, q]).is_err());
    }

    #[test]
    fn fill_and_empty() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 2], &[1i32, 2, 3, 4]);
        let v = h.double(-3.7);
        let out = h.out(ScalarType::Int, &[4, 1]);
        h.call("aten::fill.Scalar_out", &[x, v, out, out]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[2, 2]);
        assert_eq!(h.read::<i32>(out), vec![-3; 4]);
        let value = h.tensor(&[], &[2.5f64]);
        let outf = h.out(ScalarType::Float, &[2, 2]);
        h.call("aten::fill.Tensor_out", &[x, value, outf, outf])
            .unwrap();
        assert_eq!(h.read::<f32>(outf), vec![2.5; 4]);
        // The value must be 0-dim.
        let vec_value = h.tensor(&[1], &[2.5f64]);
        assert!(
            h.call("aten::fill.Tensor_out", &[x, vec_value, outf, outf])
                .is_err()
        );
        // empty resizes and leaves the contents alone.
        let size = h.int_list(&[1, 3]);
        let none = h.none();
        h.call("aten::empty.out", &[size, none, outf, outf])
            .unwrap();
        assert_eq!(h.tensor_meta(outf).sizes(), &[1, 3]);
        let too_big = h.int_list(&[3, 3]);
        assert!(
            h.call("aten::empty.out", &[too_big, none, outf, outf])
                .is_err()
        );
    }

    #[test]
    fn empty_dim_order_checks_the_out_layout() {
        let mut h = Harness::new();
        let op = "dim_order_ops::_empty_dim_order.out";
        let size = h.int_list(&[1, 2, 3, 2]);
        let none = h.none();
        let out = h.out(ScalarType::Float, &[1, 2, 3, 4]);
        h.call(op, &[size, none, out, out]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[1, 2, 3, 2]);
        let contiguous = h.int_list(&[0, 1, 2, 3]);
        h.call(op, &[size, contiguous, out, out]).unwrap();
        // Channels last requested: the out must be channels last too.
        let cl = h.int_list(&[0, 2, 3, 1]);
        assert!(h.call(op, &[size, cl, out, out]).is_err());
        let out_cl = h.out_with_order(ScalarType::Float, &[1, 2, 3, 2], &[0, 2, 3, 1]);
        h.call(op, &[size, cl, out_cl, out_cl]).unwrap();
        assert!(h.call(op, &[size, none, out_cl, out_cl]).is_err());
        // Neither contiguous nor channels last, or of another rank.
        let odd = h.int_list(&[1, 0, 2, 3]);
        assert!(h.call(op, &[size, odd, out, out]).is_err());
        let short = h.int_list(&[0, 1]);
        assert!(h.call(op, &[size, short, out, out]).is_err());
    }
}
