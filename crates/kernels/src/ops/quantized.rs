//! The `quantized_decomposed` kernels: quantized embeddings (8, 4 and 2 bit),
//! per-token asymmetric qparams, and per-token / per-tensor (de)quantization.
//!
//! Numerics follow ExecuTorch's quantized kernels exactly: qparams are computed with
//! an f64 scale and an integer zero point (`SMALL_SCALE_THRESHOLD` applied),
//! quantization multiplies by the f32 reciprocal of the scale and rounds half to even,
//! dequantization is `(q - zp) * scale` in f32.

use std::ops::Range;

use etch_base::ScalarType;

use super::elementwise::BLOCK;
use super::elementwise::args_form::args_form;
use super::elementwise::dtype::{Element, In, Out};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, GRAIN_SIZE, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("quantized_decomposed::embedding_byte.out", |c, a| {
        embedding::<EmbeddingArgs>(c, a, 8)
    });
    r.register("quantized_decomposed::embedding_byte.dtype_out", |c, a| {
        embedding::<EmbeddingDtypeArgs>(c, a, 8)
    });
    r.register("quantized_decomposed::embedding_4bit.out", |c, a| {
        embedding::<EmbeddingArgs>(c, a, 4)
    });
    r.register("quantized_decomposed::embedding_4bit.dtype_out", |c, a| {
        embedding::<EmbeddingDtypeArgs>(c, a, 4)
    });
    r.register("quantized_decomposed::embedding_2bit.out", |c, a| {
        embedding::<EmbeddingArgs>(c, a, 2)
    });
    r.register("quantized_decomposed::embedding_2bit.dtype_out", |c, a| {
        embedding::<EmbeddingDtypeArgs>(c, a, 2)
    });
    r.register(
        "quantized_decomposed::choose_qparams_per_token_asymmetric.out",
        choose_qparams_per_token_asymmetric,
    );
    r.register(
        "quantized_decomposed::quantize_per_token.out",
        quantize::<QuantizePerTokenArgs>,
    );
    r.register(
        "quantized_decomposed::dequantize_per_token.out",
        dequantize::<DequantizePerTokenArgs>,
    );
    r.register(
        "quantized_decomposed::quantize_per_tensor.out",
        quantize::<QuantizePerTensorArgs>,
    );
    r.register(
        "quantized_decomposed::quantize_per_tensor.tensor_out",
        quantize::<QuantizePerTensorTensorArgs>,
    );
    r.register(
        "quantized_decomposed::dequantize_per_tensor.out",
        dequantize::<DequantizePerTensorArgs>,
    );
    r.register(
        "quantized_decomposed::dequantize_per_tensor.tensor_out",
        dequantize::<DequantizePerTensorTensorArgs>,
    );
}

/// ExecuTorch's smallest scale `choose_qparams` returns.
pub const SMALL_SCALE_THRESHOLD: f32 = 6.1e-5;

fn is_float(t: ScalarType) -> bool {
    t.is_floating_point()
}

fn dtype_err(dtype: ScalarType, what: &'static str) -> KernelError {
    KernelError::UnsupportedDtype { dtype, what }
}

/// Refuses a tensor of dtype `found` where the arguments name `expected`.
fn require_dtype(found: ScalarType, expected: ScalarType) -> Result<(), KernelError> {
    if found != expected {
        return Err(KernelError::DtypeMismatch { expected, found });
    }
    Ok(())
}

/// Refuses a quant range whose minimum is above its maximum; `prefix` starts the
/// message (`"weight "` for the embeddings, empty elsewhere).
fn require_ordered_range(qmin: i64, qmax: i64, prefix: &str) -> Result<(), KernelError> {
    if qmin > qmax {
        return Err(KernelError::invalid(format!(
            "{prefix}quant min {qmin} is greater than quant max {qmax}"
        )));
    }
    Ok(())
}

/// Refuses non-contiguous tensors, naming the op `what` in the message.
fn require_contiguous(x: &Tensor, y: &Tensor, what: &str) -> Result<(), KernelError> {
    if !x.is_contiguous() || !y.is_contiguous() {
        return Err(KernelError::invalid(format!(
            "{what}: tensors must be contiguous"
        )));
    }
    Ok(())
}

