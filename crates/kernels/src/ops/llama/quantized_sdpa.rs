//! `llama::custom_quantized_sdpa.out`: attention over an int8 KV cache.
//!
//! q, k and v are int8 with one f32 scale and one i8 zero point per (token, head)
//! (`[B, S, H, 1]`, or `[B, H, S, 1]` with `is_seq_at_dim_2`); every value reads as
//! `(x - zero_point) * scale`. The output is f32. The cache is dequantized tile by tile
//! (one K and one V tile of [`super::flash::KEY_BLOCK`] rows per task) into scratch,
//! never as a whole; everything else is the float path of [`super::sdpa`].

use etch_base::ScalarType;

use super::flash::{self, Plan, QuantRows, RowLayout, SeqDim};
use super::sdpa::{attn_shape, problem, read_mask};
use crate::{Args, KernelContext, KernelError, Tensor};

/// Checks one qparam tensor: `dtype`, 4-D, contiguous, sizes `[d0, d1, d2, 1]` of `data`.
fn check_qparam(
    t: Option<Tensor>,
    data: &Tensor,
    dtype: ScalarType,
    name: &str,
) -> Result<Tensor, KernelError> {
    let t = t.ok_or_else(|| {
        KernelError::invalid(format!("custom_quantized_sdpa: {name} is required"))
    })?;
    if t.dtype() != dtype {
        return Err(KernelError::DtypeMismatch {
            expected: dtype,
            found: t.dtype(),
        });
    }
    let d = data.sizes();
    if t.rank() != 4 || t.sizes() != [d[0], d[1], d[2], 1] {
        return Err(KernelError::invalid(format!(
            "custom_quantized_sdpa: {name} {t:?} must be [{}, {}, {}, 1]",
            d[0], d[1], d[2]
        )));
    }
    if !t.is_contiguous() {
        return Err(KernelError::invalid(format!(
            "custom_quantized_sdpa: {name} must be in contiguous dim order"
        )));
    }
    Ok(t)
}

fn quant_rows<'a>(
    ctx: &'a KernelContext<'_>,
    data: &Tensor,
    scales: &Tensor,
    zero_points: &Tensor,
    dim: SeqDim,
    lay: RowLayout,
) -> Result<QuantRows<'a>, KernelError> {
    QuantRows::new(
        ctx.read::<i8>(data)?,
        ctx.read::<f32>(scales)?,
        ctx.read::<i8>(zero_points)?,
        dim,
        lay,
    )
}

/// `custom_quantized_sdpa.out(Tensor query, Tensor key, Tensor value, SymInt start_pos,
/// Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None,
/// Tensor? q_zero_points=None, Tensor? q_scales=None, Tensor? k_zero_points=None,
/// Tensor? k_scales=None, Tensor? v_zero_points=None, Tensor? v_scales=None,
/// bool is_seq_at_dim_2=False, *, Tensor(a!) out)`.
pub(crate) fn custom_quantized_sdpa_out(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    a.expect_len(17)?;
    let q = a.tensor(0)?;
    let k = a.tensor(1)?;
    let v = a.tensor(2)?;
    let start_pos = a.int(3)?;
    let mask = a.opt_tensor(4)?;
    a.double(5)?;
    let causal = a.bool(6)?;
    let scale = a.opt_double(7)?;
    let dim = if a.bool(14)? {
        SeqDim::Two
    } else {
        SeqDim::One
    };
    for t in [&q, &k, &v] {
        if t.dtype() != ScalarType::Char {
            return Err(KernelError::UnsupportedDtype {
                dtype: t.dtype(),
                what: "custom_quantized_sdpa q/k/v (int8)",
            });
        }
    }
    let s = attn_shape(&q, &k, &v, dim)?;
    let qz = check_qparam(a.opt_tensor(8)?, &q, ScalarType::Char, "q_zero_points")?;
    let qs = check_qparam(a.opt_tensor(9)?, &q, ScalarType::Float, "q_scales")?;
    let kz = check_qparam(a.opt_tensor(10)?, &k, ScalarType::Char, "k_zero_points")?;
    let ks = check_qparam(a.opt_tensor(11)?, &k, ScalarType::Float, "k_scales")?;
    let vz = check_qparam(a.opt_tensor(12)?, &v, ScalarType::Char, "v_zero_points")?;
    let vs = check_qparam(a.opt_tensor(13)?, &v, ScalarType::Float, "v_scales")?;
    let p = problem(&s, start_pos, mask.as_ref(), causal, scale, dim)?;
    let out = a.tensor(15)?;
    if out.dtype() != ScalarType::Float {
        return Err(KernelError::DtypeMismatch {
            expected: ScalarType::Float,
            found: out.dtype(),
        });
    }
    if !out.is_contiguous() {
        return Err(KernelError::invalid(
            "custom_quantized_sdpa: out must be in contiguous dim order",
        ));
    }
    let out = a.resize_tensor(15, q.sizes())?;
    if p.is_empty() {
        return Ok(());
    }
    let mask = read_mask(ctx, mask.as_ref(), ScalarType::Float)?;
    let qr = quant_rows(ctx, &q, &qs, &qz, dim, s.q_layout(dim))?;
    let kr = quant_rows(ctx, &k, &ks, &kz, dim, s.kv_layout(dim))?;
    let vr = quant_rows(ctx, &v, &vs, &vz, dim, s.kv_layout(dim))?;
    let pool = ctx.pool();
    let plan = Plan::new(&p, pool.threads(), true, true)?;
    let scratch = ctx.scratch::<f32>(plan.scratch_len()?)?;
    let o = ctx.write::<f32>(&out)?;
    flash::run(
        pool,
        &p,
        &plan,
        &qr,
        &kr,
        &vr,
        mask,
        o,
        scratch,
        etch_linalg::dispatch().attention,
    )
}
