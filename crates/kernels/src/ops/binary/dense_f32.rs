//! `add`, `sub`, `mul` and `div` of two f32 tensors of one shape and one dim order into
//! an f32 output of the same (a residual connection's add): the kernel library's vector
//! loops over the three storages as flat runs, split over the pool. The result is the
//! general path's (one IEEE operation per element); only the loop differs, which the
//! general path runs in blocks through per-block operand fetches compiled for the
//! baseline instruction set.

use etch_base::ScalarType;
use etch_linalg::elementwise::{self, Arithmetic};

use super::Op;
use crate::ops::elementwise::Operand;
use crate::{KernelContext, KernelError, Scalar, Tensor};

/// Fewest elements of one task: smaller outputs run on the calling thread.
const MIN_TASK_ELEMENTS: usize = 8192;

/// Runs `x op y` into `out` when it is such a product (`op` one of the four, `alpha`
/// one or absent, every tensor f32 with `out`'s sizes and dim order); `Ok(false)`,
/// touching nothing, otherwise.
pub(super) fn try_run(
    ctx: &KernelContext<'_>,
    (x, y): (&Operand, &Operand),
    out: &Tensor,
    op: Op,
    alpha: Option<Scalar>,
) -> Result<bool, KernelError> {
    let unit_alpha =
        matches!(alpha, None | Some(Scalar::Int(1))) || alpha == Some(Scalar::Double(1.0));
    let arithmetic = match op {
        Op::Add if unit_alpha => Arithmetic::Add,
        Op::Sub if unit_alpha => Arithmetic::Subtract,
        Op::Mul => Arithmetic::Multiply,
        Op::Div => Arithmetic::Divide,
        _ => return Ok(false),
    };
    let (Operand::Tensor(a), Operand::Tensor(b)) = (x, y) else {
        return Ok(false);
    };
    let like_out = |t: &Tensor| {
        t.dtype() == ScalarType::Float
            && t.sizes() == out.sizes()
            && t.dim_order() == out.dim_order()
    };
    if out.dtype() != ScalarType::Float || !like_out(a) || !like_out(b) {
        return Ok(false);
    }
    let n = out.numel();
    let (xs, ys) = (ctx.read::<f32>(a)?, ctx.read::<f32>(b)?);
    let os = ctx.write::<f32>(out)?;
    let (Some(xs), Some(ys), Some(os)) = (xs.get(..n), ys.get(..n), os.get_mut(..n)) else {
        return Err(KernelError::invalid(
            "elementwise operand shorter than its shape",
        ));
    };
    let isa = etch_linalg::dispatch().elementwise;
    let pool = ctx.pool();
    let tasks = (n / MIN_TASK_ELEMENTS).clamp(1, pool.threads());
    let chunk = n.div_ceil(tasks).next_multiple_of(16).max(1);
    pool.for_each_chunk_mut(os, chunk, 1, |i, part| {
        let run = i * chunk..i * chunk + part.len();
        let (x, y) = (
            elementwise::Operand::Run(&xs[run.clone()]),
            elementwise::Operand::Run(&ys[run]),
        );
        elementwise::arithmetic(isa, arithmetic, x, y, None, part);
    });
    Ok(true)
}
