//! `Concatenate2` to `Concatenate5` along one axis, for fp32 and int8 values (the
//! inputs share the output's quantization), split over the pool by outer rows when the
//! output is large enough.

use etch_kernels::{BackendError, KernelError, ThreadPool};

use crate::dims::Dims;
use crate::graph::{NodeDef, Params, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::call::{
    Inputs, MAX_INPUTS, NodeCall, checked, elementwise_tasks, int8, int8_mut, short,
};
use crate::nodes::node_op::NodeOp;
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::plan_builder::Builder;
use crate::schema::NodeKind;

/// A concatenation node.
#[derive(Debug, Clone)]
pub struct Concatenate {
    xs: Inputs,
    axis: usize,
    y: usize,
    /// Whether the values are qint8 (bytes) rather than fp32.
    int8: bool,
}

/// Reads a `Concatenate2` .. `Concatenate5` node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    let n = match r.kind {
        NodeKind::Concatenate2 => 2,
        NodeKind::Concatenate3 => 3,
        NodeKind::Concatenate4 => 4,
        _ => 5,
    };
    let ids: [(u16, &'static str); 5] = [
        (1, "input1_id"),
        (2, "input2_id"),
        (3, "input3_id"),
        (4, "input4_id"),
        (7, "input5_id"),
    ];
    for &(id, name) in &ids[..n] {
        node.inputs.push(Some(r.value(id, name)?));
    }
    node.params = Params::Concat {
        axis: r.usize(0, "axis")?,
    };
    node.outputs = vec![r.value(5, "output_id")?];
    node.flags = r.flags(6, 0)?;
    Ok(())
}

/// Plans a concatenation node.
pub fn plan(b: &mut Builder<'_>, i: usize, node: &NodeDef) -> Result<Concatenate, BackendError> {
    let Params::Concat { axis } = node.params else {
        return Err(invalid(b.field(i, node, "axis"), "missing"));
    };
    let mut xs = [0usize; MAX_INPUTS];
    let n = node.inputs.len().min(MAX_INPUTS);
    for (k, slot) in xs.iter_mut().enumerate().take(n) {
        *slot = b.input(node, k);
    }
    let y = b.output(node);
    Ok(Concatenate {
        xs: Inputs::new(&xs[..n]),
        axis,
        y,
        int8: b.is_int8(y),
    })
}

impl NodeOp for Concatenate {
    fn inputs(&self) -> Inputs {
        self.xs
    }

    fn output(&self) -> usize {
        self.y
    }

    fn infer_shape(&self, shapes: &mut [Dims]) -> ShapeResult {
        let xs = self.xs.as_slice();
        let axis = self.axis;
        let first = get(shapes, xs[0]);
        if axis >= first.rank() {
            return Err("concatenation axis out of range");
        }
        let mut d = first;
        let mut total = 0usize;
        for &v in xs {
            let vd = get(shapes, v);
            if vd.rank() != first.rank() {
                return Err("inputs differ in rank");
            }
            for i in 0..vd.rank() {
                if i != axis && vd.get(i) != first.get(i) {
                    return Err("inputs differ outside the concatenation axis");
                }
            }
            total = total.checked_add(vd.get(axis)).ok_or("size overflows")?;
        }
        d.as_mut_slice()[axis] = total;
        set(shapes, self.y, d);
        Ok(())
    }

    fn run(&self, call: NodeCall<'_>) -> Result<(), KernelError> {
        if !self.int8 {
            return self.concat(call.pool, call.shapes, &call.inputs, call.output);
        }
        let n = call.shapes[self.y].numel().unwrap_or(0);
        let dst = int8_mut(call.output)
            .get_mut(..n)
            .ok_or_else(|| short("concatenate"))?;
        let srcs: [&[i8]; MAX_INPUTS] = call.inputs.map(int8);
        self.concat(call.pool, call.shapes, &srcs, dst)
    }
}

impl Concatenate {
    /// Concatenation of `ins` (elements of any type) into `out`.
    fn concat<T: Copy + Send + Sync>(
        &self,
        pool: &ThreadPool,
        shapes: &[Dims],
        ins: &[&[T]; MAX_INPUTS],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        let (xs, axis) = (self.xs.as_slice(), self.axis);
        let n = xs.len();
        let yd = shapes[self.y];
        let outer = yd.product(0..axis);
        let inner = yd.product(axis + 1..yd.rank());
        let row = yd.get(axis) * inner;
        // Each input's part of an output row, and where it starts in the row.
        let mut parts = [(0usize, 0usize); MAX_INPUTS];
        let mut at = 0;
        for (part, &v) in parts.iter_mut().zip(xs) {
            let len = shapes[v].get(axis) * inner;
            *part = (at, len);
            at += len;
        }
        let out = out
            .get_mut(..outer * row)
            .ok_or_else(|| short("concatenate"))?;
        if row == 0 {
            return Ok(());
        }
        for (k, &(_, len)) in parts[..n].iter().enumerate() {
            checked(ins[k].len() >= outer * len, "concatenate")?;
        }
        let rows_per_task = outer.div_ceil(elementwise_tasks(pool, outer * row));
        pool.for_each_chunk_mut(out, rows_per_task * row, 1, |task, chunk| {
            let first = task * rows_per_task;
            if parts[..n].iter().all(|&(_, len)| len == 1) {
                // Stacking along a new last axis (RoPE's interleave of two halves): input
                // k fills every n-th element from k, one strided pass per input.
                let rows = chunk.len() / row;
                for (k, src) in ins[..n].iter().enumerate() {
                    let src = &src[first..first + rows];
                    for (d, s) in chunk[k..].iter_mut().step_by(n).zip(src) {
                        *d = *s;
                    }
                }
                return;
            }
            for (o, out_row) in (first..).zip(chunk.chunks_exact_mut(row)) {
                for (k, &(at, len)) in parts[..n].iter().enumerate() {
                    out_row[at..at + len].copy_from_slice(&ins[k][o * len..(o + 1) * len]);
                }
            }
        });
        Ok(())
    }
}