/// The error for a tensor whose storage does not hold the elements its shape says,
/// naming the op `what`.
fn storage_length_error(what: &str) -> KernelError {
    KernelError::invalid(format!("{what}: unexpected storage length"))
}

/// Calls `f(start, len)` for each block of at most [`BLOCK`] consecutive indices of
/// `range`, in order.
#[inline(always)]
fn for_each_block(range: Range<usize>, mut f: impl FnMut(usize, usize)) {
    let mut j = range.start;
    while j < range.end {
        let m = BLOCK.min(range.end - j);
        f(j, m);
        j += m;
    }
}

// ---------------------------------------------------------------------------------
// Quantized embeddings
// ---------------------------------------------------------------------------------

op_args! {
    /// `embedding_{byte,4bit,2bit}.out(Tensor weight, Tensor weight_scales,
    /// Tensor? weight_zero_points, int weight_quant_min, int weight_quant_max,
    /// Tensor indices, *, Tensor(a!) out)`.
    struct EmbeddingArgs = "quantized_decomposed::embedding_<byte|4bit|2bit>.out" {
        weight: Tensor,
        weight_scales: Tensor,
        weight_zero_points: Option<Tensor>,
        weight_quant_min: i64,
        weight_quant_max: i64,
        indices: Tensor,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `embedding_{byte,4bit,2bit}.dtype_out(Tensor weight, Tensor weight_scales,
    /// Tensor? weight_zero_points, int weight_quant_min, int weight_quant_max,
    /// Tensor indices, *, ScalarType? dtype=None, Tensor(a!) out)`.
    struct EmbeddingDtypeArgs = "quantized_decomposed::embedding_<byte|4bit|2bit>.dtype_out" {
        weight: Tensor,
        weight_scales: Tensor,
        weight_zero_points: Option<Tensor>,
        weight_quant_min: i64,
        weight_quant_max: i64,
        indices: Tensor,
        dtype: Option<ScalarType>,
        out: OutArg,
    } returns 1
}

// The `.out` arguments are the `.dtype_out` ones with no dtype named.
args_form! {
    EmbeddingDtypeArgs {
        weight,
        weight_scales,
        weight_zero_points,
        weight_quant_min,
        weight_quant_max,
        indices,
        out,
    }:
    EmbeddingArgs => |a| { dtype: None };
}

/// The quantized embedding lookups over `bits`-bit weights, with the arguments of
/// schema `S` (`.dtype_out` names the out dtype).
fn embedding<S>(ctx: &KernelContext<'_>, a: &mut Args<'_>, bits: usize) -> Result<(), KernelError>
where
    S: for<'x> OpArgs<'x> + Into<EmbeddingDtypeArgs>,
{
    let EmbeddingDtypeArgs {
        weight,
        weight_scales: scales,
        weight_zero_points: zps,
        weight_quant_min: qmin,
        weight_quant_max: qmax,
        indices,
        dtype,
        out: out_arg,
    } = S::unpack(a)?.into();
    require_ordered_range(qmin, qmax, "weight ")?;
    let wd = weight.dtype();
    let weight_ok = if bits == 8 {
        matches!(wd, ScalarType::Byte | ScalarType::Char)
    } else {
        wd == ScalarType::Byte
    };
    if !weight_ok {
        return Err(dtype_err(wd, "quantized embedding weight"));
    }
    if weight.rank() != 2 {
        return Err(KernelError::invalid(format!(
            "quantized embedding weight must be 2-D, got {:?}",
            weight.sizes()
        )));
    }
    require_contiguous(&weight, &indices, "quantized embedding")?;
    let vocab = weight.sizes()[0];
    let packed = weight.sizes()[1];
    let dim = packed * (8 / bits);
    if scales.rank() == 0 || scales.rank() > 2 || scales.sizes()[0] != vocab {
        return Err(KernelError::invalid(format!(
            "weight_scales of shape {:?} for a vocabulary of {vocab}",
            scales.sizes()
        )));
    }
    let groups = if scales.rank() == 2 {
        scales.sizes()[1]
    } else {
        1
    };
    if groups == 0 || !dim.is_multiple_of(groups) {
        return Err(KernelError::invalid(format!(
            "{groups} groups do not divide the embedding dim {dim}"
        )));
    }
    if !is_float(scales.dtype()) {
        return Err(dtype_err(scales.dtype(), "weight_scales"));
    }
    if let Some(z) = &zps {
        if z.sizes() != scales.sizes() {
            return Err(KernelError::invalid(format!(
                "weight_zero_points of shape {:?}, expected {:?}",
                z.sizes(),
                scales.sizes()
            )));
        }
        if !super::elementwise::dtype::is_supported(z.dtype()) {
            return Err(dtype_err(z.dtype(), "weight_zero_points"));
        }
    }
    if !matches!(indices.dtype(), ScalarType::Long | ScalarType::Int) {
        return Err(dtype_err(
            indices.dtype(),
            "embedding indices (Long or Int)",
        ));
    }
    if indices.rank() + 1 > MAX_RANK {
        return Err(KernelError::invalid("embedding indices rank too large"));
    }
    let mut sizes = [0usize; MAX_RANK];
    sizes[..indices.rank()].copy_from_slice(indices.sizes());
    sizes[indices.rank()] = dim;
    let out = out_arg.resize(a, &sizes[..indices.rank() + 1])?;
    if let Some(d) = dtype {
        require_dtype(out.dtype(), d)?;
    }
    if !is_float(out.dtype()) {
        return Err(dtype_err(out.dtype(), "quantized embedding out"));
    }
    let idx = In::read(ctx, &indices)?;
    let n = indices.numel();
    for i in 0..n {
        let v: i64 = idx.get(i);
        if v < 0 || v as usize >= vocab {
            return Err(KernelError::invalid(format!(
                "embedding index {v} out of range for {vocab} rows"
            )));
        }
    }
    if n == 0 || dim == 0 {
        return Ok(());
    }
    let w = ctx.read_raw::<u8>(&weight)?;
    let sc = In::read(ctx, &scales)?;
    let zp = zps.map(|z| In::read(ctx, &z)).transpose()?;
    if w.len() != vocab * packed || sc.len() != vocab * groups {
        return Err(storage_length_error("quantized embedding"));
    }
    let signed = wd == ScalarType::Char;
    let job = EmbedJob {
        w,
        scales: sc,
        zps: zp,
        idx,
        packed,
        dim,
        groups,
        bits,
        signed,
    };
    let mut dst = Out::write(ctx, &out)?;
    let threads = ctx.pool().threads();
    if threads > 1 && n >= 2 && n * dim >= GRAIN_SIZE {
        let per = n.div_ceil(threads * 4).max(1);
        dst.par_chunks(ctx.pool(), per * dim, &|start, mut part| {
            job.rows(start / dim, &mut part)
        });
    } else {
        job.rows(0, &mut dst);
    }
    Ok(())
}

struct EmbedJob<'a> {
    w: &'a [u8],
    scales: In<'a>,
    zps: Option<In<'a>>,
    idx: In<'a>,
    packed: usize,
    dim: usize,
    groups: usize,
    bits: usize,
    signed: bool,
}

