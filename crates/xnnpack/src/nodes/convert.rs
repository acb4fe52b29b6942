//! `Convert`: fp32 -> qdint8 per token (the dynamically quantized linear layers of
//! 8da4w / 8da8w exports, XNNPACK's arithmetic in `etch_linalg::quant`), fp32 -> qint8
//! and qint8 -> fp32 (the edges of a static int8 graph), fp32 -> qdint8 per image for
//! dynamically quantized convolutions (rounded through int8 and kept in fp32), and
//! fp32 -> fp32 (a copy).

use etch_kernels::{BackendError, KernelError};
use etch_linalg::quant::qs8::{dequantize_qs8, quantize_qs8};
use etch_linalg::quant::{qd8_params, quantize_qd8};

use crate::dims::Dims;
use crate::graph::{NodeDef, Quantization};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, int8, int8_mut, linalg, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::quantized::tensor_quant;
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::plan_builder::Builder;
use crate::qd8_slot::code_words;
use crate::schema::Datatype;

/// Which conversion a `Convert` node makes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Conversion {
    /// fp32 -> qdint8: per-row dynamic quantization of rows of the trailing `row_dims`
    /// dims (the value's num_nonbatch_dims).
    ToQd8 { row_dims: usize },
    /// fp32 -> qint8 (`1 / scale` computed once in f32, as
    /// `xnn_init_f32_qs8_cvt_scalar_params`).
    ToInt8 { inv_scale: f32, zero_point: i32 },
    /// qint8 -> fp32.
    FromInt8 { scale: f32, zero_point: i32 },
    /// fp32 -> qdint8 read only by convolutions, which compute in fp32: each row of the
    /// trailing `row_dims` dims rounded through int8 with its dynamic parameters.
    RoundTripQd8 { row_dims: usize },
    /// fp32 -> fp32.
    Copy,
}

/// A convert node.
#[derive(Debug, Clone)]
pub struct Convert {
    x: usize,
    y: usize,
    conversion: Conversion,
}

/// Reads a `Convert` node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    r.one_input(node, 0, 0)
}

/// Plans a `Convert` node from the datatypes of its input and output.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Convert, BackendError> {
    let x = node.inputs.first().copied().flatten().unwrap_or(0);
    let y = b.output(node);
    let output = &b.graph.values[y];
    let conversion = if let Some(row_dims) = output.qd8_round_trip {
        Conversion::RoundTripQd8 { row_dims }
    } else if output.datatype == Datatype::QdInt8 {
        let row_dims = match output.quant {
            Some(Quantization::PerTokenDynamic { num_nonbatch_dims }) => num_nonbatch_dims.max(1),
            _ => 1,
        };
        Conversion::ToQd8 { row_dims }
    } else if b.is_int8(y) {
        let q = tensor_quant(b, i, node, y, "output_id")?;
        Conversion::ToInt8 {
            inv_scale: 1.0 / q.scale,
            zero_point: q.zero_point,
        }
    } else if b.is_int8(x) {
        let q = tensor_quant(b, i, node, x, "input_id")?;
        Conversion::FromInt8 {
            scale: q.scale,
            zero_point: q.zero_point,
        }
    } else {
        Conversion::Copy
    };
    Ok(Convert {
        x: b.input(node, 0),
        y,
        conversion,
    })
}

impl NodeOp for Convert {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.x])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        set(shapes, self.y, get(shapes, self.x));
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let d = call.shapes[self.x];
        let n = d.numel().unwrap_or(0);
        let (x, out) = (call.inputs[0], call.output);
        match self.conversion {
            Conversion::ToQd8 { row_dims } => {
                // One row per token: the trailing dims (1 for linear layers).
                let row = d.product(d.rank().saturating_sub(row_dims)..d.rank());
                quantize_rows(row, x, out)?
            }
            Conversion::RoundTripQd8 { row_dims } => {
                let row = d.product(d.rank().saturating_sub(row_dims)..d.rank());
                let x = x.get(..n).ok_or_else(|| short("convert"))?;
                let out = out.get_mut(..n).ok_or_else(|| short("convert"))?;
                round_trip_rows(row, x, out);
            }
            Conversion::ToInt8 {
                inv_scale,
                zero_point,
            } => {
                let x = x.get(..n).ok_or_else(|| short("convert"))?;
                let out = int8_mut(out).get_mut(..n).ok_or_else(|| short("convert"))?;
                quantize_qs8(x, inv_scale, zero_point, out);
            }
            Conversion::FromInt8 { scale, zero_point } => {
                let x = int8(x).get(..n).ok_or_else(|| short("convert"))?;
                let out = out.get_mut(..n).ok_or_else(|| short("convert"))?;
                dequantize_qs8(x, scale, zero_point, out);
            }
            Conversion::Copy => {
                let x = x.get(..out.len()).ok_or_else(|| short("copy"))?;
                out.copy_from_slice(x);
            }
        }
        Ok(())
    }
}

/// Rounds each row of `row` values of `x` through int8 with the row's dynamic qd8
/// parameters, as the integer product sees them: `(q - zero point) / scale`.
fn round_trip_rows(row: usize, x: &[f32], out: &mut [f32]) {
    if row == 0 {
        return;
    }
    for (xs, ys) in x.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
        let (lo, hi) = xs
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            });
        let (scale, zp) = qd8_params(lo, hi);
        let inv_scale = 1.0 / scale;
        for (y, &v) in ys.iter_mut().zip(xs) {
            let q = ((v * scale).round_ties_even() + zp).clamp(-128.0, 127.0);
            *y = (q - zp) * inv_scale;
        }
    }
}

/// fp32 -> qdint8: quantizes rows of `row` values of `x` into the slot `out` (see
/// `crate::qd8_slot` for its layout).
pub fn quantize_rows(row: usize, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    if row == 0 {
        return Ok(());
    }
    let rows = x.len() / row;
    let words = code_words(rows, row).ok_or_else(|| short("quantize"))?;
    if out.len() < words + 2 * rows {
        return Err(short("quantize"));
    }
    let (codes, params) = out.split_at_mut(words);
    quantize_qd8(x, row, int8_mut(codes), params).map_err(linalg)
}
