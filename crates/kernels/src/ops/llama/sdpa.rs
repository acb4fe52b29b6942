//! `llama::custom_sdpa.out` and `llama::sdpa_with_kv_cache.out`: attention of
//! `q` `[B, S_q, H_q, D]` over a `[B, S_kv, H_kv, D]` KV cache (f32, f16 or bf16,
//! accumulated in f32).
//!
//! * `scale` defaults to `1/sqrt(D)`.
//! * Without a mask only cache rows `[0, start_pos + S_q)` are read; with `is_causal`
//!   query `i` (absolute position `start_pos + i`) reads keys `j <= start_pos + i`.
//! * With a 2-D `[S_q, S_kv]` mask (f32, or q's dtype) it is added to the scores and
//!   the whole cache is read. A mask together with `is_causal` is an error.
//! * GQA: query head `h` reads KV head `h / (H_q / H_kv)`.

use etch_base::ScalarType;
use half::{bf16, f16};

use super::flash::{self, Float, FloatRows, Mask, Plan, Problem, RowLayout, Rows, SeqDim};
use super::update_cache;
use crate::ops::same_dtype;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Tensor};

/// The sizes of an attention call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnShape {
    pub batch: usize,
    pub q_len: usize,
    pub q_heads: usize,
    pub kv_len: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    pub fn q_layout(&self, dim: SeqDim) -> RowLayout {
        RowLayout::new(dim, self.batch, self.q_len, self.q_heads, self.head_dim)
    }

    pub fn kv_layout(&self, dim: SeqDim) -> RowLayout {
        RowLayout::new(dim, self.batch, self.kv_len, self.kv_heads, self.head_dim)
    }
}

fn invalid(msg: String) -> KernelError {
    KernelError::InvalidArgument(msg)
}

/// Fails with [`KernelError::DtypeMismatch`] unless `t` holds elements of `dtype`:
/// for the tensors whose element type the op fixes (the out tensor, the
/// quantization scales and zero points) rather than takes from another argument.
pub(super) fn expect_dtype(t: &Tensor, dtype: ScalarType) -> Result<(), KernelError> {
    if t.dtype() == dtype {
        Ok(())
    } else {
        Err(KernelError::DtypeMismatch {
            expected: dtype,
            found: t.dtype(),
        })
    }
}

/// Fails with an invalid-argument error reading "`op`: `name` must be in contiguous
/// dim order" unless `t` is contiguous: the attention engine addresses every tensor
/// it reads or writes as dense rows.
pub(super) fn expect_contiguous(t: &Tensor, op: &str, name: &str) -> Result<(), KernelError> {
    if t.is_contiguous() {
        Ok(())
    } else {
        Err(invalid(format!(
            "{op}: {name} must be in contiguous dim order"
        )))
    }
}

/// Checks q, k, v: 4-D, contiguous, equal batch and head dim, k and v of equal
/// shape, and `H_q` a multiple of `H_kv`.
pub(crate) fn attn_shape(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dim: SeqDim,
) -> Result<AttnShape, KernelError> {
    for (t, name) in [(q, "query"), (k, "key"), (v, "value")] {
        if t.rank() != 4 {
            return Err(invalid(format!("sdpa: {name} {t:?} must be 4-D")));
        }
        expect_contiguous(t, "sdpa", name)?;
    }
    if k.sizes() != v.sizes() {
        return Err(invalid(format!(
            "sdpa: key {k:?} and value {v:?} must have the same shape"
        )));
    }
    let (qs, ks) = (q.sizes(), k.sizes());
    let (s_dim, h_dim) = match dim {
        SeqDim::One => (1, 2),
        SeqDim::Two => (2, 1),
    };
    let shape = AttnShape {
        batch: qs[0],
        q_len: qs[s_dim],
        q_heads: qs[h_dim],
        kv_len: ks[s_dim],
        kv_heads: ks[h_dim],
        head_dim: qs[3],
    };
    if ks[0] != shape.batch || ks[3] != shape.head_dim {
        return Err(invalid(format!(
            "sdpa: query {q:?} and key {k:?} differ in batch or head dim"
        )));
    }
    if shape.kv_heads == 0 || !shape.q_heads.is_multiple_of(shape.kv_heads) {
        return Err(invalid(format!(
            "sdpa: {} query heads are not a multiple of {} KV heads",
            shape.q_heads, shape.kv_heads
        )));
    }
    Ok(shape)
}