impl EmbedJob<'_> {
    /// The quantized value of column `j` of a row's packed bytes.
    #[inline(always)]
    fn value(&self, row: &[u8], j: usize) -> f32 {
        match self.bits {
            8 => {
                if self.signed {
                    row[j] as i8 as f32
                } else {
                    row[j] as f32
                }
            }
            4 => {
                let b = row[j >> 1];
                let nib = if j & 1 == 0 { b >> 4 } else { b & 0x0F };
                nib as f32 - 8.0
            }
            _ => {
                let b = row[j >> 2];
                ((b >> (2 * (j & 3))) & 3) as f32 - 2.0
            }
        }
    }

    /// Dequantizes output rows `first..` into `out` (whole rows).
    fn rows(&self, first: usize, out: &mut Out<'_>) {
        let n = out.len() / self.dim;
        let group = self.dim / self.groups;
        let mut buf = [0f32; BLOCK];
        for r in 0..n {
            let v = self.idx.get::<i64>(first + r) as usize;
            let row = &self.w[v * self.packed..(v + 1) * self.packed];
            for g in 0..self.groups {
                let scale: f32 = self.scales.get(v * self.groups + g);
                let zp: f32 = self
                    .zps
                    .as_ref()
                    .map_or(0.0, |z| z.get(v * self.groups + g));
                for_each_block(g * group..(g + 1) * group, |j, m| {
                    for (k, o) in buf[..m].iter_mut().enumerate() {
                        *o = (self.value(row, j + k) - zp) * scale;
                    }
                    out.store(r * self.dim + j, 1, &buf[..m]);
                });
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Per-token qparams and (de)quantization
// ---------------------------------------------------------------------------------

/// ExecuTorch's `calculate_scale_and_zero_point` for one range.
pub fn scale_and_zero_point(
    min: f32,
    max: f32,
    qmin: i32,
    qmax: i32,
) -> Result<(f64, i64), KernelError> {
    // std::min(min, 0.f) / std::max(max, 0.f), NaN-preserving as in C++.
    let mut min = if 0.0 < min { 0.0 } else { min };
    let mut max = if max < 0.0 { 0.0 } else { max };
    let range = (qmax - qmin) as f64;
    let mut scale = (max as f64 - min as f64) / range;
    if scale as f32 == 0.0 || (1.0f32 / scale as f32).is_infinite() {
        scale = 0.1;
    }
    if scale.is_nan() || scale <= 0.0 {
        return Err(KernelError::invalid(format!(
            "quantization scale should be > 0, got {scale} (range {min} .. {max})"
        )));
    }
    let small = SMALL_SCALE_THRESHOLD as f64;
    if scale < small {
        let org = scale as f32;
        scale = small;
        let span = (qmax - qmin) as f32;
        if min == 0.0 {
            max = SMALL_SCALE_THRESHOLD * span;
        } else if max == 0.0 {
            min = -SMALL_SCALE_THRESHOLD * span;
        } else {
            let amp = SMALL_SCALE_THRESHOLD / org;
            min *= amp;
            max *= amp;
        }
    }
    let (qmin_f, qmax_f) = (qmin as f64, qmax as f64);
    let zp_from_min = qmin_f - min as f64 / scale;
    let zp_from_max = qmax_f - max as f64 / scale;
    let err_min = qmin_f.abs() - (min as f64 / scale).abs();
    let err_max = qmax_f.abs() - (max as f64 / scale).abs();
    let initial = if err_min < err_max {
        zp_from_min
    } else {
        zp_from_max
    };
    let zp = if initial < qmin_f {
        qmin as i64
    } else if initial > qmax_f {
        qmax as i64
    } else {
        (initial as f32).round_ties_even() as i64
    };
    Ok((scale, zp))
}

/// Tokens (all dims but the last) and the token length of a rank >= 1 tensor.
fn tokens(t: &Tensor) -> Result<(usize, usize), KernelError> {
    let Some((&last, lead)) = t.sizes().split_last() else {
        return Err(KernelError::invalid(
            "per-token ops need a tensor of rank >= 1",
        ));
    };
    Ok((lead.iter().product(), last))
}

op_args! {
    /// `choose_qparams_per_token_asymmetric.out(Tensor input, ScalarType dtype, *,
    /// Tensor(a!) scale_out, Tensor(b!) zero_point_out)`, returning both outs (one
    /// TensorList slot): range [-128, 127].
    struct ChooseQparamsArgs = "quantized_decomposed::choose_qparams_per_token_asymmetric.out" {
        input: Tensor,
        dtype: ScalarType,
        scale_out: OutArg,
        zero_point_out: OutArg,
    } returns 1
}

fn choose_qparams_per_token_asymmetric(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    let ChooseQparamsArgs {
        input: x,
        scale_out,
        zero_point_out,
        ..
    } = ChooseQparamsArgs::unpack(a)?;
    if !is_float(x.dtype()) {
        return Err(dtype_err(x.dtype(), "choose_qparams input (float)"));
    }
    if !x.is_contiguous() {
        return Err(KernelError::invalid(
            "choose_qparams: input must be contiguous",
        ));
    }
    let (n_tok, len) = tokens(&x)?;
    let mut sizes = [0usize; MAX_RANK];
    sizes[..x.rank()].copy_from_slice(x.sizes());
    sizes[x.rank() - 1] = 1;
    let scale_t = scale_out.resize(a, &sizes[..x.rank()])?;
    let zp_t = zero_point_out.resize(a, &sizes[..x.rank()])?;
    require_dtype(scale_t.dtype(), ScalarType::Double)?;
    require_dtype(zp_t.dtype(), ScalarType::Long)?;
    if n_tok == 0 {
        return Ok(());
    }
    if len == 0 {
        return Err(KernelError::invalid("choose_qparams: tokens of length 0"));
    }
    let data = In::read(ctx, &x)?;
    let scales = ctx.write::<f64>(&scale_t)?;
    let zps = ctx.write::<i64>(&zp_t)?;
    if data.len() != n_tok * len || scales.len() != n_tok || zps.len() != n_tok {
        return Err(storage_length_error("choose_qparams"));
    }
    let mut buf = [0f32; BLOCK];
    for t in 0..n_tok {
        let (mut mn, mut mx) = (f32::INFINITY, f32::NEG_INFINITY);
        for_each_block(0..len, |j, m| {
            data.load(t * len + j, 1, &mut buf[..m]);
            for &v in &buf[..m] {
                if v < mn {
                    mn = v;
                }
                if v > mx {
                    mx = v;
                }
                if v.is_nan() {
                    mn = v;
                    mx = v;
                }
            }
        });
        let (s, z) = scale_and_zero_point(mn, mx, -128, 127)?;
        scales[t] = s;
        zps[t] = z;
    }
    Ok(())
}

/// The representable range of a quantized dtype.
fn quant_range(dtype: ScalarType) -> Result<(i64, i64), KernelError> {
    Ok(match dtype {
        ScalarType::Byte => (0, 255),
        ScalarType::Char => (-128, 127),
        ScalarType::UInt16 | ScalarType::Bits16 => (0, 65535),
        ScalarType::Short => (-32768, 32767),
        ScalarType::Int => (i32::MIN as i64, i32::MAX as i64),
        other => return Err(dtype_err(other, "quantized dtype")),
    })
}

/// `q = clamp(zp + round_half_even(x * (1 / scale_f32)), qmin, qmax)`.
#[inline(always)]
fn quantize_one(x: f32, inv_scale: f32, zp: i32, qmin: i64, qmax: i64) -> i64 {
    let q = (zp as f32 + (x * inv_scale).round_ties_even()) as i64;
    q.clamp(qmin, qmax)
}

fn check_quant_args(
    x: &Tensor,
    qmin: i64,
    qmax: i64,
    dtype: ScalarType,
    out: &Tensor,
) -> Result<(), KernelError> {
    if !is_float(x.dtype()) {
        return Err(dtype_err(x.dtype(), "quantize input (float)"));
    }
    require_dtype(out.dtype(), dtype)?;
    let (lo, hi) = quant_range(dtype)?;
    if qmin < lo || qmax > hi || qmin > qmax {
        return Err(KernelError::invalid(format!(
            "quant range [{qmin}, {qmax}] does not fit {dtype} ([{lo}, {hi}])"
        )));
    }
    require_contiguous(x, out, "quantize")
}

/// Per-row qparams: `scales` and `zero_points` hold one value per row (or one for all).
struct QParams<'a> {
    scales: In<'a>,
    zps: Option<In<'a>>,
    scale: f64,
    zp: i64,
}

impl QParams<'_> {
    /// One scale and zero point for every row.
    fn single(scale: f64, zp: i64) -> Self {
        QParams {
            scales: In::I64(&[]),
            zps: None,
            scale,
            zp,
        }
    }

    #[inline]
    fn row(&self, r: usize) -> (f64, i64) {
        if self.scales.is_empty() {
            return (self.scale, self.zp);
        }
        let s: f64 = self.scales.get(r);
        let z: i64 = self.zps.as_ref().map_or(0, |z| z.get(r));
        (s, z)
    }
}

/// A checked (de)quantization: `rows` rows of `len` values of `x` into `out`.
struct QuantJob<'a> {
    x: Tensor,
    out: Tensor,
    rows: usize,
    len: usize,
    qp: QParams<'a>,
    qmin: i64,
    qmax: i64,
}

