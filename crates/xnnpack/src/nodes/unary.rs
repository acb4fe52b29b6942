//! The elementwise nodes of one input: `Abs`, `Ceiling`, `Clamp`, `Cos`, `ELU`, `Exp`,
//! `Floor`, `Gelu`, `Hardswish`, `LeakyReLU`, `Log`, `Negate`, `ReciprocalSquareRoot`,
//! `Sigmoid`, `Sin`, `Square`, `SquareRoot`, `Tanh` on fp32 values, and `Clamp` on
//! qint8 values (bounds quantized as `xnn_init_qs8_clamp_scalar_params` does; input and
//! output share their quantization).

use etch_kernels::{BackendError, KernelError};

use crate::dims::Dims;
use crate::graph::{NodeDef, Params, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{Inputs, NodeCall, elementwise_tasks, int8, int8_mut, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::quantized::{output_bounds, tensor_quant};
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::plan_builder::Builder;
use crate::schema::NodeKind;

/// An elementwise function of one fp32 input.
#[derive(Debug, Clone, Copy, PartialEq)]
#[allow(missing_docs)]
pub enum UnaryFunction {
    Abs,
    Ceiling,
    Clamp,
    Cos,
    Elu(f32),
    Exp,
    Floor,
    Gelu,
    Hardswish,
    LeakyRelu(f32),
    Log,
    Negate,
    ReciprocalSquareRoot,
    Sigmoid,
    Sin,
    Square,
    SquareRoot,
    Tanh,
}

/// What a unary node computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryKind {
    /// `f` on fp32 values, clamped to `[min, max]` by `Clamp` only.
    F32 {
        f: UnaryFunction,
        min: f32,
        max: f32,
    },
    /// `Clamp` of qint8 values to quantized bounds.
    Int8Clamp { min: i8, max: i8 },
}

/// A unary node.
#[derive(Debug, Clone)]
pub struct Unary {
    x: usize,
    y: usize,
    kind: UnaryKind,
}

/// Reads a unary node (`ELU` and `LeakyReLU` carry their scalar).
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    match r.kind {
        NodeKind::ELU | NodeKind::LeakyReLU => {
            let name = if r.kind == NodeKind::ELU {
                "alpha"
            } else {
                "negative_slope"
            };
            node.params = Params::Scalar(r.f32(0, name)?);
            r.one_input(node, 1, 0)
        }
        _ => r.one_input(node, 0, 0),
    }
}

/// Plans a unary node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Unary, BackendError> {
    use NodeKind::*;
    let y = b.output(node);
    if node.kind == Clamp && b.is_int8(y) {
        let (min, max) = output_bounds(node, tensor_quant(b, i, node, y, "output_id")?);
        return Ok(Unary {
            x: b.input(node, 0),
            y,
            kind: UnaryKind::Int8Clamp { min, max },
        });
    }
    let f = match node.kind {
        Abs => UnaryFunction::Abs,
        Ceiling => UnaryFunction::Ceiling,
        Clamp => UnaryFunction::Clamp,
        Cos => UnaryFunction::Cos,
        Exp => UnaryFunction::Exp,
        Floor => UnaryFunction::Floor,
        Gelu => UnaryFunction::Gelu,
        Hardswish => UnaryFunction::Hardswish,
        Log => UnaryFunction::Log,
        Negate => UnaryFunction::Negate,
        ReciprocalSquareRoot => UnaryFunction::ReciprocalSquareRoot,
        Sigmoid => UnaryFunction::Sigmoid,
        Sin => UnaryFunction::Sin,
        Square => UnaryFunction::Square,
        SquareRoot => UnaryFunction::SquareRoot,
        Tanh => UnaryFunction::Tanh,
        ELU | LeakyReLU => {
            let Params::Scalar(s) = node.params else {
                return Err(invalid(b.field(i, node, "params"), "missing"));
            };
            if node.kind == ELU {
                UnaryFunction::Elu(s)
            } else {
                UnaryFunction::LeakyRelu(s)
            }
        }
        other => {
            return Err(invalid(
                b.field(i, node, "kind"),
                format!("{} is not a unary node", other.name()),
            ));
        }
    };
    Ok(Unary {
        x: b.input(node, 0),
        y,
        kind: UnaryKind::F32 {
            f,
            min: node.output_min,
            max: node.output_max,
        },
    })
}

impl NodeOp for Unary {
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
        let (x, out, pool) = (call.inputs[0], call.output, call.pool);
        match self.kind {
            UnaryKind::F32 { f, min, max } if x.len() >= out.len() => {
                let step = out.len().div_ceil(elementwise_tasks(pool, out.len()));
                pool.for_each_chunk_mut(out, step, 1, |i, chunk| {
                    let x = &x[i * step..][..chunk.len()];
                    unary(f, min, max, x, chunk)
                });
            }
            UnaryKind::F32 { f, min, max } => unary(f, min, max, x, out),
            UnaryKind::Int8Clamp { min, max } => {
                let n = call.shapes[self.x].numel().unwrap_or(0);
                let x = int8(x).get(..n).ok_or_else(|| short("clamp"))?;
                let out = int8_mut(out).get_mut(..n).ok_or_else(|| short("clamp"))?;
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = v.clamp(min, max);
                }
            }
        }
        Ok(())
    }
}

/// `out[i] = f(x[i])`; `Clamp` clamps to `[min, max]`.
fn unary(f: UnaryFunction, min: f32, max: f32, x: &[f32], out: &mut [f32]) {
    let map = |out: &mut [f32], g: &dyn Fn(f32) -> f32| {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = g(v);
        }
    };
    match f {
        UnaryFunction::Abs => map(out, &|v| v.abs()),
        UnaryFunction::Ceiling => map(out, &|v| v.ceil()),
        UnaryFunction::Clamp => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v.max(min).min(max);
            }
        }
        UnaryFunction::Cos => map(out, &|v| v.cos()),
        UnaryFunction::Elu(alpha) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = if v > 0.0 { v } else { alpha * v.exp_m1() };
            }
        }
        UnaryFunction::Exp => map(out, &|v| v.exp()),
        UnaryFunction::Floor => map(out, &|v| v.floor()),
        UnaryFunction::Gelu => map(out, &|v| {
            0.5 * v * (1.0 + libm::erff(v * std::f32::consts::FRAC_1_SQRT_2))
        }),
        UnaryFunction::Hardswish => map(out, &|v| v * ((v + 3.0).clamp(0.0, 6.0) / 6.0)),
        UnaryFunction::LeakyRelu(slope) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = if v >= 0.0 { v } else { v * slope };
            }
        }
        UnaryFunction::Log => map(out, &|v| v.ln()),
        UnaryFunction::Negate => map(out, &|v| -v),
        UnaryFunction::ReciprocalSquareRoot => {
            etch_linalg::approx::rsqrt(etch_linalg::dispatch().elementwise, x, out)
        }
        UnaryFunction::Sigmoid => {
            etch_linalg::approx::sigmoid(etch_linalg::dispatch().elementwise, x, out)
        }
        UnaryFunction::Sin => map(out, &|v| v.sin()),
        UnaryFunction::Square => map(out, &|v| v * v),
        UnaryFunction::SquareRoot => map(out, &|v| v.sqrt()),
        UnaryFunction::Tanh => map(out, &|v| v.tanh()),
    }
}
