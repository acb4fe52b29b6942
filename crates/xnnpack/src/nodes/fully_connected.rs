//! `FullyConnected`: `y[.., n] = clamp(x[.., k] · w[n, k] + bias)`, leading dims as
//! batch, in three forms:
//! - fp32: the filter packed at init for the shared GEMM of `etch-linalg` (or read at
//!   run time when it is a value; `XNN_FLAG_TRANSPOSE_WEIGHTS` for `[k, n]`);
//! - qdint8 x qbint4 / qcint4 / qcint8 (8da4w, 8da8w): the input quantized per token by
//!   a `Convert`, the weights packed at init (`etch_linalg::quant`), fp32 bias and
//!   output;
//! - qint8 x qcint8 -> qint8 (static int8): XNNPACK's requantization
//!   (`etch_linalg::quant::qs8`).

use etch_kernels::{BackendError, KernelError, ThreadPool};
use etch_linalg::quant::qd8_row_stride;
use etch_linalg::quant::qs8::{Qs8Requant, Qs8Rows, Qs8Weights, gemm_qs8_parallel};
use etch_linalg::quant::{Qd8Rows, Qd8Weights, gemm_qd8, gemm_qd8_scratch_len_for};
use etch_linalg::{GemmF32, PackedB, RhsF32, dispatch, gemm_f32, gemm_f32_rows_alone};

use crate::dims::Dims;
use crate::graph::{NodeDef, Quantization, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, clamp_of, int8, int8_mut, linalg, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::quantized::{int32_bias, requant, tensor_quant, touches_qint8};
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::plan_builder::{Bias, Builder, f32_view};
use crate::qd8_slot::{code_words, slot_len};
use crate::schema::{Datatype, FLAG_TRANSPOSE_WEIGHTS};

/// The weights of an fp32 fully connected node.
#[derive(Debug, Clone)]
pub enum Filter {
    /// Packed at init into the GEMM's panels (a decode step streams them whole).
    Packed(PackedB),
    /// A runtime value: `[n, k]`, or `[k, n]` when `transposed`.
    Value { v: usize, transposed: bool },
}

impl Filter {
    /// `(n, k)`: output and input channels.
    pub fn dims(&self, shapes: &[Dims]) -> (usize, usize) {
        match self {
            Filter::Packed(p) => (p.n(), p.k()),
            Filter::Value { v, transposed } => {
                let d = shapes.get(*v).copied().unwrap_or_default();
                let (a, b) = (d.get(0), d.get(1));
                if *transposed { (b, a) } else { (a, b) }
            }
        }
    }

    /// The GEMM's right-hand side: the packed panels, or `value` (the filter's elements
    /// at run time) in its layout.
    pub fn rhs<'a>(&'a self, value: &'a [f32]) -> RhsF32<'a> {
        match self {
            Filter::Packed(p) => RhsF32::Packed(p),
            Filter::Value {
                transposed: false, ..
            } => RhsF32::NK(value),
            Filter::Value {
                transposed: true, ..
            } => RhsF32::KN(value),
        }
    }
}

/// The weights and arithmetic of a fully connected node.
#[derive(Debug, Clone)]
pub enum Weights {
    /// fp32 input, weights and output.
    F32 {
        filter: Filter,
        bias: Bias,
        min: f32,
        max: f32,
    },
    /// qdint8 input, 4- or 8-bit weights, fp32 output.
    Qd8 {
        w: Qd8Weights,
        bias: Bias,
        min: f32,
        max: f32,
    },
    /// qint8 input and output, qcint8 weights (the bias packed with them).
    Int8 { w: Qs8Weights, rq: Qs8Requant },
}

/// A fully connected node.
#[derive(Debug, Clone)]
pub struct FullyConnected {
    x: usize,
    y: usize,
    weights: Weights,
}

/// Reads a `FullyConnected` node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    node.inputs = vec![
        Some(r.value(0, "input1_id")?),
        Some(r.value(1, "filter_id")?),
        r.opt_value(2, "bias_id")?,
    ];
    node.outputs = vec![r.value(3, "output_id")?];
    node.flags = r.flags(4, FLAG_TRANSPOSE_WEIGHTS)?;
    Ok(())
}

/// Plans a `FullyConnected` node: its weights packed, in the form its datatypes say.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<FullyConnected, BackendError> {
    let x = node.inputs.first().copied().flatten().unwrap_or(0);
    let weights = if touches_qint8(&b.graph.values, node) {
        int8_weights(b, i, node)?
    } else if b.graph.values[x].datatype == Datatype::QdInt8 {
        qd8_weights(b, i, node)?
    } else {
        f32_weights(b, i, node)?
    };
    Ok(FullyConnected {
        x: b.input(node, 0),
        y: b.output(node),
        weights,
    })
}

