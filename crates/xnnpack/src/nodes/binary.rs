//! The elementwise nodes of two broadcast inputs: `Add`, `Subtract`, `Multiply`, `Div`,
//! `Minimum`, `Maximum`, `PReLU` on fp32 values (the arithmetic ones on the vector loops
//! of `etch_linalg::elementwise`, split over the pool), and `Add` and `Multiply` on
//! qint8 values with XNNPACK's fixed-point arithmetic (`binary_int8`).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use etch_kernels::{BackendError, KernelError, ThreadPool};
use etch_linalg::elementwise::{self, Arithmetic};

use crate::dims::Dims;
use crate::graph::{NodeDef, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::binary_int8::{Int8AddParams, Int8MultiplyParams};
use crate::nodes::broadcast::{BroadcastOperands, binary_with, for_each_operand_run};
use crate::nodes::call::{Inputs, NodeCall, checked, elementwise_tasks, int8, int8_mut, short};
use crate::nodes::node_op::NodeOp;
use crate::nodes::quantized::{output_bounds, tensor_quant};
use crate::nodes::shapes::{ShapeResult, broadcast, get, set};
use crate::plan_builder::Builder;
use crate::schema::NodeKind;

/// An elementwise function of two broadcast fp32 inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum BinaryFunction {
    Add,
    Subtract,
    Multiply,
    Divide,
    Minimum,
    Maximum,
    /// `x >= 0 ? x : x * slope`, the slope broadcast like a second operand.
    PRelu,
}

/// What a binary node computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BinaryKind {
    /// `clamp(f(a, b), min, max)` on fp32 values.
    F32 {
        f: BinaryFunction,
        min: f32,
        max: f32,
    },
    /// `Add` of qint8 values.
    Int8Add(Int8AddParams),
    /// `Multiply` of qint8 values.
    Int8Multiply(Int8MultiplyParams),
}

/// A binary node.
#[derive(Debug, Clone)]
pub struct Binary {
    a: usize,
    b: usize,
    y: usize,
    kind: BinaryKind,
}

/// Reads a binary node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    node.inputs = vec![
        Some(r.value(0, "input1_id")?),
        Some(r.value(1, "input2_id")?),
    ];
    node.outputs = vec![r.value(2, "output_id")?];
    node.flags = r.flags(3, 0)?;
    Ok(())
}

/// Plans a binary node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Binary, BackendError> {
    use NodeKind::*;
    let y = b.output(node);
    let kind = if b.is_int8(y) {
        int8_kind(b, i, node)?
    } else {
        let f = match node.kind {
            Add => BinaryFunction::Add,
            Subtract => BinaryFunction::Subtract,
            Multiply => BinaryFunction::Multiply,
            Div => BinaryFunction::Divide,
            Minimum => BinaryFunction::Minimum,
            Maximum => BinaryFunction::Maximum,
            _ => BinaryFunction::PRelu,
        };
        // Minimum, Maximum and PReLU carry no output range upstream.
        let (min, max) = match f {
            BinaryFunction::Minimum | BinaryFunction::Maximum | BinaryFunction::PRelu => {
                (f32::NEG_INFINITY, f32::INFINITY)
            }
            _ => (node.output_min, node.output_max),
        };
        BinaryKind::F32 { f, min, max }
    };
    Ok(Binary {
        a: b.input(node, 0),
        b: b.input(node, 1),
        y,
        kind,
    })
}

/// The parameters of an `Add` or `Multiply` of qint8 values, or why XNNPACK would
/// refuse them.
fn int8_kind(b: &Builder<'_>, i: usize, node: &NodeDef) -> Result<BinaryKind, BackendError> {
    let input = |k: usize| node.inputs.get(k).copied().flatten().unwrap_or(0);
    let qa = tensor_quant(b, i, node, input(0), "input1_id")?;
    let qb = tensor_quant(b, i, node, input(1), "input2_id")?;
    let qy = tensor_quant(b, i, node, b.output(node), "output_id")?;
    let (min, max) = output_bounds(node, qy);
    let why =
        |e: String| BackendError::Unsupported(format!("{}: {e}", b.field(i, node, "output_id")));
    match node.kind {
        NodeKind::Add => Ok(BinaryKind::Int8Add(
            Int8AddParams::new(qa, qb, qy, min, max).map_err(why)?,
        )),
        NodeKind::Multiply => Ok(BinaryKind::Int8Multiply(
            Int8MultiplyParams::new(qa, qb, qy, min, max).map_err(why)?,
        )),
        other => Err(invalid(
            b.field(i, node, "output_id"),
            format!("{} of qint8 values", other.name()),
        )),
    }
}