impl QuantJob<'_> {
    /// Maps each row of `x` into `out` in blocks: `f(scale, zero_point, src, dst)`
    /// converts one block of a row with that row's qparams.
    #[inline(always)]
    fn map_rows<S: Element, D: Element>(
        &self,
        ctx: &KernelContext<'_>,
        what: &'static str,
        f: impl Fn(f64, i64, &[S], &mut [D]),
    ) -> Result<(), KernelError> {
        let (rows, len) = (self.rows, self.len);
        if rows == 0 || len == 0 {
            return Ok(());
        }
        let data = In::read(ctx, &self.x)?;
        let mut dst = Out::write(ctx, &self.out)?;
        if data.len() != rows * len || dst.len() != rows * len {
            return Err(storage_length_error(what));
        }
        let mut sb = [S::default(); BLOCK];
        let mut db = [D::default(); BLOCK];
        for r in 0..rows {
            let (s, z) = self.qp.row(r);
            for_each_block(0..len, |j, m| {
                data.load(r * len + j, 1, &mut sb[..m]);
                f(s, z, &sb[..m], &mut db[..m]);
                dst.store(r * len + j, 1, &db[..m]);
            });
        }
        Ok(())
    }
}

fn check_params(t: &Tensor, n: usize, what: &'static str, float: bool) -> Result<(), KernelError> {
    if t.numel() != n {
        return Err(KernelError::invalid(format!(
            "{what} has {} elements, expected {n}",
            t.numel()
        )));
    }
    let ok = if float {
        is_float(t.dtype())
    } else {
        t.dtype().is_integral()
    };
    if !ok {
        return Err(dtype_err(t.dtype(), what));
    }
    Ok(())
}