fn f32_weights(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Weights, BackendError> {
    let fv = node.inputs.get(1).copied().flatten().unwrap_or(0);
    let transposed = node.flags & FLAG_TRANSPOSE_WEIGHTS != 0;
    let fd = b.graph.values[fv].dims;
    if fd.rank() != 2 {
        return Err(invalid(
            b.field(i, node, "filter_id"),
            format!("filter dims {fd:?} are not 2-D"),
        ));
    }
    let (n, k) = if transposed {
        (fd.get(1), fd.get(0))
    } else {
        (fd.get(0), fd.get(1))
    };
    let filter = match b.constant(fv) {
        Some(bytes) => {
            // Stored `[k, n]` when transposed, else `[n, k]`.
            let p = PackedB::pack(dispatch().gemm, &f32_view(bytes), n, k, !transposed)
                .map_err(|e| invalid(b.field(i, node, "filter_id"), e.to_string()))?;
            b.packed_bytes += p.packed_bytes();
            Filter::Packed(p)
        }
        None => Filter::Value {
            v: b.operand(fv),
            transposed,
        },
    };
    let bias = b.bias(i, node, n)?;
    Ok(Weights::F32 {
        filter,
        bias,
        min: node.output_min,
        max: node.output_max,
    })
}

fn qd8_weights(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Weights, BackendError> {
    let fv = node.inputs.get(1).copied().flatten().unwrap_or(0);
    let def = &b.graph.values[fv];
    let (n, k) = (def.dims.get(0), def.dims.get(1));
    let bytes = def.constant.as_deref().unwrap_or(&[]);
    let field = b.field(i, node, "filter_id");
    let packed = match (&def.quant, def.datatype) {
        (Some(Quantization::PerChannel { scales, .. }), Datatype::QcInt8) => {
            let values: Vec<i8> = bytes.iter().map(|&b| b as i8).collect();
            Qd8Weights::from_int8(n, k, &values, scales)
        }
        (Some(Quantization::PerChannel { scales, .. }), _) => {
            // Two 4-bit codes per byte, low nibble first, rows of ceil(k / 2)
            // bytes, stored as q + 8 (weight zero point 8).
            Qd8Weights::from_int4_nibbles(n, k, k.max(1), scales, bytes)
        }
        (
            Some(Quantization::PerChannelGroup {
                group_size,
                scales_bf16,
                ..
            }),
            _,
        ) => {
            let scales: Vec<f32> = scales_bf16
                .iter()
                .map(|&b| f32::from_bits(u32::from(b) << 16))
                .collect();
            Qd8Weights::from_int4_nibbles(n, k, *group_size, &scales, bytes)
        }
        _ => {
            return Err(invalid(
                field,
                "quantized filter without quantization parameters",
            ));
        }
    };
    let w = packed.map_err(|e| invalid(field, e.to_string()))?;
    b.packed_bytes += w.packed_bytes();
    let bias = b.bias(i, node, n)?;
    Ok(Weights::Qd8 {
        w,
        bias,
        min: node.output_min,
        max: node.output_max,
    })
}

fn int8_weights(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Weights, BackendError> {
    let input = |k: usize| node.inputs.get(k).copied().flatten().unwrap_or(0);
    let fv = input(1);
    let fd = b.graph.values[fv].dims;
    if fd.rank() != 2 {
        return Err(invalid(
            b.field(i, node, "filter_id"),
            format!("filter dims {fd:?} are not 2-D"),
        ));
    }
    let (n, k) = (fd.get(0), fd.get(1));
    let qx = tensor_quant(b, i, node, input(0), "input1_id")?;
    let qy = tensor_quant(b, i, node, b.output(node), "output_id")?;
    let rq = requant(b, i, node, qx, qy, n)?;
    let bias = int32_bias(b, i, node, n)?;
    let filter = bytemuck::cast_slice::<u8, i8>(b.constant(fv).unwrap_or(&[]));
    let w = Qs8Weights::new(n, k, filter, Some(&bias), qx.zero_point)
        .map_err(|e| invalid(b.field(i, node, "filter_id"), e.to_string()))?;
    b.packed_bytes += w.packed_bytes();
    Ok(Weights::Int8 { w, rq })
}

impl FullyConnected {
    /// `(n, k)`: output and input channels.
    fn channels(&self, shapes: &[Dims]) -> (usize, usize) {
        match &self.weights {
            Weights::F32 { filter, .. } => filter.dims(shapes),
            Weights::Qd8 { w, .. } => (w.n(), w.k()),
            Weights::Int8 { w, .. } => (w.n(), w.k()),
        }
    }

    /// Rows of the product at `shapes`: the input's elements over `k`.
    fn rows(&self, shapes: &[Dims], k: usize) -> usize {
        shapes[self.x]
            .numel()
            .unwrap_or(0)
            .checked_div(k)
            .unwrap_or(0)
    }
}

impl NodeOp for FullyConnected {
    fn inputs(&self) -> Inputs {
        match &self.weights {
            Weights::F32 { filter, bias, .. } => {
                let filter = match filter {
                    Filter::Value { v, .. } => Some(*v),
                    Filter::Packed(_) => None,
                };
                let bias = match bias {
                    Bias::Value(v) => Some(*v),
                    _ => None,
                };
                let mut inputs = Inputs::new(&[self.x]);
                filter.into_iter().chain(bias).for_each(|v| inputs.push(v));
                inputs
            }
            Weights::Qd8 {
                bias: Bias::Value(v),
                ..
            } => Inputs::new(&[self.x, *v]),
            Weights::Qd8 { .. } | Weights::Int8 { .. } => Inputs::new(&[self.x]),
        }
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let (n, k) = self.channels(shapes);
        let xd = get(shapes, self.x);
        if xd.rank() == 0 || xd.get(xd.rank() - 1) != k {
            return Err("input's last dimension differs from the filter's input channels");
        }
        let mut d = xd;
        d.as_mut_slice()[xd.rank() - 1] = n;
        set(shapes, self.y, d);
        Ok(())
    }

    fn gemm_scratch_len(&self, shapes: &[Dims], threads: usize) -> usize {
        let (n, k) = self.channels(shapes);
        let m = self.rows(shapes, k);
        match &self.weights {
            Weights::F32 { filter, .. } => fc_gemm(
                m,
                n,
                k,
                &[],
                filter.rhs(&[]),
                None,
                f32::NEG_INFINITY,
                f32::INFINITY,
            )
            .scratch_len(threads),
            Weights::Qd8 { w, .. } => gemm_qd8_scratch_len_for(m, w, threads),
            Weights::Int8 { .. } => 0,
        }
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let (n, k) = self.channels(call.shapes);
        let m = self.rows(call.shapes, k);
        let (pool, ins, out) = (call.pool, call.inputs, call.output);
        let mut scratch = call.scratch;
        let (_, gemm) = scratch.parts();
        match &self.weights {
            Weights::F32 {
                filter,
                bias,
                min,
                max,
            } => {
                let value = match filter {
                    Filter::Value { .. } => ins[2],
                    Filter::Packed(_) => ins[1],
                };
                let bias = bias_of(bias, value);
                let g = fc_gemm(m, n, k, ins[0], filter.rhs(ins[1]), bias, *min, *max);
                let need = g.scratch_len(pool.threads());
                let gemm = gemm
                    .get_mut(..need)
                    .ok_or_else(|| short("fully connected scratch"))?;
                let out = out
                    .get_mut(..m * n)
                    .ok_or_else(|| short("fully connected"))?;
                Ok(gemm_f32(pool, &g, out, gemm)?)
            }
            Weights::Qd8 { w, bias, min, max } => {
                let bias = bias_of(bias, ins[1]);
                fully_connected_qd8(pool, m, w, ins[0], bias, (*min, *max), out, gemm)
            }
            Weights::Int8 { w, rq } => {
                let x = int8(ins[0])
                    .get(..m * k)
                    .ok_or_else(|| short("fully connected"))?;
                let out = int8_mut(out)
                    .get_mut(..m * n)
                    .ok_or_else(|| short("fully connected"))?;
                let rows = Qs8Rows {
                    m,
                    stride: k,
                    data: x,
                };
                gemm_qs8_parallel(pool, &rows, w, rq, out, n).map_err(linalg)
            }
        }
    }
}

/// Several sessions' rows through one node in one pass over its weights (the
/// runtime's batched step, `crate::batch`): the rows stacked in the input's layout,
/// run once, the outputs handed back row block by row block. Each session gets the
/// bits it gets alone: the qd8 GEMM computes every row on its own whatever the row
/// count (the per-token quantization is the `Convert` node's, run per session); the
/// fp32 GEMM orders its sums differently once it has more than one row, so fp32 nodes
/// share a pass only when every session has one row, through
/// `etch_linalg::gemm_f32_rows_alone`.
impl FullyConnected {
    /// Rows of the product in a call at `shapes`.
    pub fn call_rows(&self, shapes: &[Dims]) -> usize {
        let (_, k) = self.channels(shapes);
        self.rows(shapes, k)
    }

    /// `(n, k)` when the weights are constants packed at init (the same for every
    /// session) and the bias is not a run-time value; `None` otherwise.
    fn shared_channels(&self) -> Option<(usize, usize)> {
        match &self.weights {
            Weights::F32 {
                filter: Filter::Packed(p),
                bias: Bias::None | Bias::Packed(_),
                ..
            } => Some((p.n(), p.k())),
            Weights::Qd8 {
                w,
                bias: Bias::None | Bias::Packed(_),
                ..
            } => Some((w.n(), w.k())),
            _ => None,
        }
    }

    /// Whether sessions with `rows[i]` rows each can share one pass and each get what
    /// it gets alone.
    pub fn can_stack(&self, rows: &[usize]) -> bool {
        let fits = |f32_rows: bool| rows.len() > 1 && (!f32_rows || rows.iter().all(|&r| r == 1));
        match (&self.weights, self.shared_channels()) {
            (Weights::F32 { .. }, Some(_)) => fits(true),
            (Weights::Qd8 { .. }, Some(_)) => fits(false),
            _ => false,
        }
    }

    /// f32 words of the stacked input of `rows` rows: f32 rows, or a qdint8 slot.
    pub fn stacked_input_len(&self, rows: usize) -> usize {
        let k = self.shared_channels().map_or(0, |(_, k)| k);
        match &self.weights {
            Weights::Qd8 { .. } => slot_len(rows, k).unwrap_or(usize::MAX),
            _ => rows.saturating_mul(k),
        }
    }

    /// Outputs (f32) of `rows` stacked rows.
    pub fn stacked_output_len(&self, rows: usize) -> usize {
        rows.saturating_mul(self.shared_channels().map_or(0, |(n, _)| n))
    }

    /// Copies one session's `rows` input rows (`src`, in the input's arena layout) into
    /// the stacked input of `total` rows from row `first` on.
    pub fn stack_input(
        &self,
        (first, rows, total): (usize, usize, usize),
        src: &[f32],
        stacked: &mut [f32],
    ) -> Result<(), KernelError> {
        let (_, k) = self
            .shared_channels()
            .ok_or_else(|| short("stacked rows"))?;
        let too_short = || short("stacked fully connected input");
        if let Weights::Qd8 { .. } = &self.weights {
            let stride = qd8_row_stride(k);
            let (src_words, words) = (
                code_words(rows, k).ok_or_else(too_short)?,
                code_words(total, k).ok_or_else(too_short)?,
            );
            let (codes, params) = stacked.split_at_mut(words);
            let from = int8(src.get(..src_words).ok_or_else(too_short)?)
                .get(..rows * stride)
                .ok_or_else(too_short)?;
            int8_mut(codes)
                .get_mut(first * stride..(first + rows) * stride)
                .ok_or_else(too_short)?
                .copy_from_slice(from);
            let src_params = src
                .get(src_words..src_words + 2 * rows)
                .ok_or_else(too_short)?;
            params
                .get_mut(2 * first..2 * (first + rows))
                .ok_or_else(too_short)?
                .copy_from_slice(src_params);
        } else {
            stacked
                .get_mut(first * k..(first + rows) * k)
                .zip(src.get(..rows * k))
                .map(|(d, s)| d.copy_from_slice(s))
                .ok_or_else(too_short)?;
        }
        Ok(())
    }

    /// GEMM scratch of a stacked run of `rows` rows on `threads` threads.
    pub fn stacked_scratch_len(&self, rows: usize, threads: usize) -> usize {
        match &self.weights {
            Weights::F32 { filter, .. } => {
                let (n, k) = self.shared_channels().unwrap_or((0, 0));
                let g = fc_gemm(rows, n, k, &[], filter.rhs(&[]), None, 0.0, 0.0);
                g.rows_alone_scratch_len(threads)
            }
            Weights::Qd8 { w, .. } => gemm_qd8_scratch_len_for(rows, w, threads),
            Weights::Int8 { .. } => 0,
        }
    }

    /// Runs the node once over `rows` stacked rows (`x`, see [`Self::stack_input`])
    /// into `out` (`rows * n`, row-major).
    pub fn run_stacked(
        &self,
        pool: &ThreadPool,
        rows: usize,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut [f32],
    ) -> Result<(), KernelError> {
        let (n, k) = self
            .shared_channels()
            .ok_or_else(|| short("stacked rows"))?;
        match &self.weights {
            Weights::F32 {
                filter,
                bias,
                min,
                max,
            } => {
                // No run-time bias here (`shared_channels`).
                let bias = bias_of(bias, &[]);
                let g = fc_gemm(rows, n, k, x, filter.rhs(&[]), bias, *min, *max);
                Ok(gemm_f32_rows_alone(pool, &g, out, scratch)?)
            }
            Weights::Qd8 { w, bias, min, max } => {
                // No run-time bias here (`shared_channels`).
                let bias = bias_of(bias, &[]);
                fully_connected_qd8(pool, rows, w, x, bias, (*min, *max), out, scratch)
            }
            Weights::Int8 { .. } => Err(short("stacked rows")),
        }
    }
}

/// The bias to add: none, the one packed at init, or `value` (its elements in this call)
/// for a run-time value.
fn bias_of<'a>(bias: &'a Bias, value: &'a [f32]) -> Option<&'a [f32]> {
    match bias {
        Bias::None => None,
        Bias::Packed(b) => Some(b),
        Bias::Value(_) => Some(value),
    }
}

/// `x[m, k] . w[n, k] + bias`, clamped to `[min, max]`, as a product of the shared GEMM
/// (matrix-vector rows split over output columns for decode, the packed micro-kernel
/// for prefill).
#[allow(clippy::too_many_arguments)]
fn fc_gemm<'a>(
    m: usize,
    n: usize,
    k: usize,
    x: &'a [f32],
    w: RhsF32<'a>,
    bias: Option<&'a [f32]>,
    min: f32,
    max: f32,
) -> GemmF32<'a> {
    GemmF32 {
        m,
        n,
        k,
        a: x,
        lda: k,
        b: w,
        bias,
        clamp: clamp_of(min, max),
    }
}

/// qdint8 x quantized weights, `m` rows: `x` is a qdint8 slot (see `crate::qd8_slot`).
#[allow(clippy::too_many_arguments)]
fn fully_connected_qd8(
    pool: &ThreadPool,
    m: usize,
    w: &Qd8Weights,
    x: &[f32],
    bias: Option<&[f32]>,
    (min, max): (f32, f32),
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), KernelError> {
    let words = code_words(m, w.k()).ok_or_else(|| short("quantized fully connected"))?;
    if x.len() < words + 2 * m {
        return Err(short("quantized fully connected"));
    }
    let (codes, params) = x.split_at(words);
    let rows = Qd8Rows {
        m,
        q: int8(codes),
        params: &params[..2 * m],
    };
    let need = gemm_qd8_scratch_len_for(m, w, pool.threads());
    let scratch = scratch
        .get_mut(..need)
        .ok_or_else(|| short("GEMM scratch"))?;
    gemm_qd8(pool, &rows, w, bias, (min, max), out, scratch).map_err(linalg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::convert::quantize_rows;

    #[test]
    fn quantized_product_approximates_the_float_one() {
        let k = 64;
        let x: Vec<f32> = (0..k).map(|i| (i as f32 - 30.0) / 17.0).collect();
        let mut slot = vec![0f32; slot_len(1, k).unwrap()];
        quantize_rows(k, &x, &mut slot).unwrap();
        let values: Vec<i8> = (0..2 * k).map(|i| ((i * 5) % 15) as i8 - 8).collect();
        let scales = [0.01f32, 0.02, 0.03, 0.04];
        let w =
            Qd8Weights::from_int4(2, k, 32, &scales, |j, c| (values[j * k + c] + 8) as u8).unwrap();
        let mut out = [0f32; 2];
        let mut scratch = vec![0f32; etch_linalg::quant::gemm_qd8_scratch_len(1, &w)];
        fully_connected_qd8(
            &ThreadPool::serial(),
            1,
            &w,
            &slot,
            Some(&[0.5, -0.5]),
            (f32::NEG_INFINITY, f32::INFINITY),
            &mut out,
            &mut scratch,
        )
        .unwrap();
        for j in 0..2 {
            let want: f32 = (0..k)
                .map(|c| x[c] * values[j * k + c] as f32 * scales[j * 2 + c / 32])
                .sum::<f32>()
                + [0.5, -0.5][j];
            assert!((out[j] - want).abs() < 0.02, "{out:?} vs {want}");
        }
    }
}