/// Builds the problem: checks the mask's shape, the causal/mask exclusion and the
/// start position, and picks the keys read.
pub(crate) fn problem(
    s: &AttnShape,
    start_pos: i64,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
    dim: SeqDim,
) -> Result<Problem, KernelError> {
    if mask.is_some() && causal {
        return Err(KernelError::invalid(
            "sdpa: attn_mask and is_causal cannot be set at the same time",
        ));
    }
    let start = usize::try_from(start_pos)
        .map_err(|_| invalid(format!("sdpa: start_pos {start_pos} is negative")))?;
    let n_keys = match mask {
        Some(m) => {
            if m.rank() != 2 || m.sizes() != [s.q_len, s.kv_len] {
                return Err(invalid(format!(
                    "sdpa: attn_mask {m:?} must be [{}, {}]",
                    s.q_len, s.kv_len
                )));
            }
            expect_contiguous(m, "sdpa", "attn_mask")?;
            s.kv_len
        }
        None => match start.checked_add(s.q_len) {
            Some(end) if end <= s.kv_len => end,
            _ => {
                return Err(invalid(format!(
                    "sdpa: start_pos {start} + {} queries exceeds the {} cache rows",
                    s.q_len, s.kv_len
                )));
            }
        },
    };
    let scale = scale.unwrap_or_else(|| 1.0 / (s.head_dim as f64).sqrt()) as f32;
    Ok(Problem {
        batch: s.batch,
        q_len: s.q_len,
        q_heads: s.q_heads,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
        n_keys,
        start_pos: start,
        causal,
        scale,
        seq_dim: dim,
        mask_stride: s.kv_len,
    })
}

/// Reads a mask tensor (f32, or `alt`, the query's reduced float type).
pub(crate) fn read_mask<'a>(
    ctx: &'a KernelContext<'_>,
    mask: Option<&Tensor>,
    alt: ScalarType,
) -> Result<Mask<'a>, KernelError> {
    let Some(m) = mask else {
        return Ok(Mask::None);
    };
    Ok(match m.dtype() {
        ScalarType::Float => Mask::F32(ctx.read::<f32>(m)?),
        ScalarType::Half if alt == ScalarType::Half => Mask::F16(ctx.read::<f16>(m)?),
        ScalarType::BFloat16 if alt == ScalarType::BFloat16 => Mask::BF16(ctx.read::<bf16>(m)?),
        dtype => {
            return Err(KernelError::UnsupportedDtype {
                dtype,
                what: "sdpa attn_mask (f32 or the query's dtype)",
            });
        }
    })
}

fn cast<E: Float>(b: &[u8]) -> Result<&[E], KernelError> {
    bytemuck::try_cast_slice(b)
        .map_err(|e| KernelError::invalid(format!("sdpa: cache bytes as {}: {e}", E::DTYPE)))
}

/// The float attention with caches given as byte slices (so that
/// `sdpa_with_kv_cache` can pass caches it has just written).
#[allow(clippy::too_many_arguments)]
fn attend_float<E: Float>(
    ctx: &KernelContext<'_>,
    p: &Problem,
    s: &AttnShape,
    q: &Tensor,
    k: &[u8],
    v: &[u8],
    mask: Mask<'_>,
    out: &Tensor,
) -> Result<(), KernelError> {
    let dim = p.seq_dim;
    let qr = FloatRows::new(ctx.read::<E>(q)?, s.q_layout(dim))?;
    let kr = FloatRows::new(cast::<E>(k)?, s.kv_layout(dim))?;
    let vr = FloatRows::new(cast::<E>(v)?, s.kv_layout(dim))?;
    run_attention::<E, _, _, _>(ctx, p, &qr, &kr, &vr, mask, out)
}

/// Runs the blocked attention engine over q, k and v rows already laid out for `p`
/// and writes the result into `out` as `O`: plans the work for the context's thread
/// pool (with conversion buffers where the K or V rows are not stored as f32) and
/// takes the plan's scratch from the context. The float and the int8 kernels differ
/// only in how their rows are read, so both end here.
pub(super) fn run_attention<O: Float, Q: Rows, K: Rows, V: Rows>(
    ctx: &KernelContext<'_>,
    p: &Problem,
    q: &Q,
    k: &K,
    v: &V,
    mask: Mask<'_>,
    out: &Tensor,
) -> Result<(), KernelError> {
    let pool = ctx.pool();
    let plan = Plan::new(p, pool.threads(), k.converts(), v.converts())?;
    let scratch = ctx.scratch::<f32>(plan.scratch_len()?)?;
    let o = ctx.write::<O>(out)?;
    flash::run(
        pool,
        p,
        &plan,
        q,
        k,
        v,
        mask,
        o,
        scratch,
        etch_linalg::dispatch().attention,
    )
}