op_args! {
    /// `quantize_per_token.out(Tensor input, Tensor scales, Tensor zero_points,
    /// int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out)`.
    struct QuantizePerTokenArgs = "quantized_decomposed::quantize_per_token.out" {
        input: Tensor,
        scales: Tensor,
        zero_points: Tensor,
        quant_min: i64,
        quant_max: i64,
        dtype: ScalarType,
        out: OutArg,
    } returns 1
}

/// A per-tensor scale and zero point: numbers (`.out`) or one-element tensors
/// (`.tensor_out`).
// Tensor metadata is fixed-size and Copy; the value lives on the stack for one call.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy)]
enum TensorQParams {
    Numbers(f64, i64),
    Tensors(Tensor, Tensor),
}

impl TensorQParams {
    /// The scale and zero point as numbers.
    fn read(self, ctx: &KernelContext<'_>) -> Result<(f64, i64), KernelError> {
        match self {
            TensorQParams::Numbers(scale, zp) => Ok((scale, zp)),
            TensorQParams::Tensors(scale, zp) => {
                check_params(&scale, 1, "scale", true)?;
                check_params(&zp, 1, "zero_point", false)?;
                let s = In::read(ctx, &scale)?.get::<f64>(0);
                let z = In::read(ctx, &zp)?.get::<i64>(0);
                Ok((s, z))
            }
        }
    }
}