impl NodeOp for Binary {
    fn inputs(&self) -> Inputs {
        Inputs::new(&[self.a, self.b])
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let d = broadcast(&get(shapes, self.a), &get(shapes, self.b))
            .ok_or("input shapes do not broadcast")?;
        set(shapes, self.y, d);
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        let shapes = call.shapes;
        let (ad, bd, yd) = (&shapes[self.a], &shapes[self.b], &shapes[self.y]);
        let [a, b, ..] = call.inputs;
        let out = call.output;
        let (f, min, max) = match self.kind {
            BinaryKind::F32 { f, min, max } => (f, min, max),
            BinaryKind::Int8Add(p) => {
                return run_int8(call.pool, &|x, y| p.apply(x, y), (ad, a, bd, b, yd), out);
            }
            BinaryKind::Int8Multiply(p) => {
                return run_int8(call.pool, &|x, y| p.apply(x, y), (ad, a, bd, b, yd), out);
            }
        };
        let pool = call.pool;
        if flat_operand(a, out) && flat_operand(b, out) {
            // Operands as long as the output (or one value): chunks of it on the pool.
            let failed = AtomicBool::new(false);
            let step = out.len().div_ceil(elementwise_tasks(pool, out.len()));
            pool.for_each_chunk_mut(out, step, 1, |i, chunk| {
                let len = chunk.len();
                let (ad, a) = flat_part(a, i * step, len);
                let (bd, b) = flat_part(b, i * step, len);
                let yd = Dims::new(&[len]).unwrap_or_default();
                let operands = BroadcastOperands {
                    ad: &ad,
                    a,
                    bd: &bd,
                    b,
                    yd: &yd,
                };
                if binary(f, min, max, operands, chunk).is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
            });
            return checked(!failed.into_inner(), "binary");
        }
        let operands = BroadcastOperands { ad, a, bd, b, yd };
        binary_split(pool, f, min, max, operands, out)
    }
}

/// An int8 binary node: `g` on the bytes of the operands, broadcast; chunks of the
/// output on the pool when neither operand needs broadcasting (a residual `Add`).
fn run_int8(
    pool: &ThreadPool,
    g: &(impl Fn(i8, i8) -> i8 + Sync),
    (ad, a, bd, b, yd): (&Dims, &[f32], &Dims, &[f32], &Dims),
    out: &mut [f32],
) -> Result<(), KernelError> {
    let numel = |d: &Dims| d.numel().ok_or_else(|| short("binary"));
    let a = int8(a).get(..numel(ad)?).ok_or_else(|| short("binary"))?;
    let b = int8(b).get(..numel(bd)?).ok_or_else(|| short("binary"))?;
    let out = int8_mut(out)
        .get_mut(..numel(yd)?)
        .ok_or_else(|| short("binary"))?;
    let n = out.len();
    if a.len() == n && b.len() == n {
        let step = n.div_ceil(elementwise_tasks(pool, n)).max(1);
        pool.for_each_chunk_mut(out, step, 1, |i, chunk| {
            let (a, b) = (&a[i * step..][..chunk.len()], &b[i * step..][..chunk.len()]);
            for ((o, &x), &y) in chunk.iter_mut().zip(a).zip(b) {
                *o = g(x, y);
            }
        });
        return Ok(());
    }
    binary_with(g, BroadcastOperands { ad, a, bd, b, yd }, out)
}

/// Whether an elementwise operand needs no broadcasting against `out`: as long as it,
/// or a single value.
fn flat_operand(v: &[f32], out: &[f32]) -> bool {
    v.len() == out.len() || v.len() == 1
}

/// Elements `start .. start + len` of a flat operand (all of it when it is one value),
/// with their 1-d dims.
fn flat_part(v: &[f32], start: usize, len: usize) -> (Dims, &[f32]) {
    let part = if v.len() == 1 {
        v
    } else {
        v.get(start..start + len).unwrap_or_default()
    };
    (Dims::new(&[part.len()]).unwrap_or_default(), part)
}

