//! `llama::custom_quantized_sdpa.out`: attention over an int8 KV cache.
//!
//! q, k and v are int8 with one f32 scale and one i8 zero point per (token, head)
//! (`[B, S, H, 1]`, or `[B, H, S, 1]` with `is_seq_at_dim_2`); every value reads as
//! `(x - zero_point) * scale`. The output is f32. The cache is dequantized tile by tile
//! (one K and one V tile of [`super::flash::KEY_BLOCK`] rows per task) into scratch,
//! never as a whole; everything else is the float path of [`super::sdpa`].

use etch_base::ScalarType;

use super::flash::{QuantRows, RowLayout, SeqDim};
use super::sdpa::{
    attn_shape, expect_contiguous, expect_dtype, problem, read_mask, resize_out, run_attention,
};
use crate::schema::{OpArgs, OutArg, op_args};
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
    expect_dtype(&t, dtype)?;
    let d = data.sizes();
    if t.rank() != 4 || t.sizes() != [d[0], d[1], d[2], 1] {
        return Err(KernelError::invalid(format!(
            "custom_quantized_sdpa: {name} {t:?} must be [{}, {}, {}, 1]",
            d[0], d[1], d[2]
        )));
    }
    expect_contiguous(&t, "custom_quantized_sdpa", name)?;
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

op_args! {
    /// `custom_quantized_sdpa.out(Tensor query, Tensor key, Tensor value, SymInt start_pos,
    /// Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None,
    /// Tensor? q_zero_points=None, Tensor? q_scales=None, Tensor? k_zero_points=None,
    /// Tensor? k_scales=None, Tensor? v_zero_points=None, Tensor? v_scales=None,
    /// bool is_seq_at_dim_2=False, *, Tensor(a!) out)`.
    struct QuantizedSdpaArgs = "llama::custom_quantized_sdpa.out" {
        query: Tensor,
        key: Tensor,
        value: Tensor,
        start_pos: i64,
        attn_mask: Option<Tensor>,
        dropout_p: f64,
        is_causal: bool,
        scale: Option<f64>,
        q_zero_points: Option<Tensor>,
        q_scales: Option<Tensor>,
        k_zero_points: Option<Tensor>,
        k_scales: Option<Tensor>,
        v_zero_points: Option<Tensor>,
        v_scales: Option<Tensor>,
        is_seq_at_dim_2: bool,
        out: OutArg,
    } returns 1
}

pub(crate) fn custom_quantized_sdpa_out(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    let QuantizedSdpaArgs {
        query: q,
        key: k,
        value: v,
        start_pos,
        attn_mask: mask,
        is_causal: causal,
        scale,
        q_zero_points,
        q_scales,
        k_zero_points,
        k_scales,
        v_zero_points,
        v_scales,
        is_seq_at_dim_2,
        out: out_arg,
        ..
    } = QuantizedSdpaArgs::unpack(a)?;
    let dim = if is_seq_at_dim_2 {
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
    let qz = check_qparam(q_zero_points, &q, ScalarType::Char, "q_zero_points")?;
    let qs = check_qparam(q_scales, &q, ScalarType::Float, "q_scales")?;
    let kz = check_qparam(k_zero_points, &k, ScalarType::Char, "k_zero_points")?;
    let ks = check_qparam(k_scales, &k, ScalarType::Float, "k_scales")?;
    let vz = check_qparam(v_zero_points, &v, ScalarType::Char, "v_zero_points")?;
    let vs = check_qparam(v_scales, &v, ScalarType::Float, "v_scales")?;
    let p = problem(&s, start_pos, mask.as_ref(), causal, scale, dim)?;
    let out = resize_out(a, out_arg, &q, ScalarType::Float, "custom_quantized_sdpa")?;
    if p.is_empty() {
        return Ok(());
    }
    let mask = read_mask(ctx, mask.as_ref(), ScalarType::Float)?;
    let qr = quant_rows(ctx, &q, &qs, &qz, dim, s.q_layout(dim))?;
    let kr = quant_rows(ctx, &k, &ks, &kz, dim, s.kv_layout(dim))?;
    let vr = quant_rows(ctx, &v, &vs, &vz, dim, s.kv_layout(dim))?;
    run_attention::<f32, _, _, _>(ctx, &p, &qr, &kr, &vr, mask, &out)
}