op_args! {
    /// `quantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min,
    /// int quant_max, ScalarType dtype, *, Tensor(a!) out)`.
    struct QuantizePerTensorArgs = "quantized_decomposed::quantize_per_tensor.out" {
        input: Tensor,
        scale: f64,
        zero_point: i64,
        quant_min: i64,
        quant_max: i64,
        dtype: ScalarType,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `quantize_per_tensor.tensor_out(Tensor input, Tensor scale, Tensor zero_point,
    /// int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out)`.
    struct QuantizePerTensorTensorArgs = "quantized_decomposed::quantize_per_tensor.tensor_out" {
        input: Tensor,
        scale: Tensor,
        zero_point: Tensor,
        quant_min: i64,
        quant_max: i64,
        dtype: ScalarType,
        out: OutArg,
    } returns 1
}

/// Where a (de)quantization finds its scale and zero point.
// Tensor metadata is fixed-size and Copy; the value lives on the stack for one call.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy)]
enum QParamsArg {
    /// One scale and zero point for the whole tensor.
    PerTensor(TensorQParams),
    /// `(scales, zero_points)`: one of each per token.
    PerToken(Tensor, Tensor),
}

impl QParamsArg {
    /// Reads one-element qparam tensors as numbers (ExecuTorch checks them before
    /// anything else); per-token qparams are read once the token count is known.
    fn read_per_tensor(self, ctx: &KernelContext<'_>) -> Result<Self, KernelError> {
        match self {
            QParamsArg::PerTensor(p) => {
                let (scale, zp) = p.read(ctx)?;
                Ok(QParamsArg::PerTensor(TensorQParams::Numbers(scale, zp)))
            }
            per_token => Ok(per_token),
        }
    }
}

/// The arguments of the (de)quantize schemas, in one form.
struct QuantArgs {
    input: Tensor,
    params: QParamsArg,
    quant_min: i64,
    quant_max: i64,
    dtype: ScalarType,
    /// The out dtype a dequantize schema names (none for quantize).
    out_dtype: Option<ScalarType>,
    out: OutArg,
}

args_form! {
    QuantArgs { input, quant_min, quant_max, dtype, out }:
    QuantizePerTokenArgs => |a| {
        params: QParamsArg::PerToken(a.scales, a.zero_points),
        out_dtype: None,
    };
    QuantizePerTensorArgs => |a| {
        params: QParamsArg::PerTensor(TensorQParams::Numbers(a.scale, a.zero_point)),
        out_dtype: None,
    };
    QuantizePerTensorTensorArgs => |a| {
        params: QParamsArg::PerTensor(TensorQParams::Tensors(a.scale, a.zero_point)),
        out_dtype: None,
    };
    DequantizePerTokenArgs => |a| {
        params: QParamsArg::PerToken(a.scales, a.zero_points),
        out_dtype: Some(a.output_dtype),
    };
    DequantizePerTensorArgs => |a| {
        params: QParamsArg::PerTensor(TensorQParams::Numbers(a.scale, a.zero_point)),
        out_dtype: a.out_dtype,
    };
    DequantizePerTensorTensorArgs => |a| {
        params: QParamsArg::PerTensor(TensorQParams::Tensors(a.scale, a.zero_point)),
        out_dtype: a.out_dtype,
    };
}

impl QuantArgs {
    /// Reads the qparams, resizes `out` like the input and checks the arguments (the
    /// dequantize checks when `dequantize`), in ExecuTorch's order.
    fn prepare<'c>(
        self,
        ctx: &'c KernelContext<'_>,
        a: &mut Args<'_>,
        dequantize: bool,
    ) -> Result<QuantJob<'c>, KernelError> {
        let (x, qmin, qmax) = (self.input, self.quant_min, self.quant_max);
        let params = self.params.read_per_tensor(ctx)?;
        let out = self.out.resize(a, x.sizes())?;
        if dequantize {
            check_dequant_args(&x, qmin, qmax, self.dtype, self.out_dtype, &out)?;
        } else {
            check_quant_args(&x, qmin, qmax, self.dtype, &out)?;
        }
        let (rows, len, qp) = match params {
            QParamsArg::PerTensor(p) => {
                let (scale, zp) = p.read(ctx)?;
                (1, x.numel(), QParams::single(scale, zp))
            }
            QParamsArg::PerToken(scales, zps) => {
                let (rows, len) = tokens(&x)?;
                check_params(&scales, rows, "per-token scales", true)?;
                check_params(&zps, rows, "per-token zero points", false)?;
                let qp = QParams {
                    scales: In::read(ctx, &scales)?,
                    zps: Some(In::read(ctx, &zps)?),
                    scale: 0.0,
                    zp: 0,
                };
                (rows, len, qp)
            }
        };
        Ok(QuantJob {
            x,
            out,
            rows,
            len,
            qp,
            qmin,
            qmax,
        })
    }
}