/// A broadcasting binary node split over the pool along the output's first axis
/// longer than one: each task gets a run of that axis, and each operand either the
/// matching run (when it spans the axis) or all of itself (when it broadcasts along it).
fn binary_split(
    pool: &ThreadPool,
    f: BinaryFunction,
    min: f32,
    max: f32,
    operands: BroadcastOperands<'_, f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let BroadcastOperands { ad, a, bd, b, yd } = operands;
    let rank = yd.rank();
    let axis = (0..rank).find(|&i| yd.get(i) > 1);
    let tasks = elementwise_tasks(pool, out.len());
    let (Some(axis), true) = (axis, tasks > 1 && ad.rank() <= rank && bd.rank() <= rank) else {
        return binary(f, min, max, operands, out);
    };
    let inner = yd.product(axis + 1..rank);
    let per_task = yd.get(axis).div_ceil(tasks);
    let out = out
        .get_mut(..yd.get(axis) * inner)
        .ok_or_else(|| short("binary"))?;
    let failed = AtomicBool::new(false);
    pool.for_each_chunk_mut(out, per_task * inner, 1, |task, chunk| {
        let rows = task * per_task..task * per_task + chunk.len() / inner;
        let (ad, a) = operand_rows(ad, a, rank, axis, &rows);
        let (bd, b) = operand_rows(bd, b, rank, axis, &rows);
        let mut cd = *yd;
        cd.as_mut_slice()[axis] = rows.len();
        let operands = BroadcastOperands {
            ad: &ad,
            a,
            bd: &bd,
            b,
            yd: &cd,
        };
        if binary(f, min, max, operands, chunk).is_err() {
            failed.store(true, Ordering::Relaxed);
        }
    });
    checked(!failed.into_inner(), "binary")
}

/// The part of a binary operand (dims `d`, right-aligned to an output of rank
/// `out_rank`) that output rows `rows` of `axis` read: the matching rows when it spans
/// the axis, all of it when it broadcasts along it.
fn operand_rows<'a>(
    d: &Dims,
    v: &'a [f32],
    out_rank: usize,
    axis: usize,
    rows: &Range<usize>,
) -> (Dims, &'a [f32]) {
    let lead = out_rank - d.rank();
    if axis < lead || d.get(axis - lead) == 1 {
        return (*d, v);
    }
    let ax = axis - lead;
    let inner = d.product(ax + 1..d.rank());
    let mut part = *d;
    part.as_mut_slice()[ax] = rows.len();
    let v = v
        .get(rows.start * inner..rows.end * inner)
        .unwrap_or_default();
    (part, v)
}

/// `out = clamp(f(a, b))` with numpy broadcasting of both operands to the output dims.
pub fn binary(
    f: BinaryFunction,
    min: f32,
    max: f32,
    operands: BroadcastOperands<'_, f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let bounded = min > f32::NEG_INFINITY || max < f32::INFINITY;
    let arithmetic = match f {
        BinaryFunction::Add => Some(Arithmetic::Add),
        BinaryFunction::Subtract => Some(Arithmetic::Subtract),
        BinaryFunction::Multiply => Some(Arithmetic::Multiply),
        BinaryFunction::Divide => Some(Arithmetic::Divide),
        BinaryFunction::Minimum | BinaryFunction::Maximum | BinaryFunction::PRelu => None,
    };
    if let Some(op) = arithmetic {
        // The vector loops of the kernel library, run by run.
        let isa = etch_linalg::dispatch().elementwise;
        let clamp = bounded.then_some((min, max));
        return for_each_operand_run(operands, out, |x, y, o| {
            elementwise::arithmetic(isa, op, x, y, clamp, o)
        });
    }
    if bounded {
        binary_with(&|p, q| apply(f, p, q).max(min).min(max), operands, out)
    } else {
        binary_with(&|p, q| apply(f, p, q), operands, out)
    }
}

#[inline]
fn apply(f: BinaryFunction, a: f32, b: f32) -> f32 {
    match f {
        BinaryFunction::Add => a + b,
        BinaryFunction::Subtract => a - b,
        BinaryFunction::Multiply => a * b,
        BinaryFunction::Divide => a / b,
        BinaryFunction::Minimum => a.min(b),
        BinaryFunction::Maximum => a.max(b),
        BinaryFunction::PRelu => {
            if a >= 0.0 {
                a
            } else {
                a * b
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: &[usize]) -> Dims {
        Dims::new(v).unwrap()
    }

    #[test]
    fn broadcast_rows_and_columns() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let col = [10.0, 20.0];
        let mut out = [0f32; 6];
        binary(
            BinaryFunction::Add,
            f32::NEG_INFINITY,
            f32::INFINITY,
            BroadcastOperands {
                ad: &d(&[2, 3]),
                a: &a,
                bd: &d(&[2, 1]),
                b: &col,
                yd: &d(&[2, 3]),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [11.0, 12.0, 13.0, 24.0, 25.0, 26.0]);
        let row = [1.0, 0.0, -1.0];
        binary(
            BinaryFunction::Multiply,
            f32::NEG_INFINITY,
            f32::INFINITY,
            BroadcastOperands {
                ad: &d(&[2, 3]),
                a: &a,
                bd: &d(&[3]),
                b: &row,
                yd: &d(&[2, 3]),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [1.0, 0.0, -3.0, 4.0, 0.0, -6.0]);
    }
}