fn check_float_dtypes(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<ScalarType, KernelError> {
    let dtype = q.dtype();
    if !matches!(
        dtype,
        ScalarType::Float | ScalarType::Half | ScalarType::BFloat16
    ) {
        return Err(KernelError::UnsupportedDtype {
            dtype,
            what: "sdpa (f32, f16 or bf16)",
        });
    }
    for t in [k, v] {
        same_dtype(q, t)?;
    }
    Ok(dtype)
}

/// Checks that `out` has `dtype` and the contiguous dim order, then resizes it to
/// q's sizes; `op` names the kernel in the error.
pub(super) fn resize_out(
    a: &mut Args<'_>,
    out_arg: OutArg,
    q: &Tensor,
    dtype: ScalarType,
    op: &str,
) -> Result<Tensor, KernelError> {
    let out = out_arg.tensor();
    expect_dtype(&out, dtype)?;
    expect_contiguous(&out, op, "out")?;
    out_arg.resize(a, q.sizes())
}

#[allow(clippy::too_many_arguments)]
fn dispatch(
    ctx: &KernelContext<'_>,
    dtype: ScalarType,
    p: &Problem,
    s: &AttnShape,
    q: &Tensor,
    (k, v): (&[u8], &[u8]),
    mask: Mask<'_>,
    out: &Tensor,
) -> Result<(), KernelError> {
    match dtype {
        ScalarType::Float => attend_float::<f32>(ctx, p, s, q, k, v, mask, out),
        ScalarType::Half => attend_float::<f16>(ctx, p, s, q, k, v, mask, out),
        ScalarType::BFloat16 => attend_float::<bf16>(ctx, p, s, q, k, v, mask, out),
        dtype => Err(KernelError::UnsupportedDtype {
            dtype,
            what: "sdpa (f32, f16 or bf16)",
        }),
    }
}

op_args! {
    /// `custom_sdpa.out(Tensor query, Tensor key, Tensor value, SymInt start_pos,
    /// Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None,
    /// *, Tensor(a!) out)`.
    struct CustomSdpaArgs = "llama::custom_sdpa.out" {
        query: Tensor,
        key: Tensor,
        value: Tensor,
        start_pos: i64,
        attn_mask: Option<Tensor>,
        dropout_p: f64,
        is_causal: bool,
        scale: Option<f64>,
        out: OutArg,
    } returns 1
}

pub(crate) fn custom_sdpa_out(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    let CustomSdpaArgs {
        query: q,
        key: k,
        value: v,
        start_pos,
        attn_mask: mask,
        is_causal: causal,
        scale,
        out,
        ..
    } = CustomSdpaArgs::unpack(a)?;
    let dtype = check_float_dtypes(&q, &k, &v)?;
    let s = attn_shape(&q, &k, &v, SeqDim::One)?;
    let p = problem(&s, start_pos, mask.as_ref(), causal, scale, SeqDim::One)?;
    let out = resize_out(a, out, &q, dtype, "sdpa")?;
    if p.is_empty() {
        return Ok(());
    }
    let mask = read_mask(ctx, mask.as_ref(), dtype)?;
    let kb = ctx.read_bytes(&k)?;
    let vb = ctx.read_bytes(&v)?;
    dispatch(ctx, dtype, &p, &s, &q, (kb, vb), mask, &out)
}

op_args! {
    /// `sdpa_with_kv_cache.out(Tensor query, Tensor key, Tensor value, Tensor(a!) key_cache,
    /// Tensor(b!) value_cache, SymInt start_pos, SymInt seq_len, Tensor? attn_mask=None,
    /// float drpout_p=0., bool is_causal=False, float? scale=None, *, Tensor(c!) out)`:
    /// writes `key`/`value` into the caches at `start_pos`, then attends over the caches.
    struct SdpaWithKvCacheArgs = "llama::sdpa_with_kv_cache.out" {
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_cache: Tensor,
        value_cache: Tensor,
        start_pos: i64,
        seq_len: i64,
        attn_mask: Option<Tensor>,
        dropout_p: f64,
        is_causal: bool,
        scale: Option<f64>,
        out: OutArg,
    } returns 1
}

pub(crate) fn sdpa_with_kv_cache_out(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    let SdpaWithKvCacheArgs {
        query: q,
        key: k,
        value: v,
        key_cache: kc,
        value_cache: vc,
        start_pos,
        seq_len,
        attn_mask: mask,
        is_causal: causal,
        scale,
        out,
        ..
    } = SdpaWithKvCacheArgs::unpack(a)?;
    // Every check before the first write, so a rejected call leaves the caches alone.
    let dtype = check_float_dtypes(&q, &kc, &vc)?;
    let ku = update_cache::check_pair(&k, &kc)?;
    let vu = update_cache::check_pair(&v, &vc)?;
    let k_start = update_cache::check_start(&ku, start_pos)?;
    let v_start = update_cache::check_start(&vu, start_pos)?;
    let seq_ok = usize::try_from(seq_len)
        .is_ok_and(|n| (k_start + n) <= kc.sizes()[1] && (v_start + n) <= vc.sizes()[1]);
    if !seq_ok {
        return Err(invalid(format!(
            "sdpa_with_kv_cache: start_pos {start_pos} + seq_len {seq_len} exceeds the caches"
        )));
    }
    let s = attn_shape(&q, &kc, &vc, SeqDim::One)?;
    let p = problem(&s, start_pos, mask.as_ref(), causal, scale, SeqDim::One)?;
    let out = resize_out(a, out, &q, dtype, "sdpa")?;
    let mask = read_mask(ctx, mask.as_ref(), dtype)?;
    let kc_bytes = ctx.write_bytes(&kc)?;
    let vc_bytes = ctx.write_bytes(&vc)?;
    if k.numel() > 0 {
        update_cache::copy_at(&ku, k_start, ctx.read_bytes(&k)?, kc_bytes)?;
    }
    if v.numel() > 0 {
        update_cache::copy_at(&vu, v_start, ctx.read_bytes(&v)?, vc_bytes)?;
    }
    if p.is_empty() {
        return Ok(());
    }
    dispatch(ctx, dtype, &p, &s, &q, (kc_bytes, vc_bytes), mask, &out)
}