/// `quantize_per_{token,tensor}`, with the arguments of schema `S`:
/// `q = clamp(zp + round_half_even(x / scale), qmin, qmax)` per row.
fn quantize<S>(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError>
where
    S: for<'x> OpArgs<'x> + Into<QuantArgs>,
{
    let job = S::unpack(a)?.into().prepare(ctx, a, false)?;
    let (qmin, qmax) = (job.qmin, job.qmax);
    job.map_rows(ctx, "quantize", |s, z, src: &[f32], dst: &mut [i64]| {
        let inv = 1.0f32 / s as f32;
        let zp = z as i32;
        for (q, &v) in dst.iter_mut().zip(src) {
            *q = quantize_one(v, inv, zp, qmin, qmax);
        }
    })
}

fn check_dequant_args(
    x: &Tensor,
    qmin: i64,
    qmax: i64,
    dtype: ScalarType,
    out_dtype: Option<ScalarType>,
    out: &Tensor,
) -> Result<(), KernelError> {
    if !matches!(
        x.dtype(),
        ScalarType::Byte
            | ScalarType::Char
            | ScalarType::Short
            | ScalarType::Int
            | ScalarType::UInt16
    ) {
        return Err(dtype_err(x.dtype(), "dequantize input"));
    }
    require_dtype(x.dtype(), dtype)?;
    if let Some(d) = out_dtype {
        require_dtype(out.dtype(), d)?;
    }
    if !is_float(out.dtype()) {
        return Err(dtype_err(out.dtype(), "dequantize out (float)"));
    }
    require_ordered_range(qmin, qmax, "")?;
    require_contiguous(x, out, "dequantize")
}

op_args! {
    /// `dequantize_per_token.out(Tensor input, Tensor scales, Tensor zero_points,
    /// int quant_min, int quant_max, ScalarType dtype, ScalarType output_dtype, *,
    /// Tensor(a!) out)`.
    struct DequantizePerTokenArgs = "quantized_decomposed::dequantize_per_token.out" {
        input: Tensor,
        scales: Tensor,
        zero_points: Tensor,
        quant_min: i64,
        quant_max: i64,
        dtype: ScalarType,
        output_dtype: ScalarType,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `dequantize_per_tensor.out(Tensor input, float scale, int zero_point,
    /// int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None,
    /// Tensor(a!) out)`.
    struct DequantizePerTensorArgs = "quantized_decomposed::dequantize_per_tensor.out" {
        input: Tensor,
        scale: f64,
        zero_point: i64,
        quant_min: i64,
        quant_max: i64,
        dtype: ScalarType,
        out_dtype: Option<ScalarType>,
        out: OutArg,
    } returns 1
}

op_args! {
    /// `dequantize_per_tensor.tensor_out(Tensor input, Tensor scale, Tensor zero_point,
    /// int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None,
    /// Tensor(a!) out)`.
    struct DequantizePerTensorTensorArgs = "quantized_decomposed::dequantize_per_tensor.tensor_out" {
        input: Tensor,
        scale: Tensor,
        zero_point: Tensor,
        quant_min: i64,
        quant_max: i64,
        dtype: ScalarType,
        out_dtype: Option<ScalarType>,
        out: OutArg,
    } returns 1
}

/// `dequantize_per_{token,tensor}`, with the arguments of schema `S`:
/// `(q - zp) * scale` in f32 per row.
fn dequantize<S>(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError>
where
    S: for<'x> OpArgs<'x> + Into<QuantArgs>,
{
    let job = S::unpack(a)?.into().prepare(ctx, a, true)?;
    job.map_rows(ctx, "dequantize", |s, z, src: &[i64], dst: &mut [f32]| {
        let (scale, zp) = (s as f32, z as i32 as i64);
        for (f, &q) in dst.iter_mut().zip(src) {
            *f = (q - zp) as f32 * scale;
        }
    })
}

#[cfg(test)]
mod tests;
