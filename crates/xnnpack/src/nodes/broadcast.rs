//! Numpy broadcasting of two operands to an output, run by run: the loops of the
//! binary nodes (fp32 and int8) and of the elementwise arithmetic of `etch-linalg`.

use etch_kernels::KernelError;
use etch_linalg::elementwise::{self, Operand};

use crate::dims::{Dims, MAX_DIMS};
use crate::nodes::call::short;

/// Element strides of `d` right-aligned to rank `rank`, 0 along broadcast axes.
fn broadcast_strides(d: &Dims, y: &Dims) -> [usize; MAX_DIMS] {
    let mut s = [0usize; MAX_DIMS];
    let lead = y.rank() - d.rank();
    let mut stride = 1usize;
    for i in (0..d.rank()).rev() {
        let size = d.get(i);
        s[lead + i] = if size == 1 && y.get(lead + i) != 1 {
            0
        } else {
            stride
        };
        stride *= size;
    }
    s
}

/// The two inputs of a broadcasting binary node: each operand's dims and elements, and
/// the output dims both are broadcast to (numpy rules).
#[derive(Debug, Clone, Copy)]
pub struct BroadcastOperands<'a, T> {
    /// Dims of the first operand.
    pub ad: &'a Dims,
    /// Elements of the first operand.
    pub a: &'a [T],
    /// Dims of the second operand.
    pub bd: &'a Dims,
    /// Elements of the second operand.
    pub b: &'a [T],
    /// Dims of the output.
    pub yd: &'a Dims,
}

/// `out = g(a, b)` with numpy broadcasting of both operands to the output dims, for
/// any element type (the int8 nodes use it too).
#[inline(always)]
pub fn binary_with<T: Copy, U: Copy>(
    g: &impl Fn(T, T) -> U,
    operands: BroadcastOperands<'_, T>,
    out: &mut [U],
) -> Result<(), KernelError> {
    for_each_operand_run(operands, out, |x, y, o| elementwise::zip_with(x, y, o, g))
}

/// Visits the output of a broadcast binary node run by run: `row(a_run, b_run, out_run)`
/// where each operand run is as long as the output run or one value. The whole output
/// is one run when both operands are as long as it (or one value); otherwise each
/// output row (the innermost axis) is one.
#[inline(always)]
pub fn for_each_operand_run<T: Copy, U>(
    operands: BroadcastOperands<'_, T>,
    out: &mut [U],
    mut row: impl FnMut(Operand<'_, T>, Operand<'_, T>, &mut [U]),
) -> Result<(), KernelError> {
    let BroadcastOperands { ad, a, bd, b, yd } = operands;
    let n = out.len();
    fn flat<T: Copy>(x: &[T], n: usize) -> Option<Operand<'_, T>> {
        match x.len() {
            len if len == n => Some(Operand::Run(x)),
            1 => Some(Operand::Splat(x[0])),
            _ => None,
        }
    }
    if let (Some(x), Some(y)) = (flat(a, n), flat(b, n)) {
        row(x, y, out);
        return Ok(());
    }
    let r = yd.rank();
    let sa = broadcast_strides(ad, yd);
    let sb = broadcast_strides(bd, yd);
    let inner = yd.get(r - 1);
    let (ia, ib) = (sa[r - 1], sb[r - 1]);
    // The operand run of one output row: contiguous (stride 1) or one broadcast value.
    let run = |x: &[T], off: usize, stride: usize| -> Result<(usize, bool), KernelError> {
        let last = off + (inner.max(1) - 1) * stride;
        if last >= x.len() {
            return Err(short("binary"));
        }
        Ok((off, stride == 0))
    };
    let mut idx = [0usize; MAX_DIMS];
    for o in out.chunks_exact_mut(inner.max(1)) {
        let (mut oa, mut ob) = (0usize, 0usize);
        for d in 0..r - 1 {
            oa += idx[d] * sa[d];
            ob += idx[d] * sb[d];
        }
        let (oa, a_one) = run(a, oa, ia)?;
        let (ob, b_one) = run(b, ob, ib)?;
        let w = o.len();
        let x = if a_one {
            Operand::Splat(a[oa])
        } else {
            Operand::Run(&a[oa..oa + w])
        };
        let y = if b_one {
            Operand::Splat(b[ob])
        } else {
            Operand::Run(&b[ob..ob + w])
        };
        row(x, y, o);
        for d in (0..r.saturating_sub(1)).rev() {
            idx[d] += 1;
            if idx[d] < yd.get(d) {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(())
}
