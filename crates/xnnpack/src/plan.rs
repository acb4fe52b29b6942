//! The executable form of a validated graph: one [`Node`] per node with value indices
//! resolved, weights packed once into the layouts etch's kernels read (the unpacked
//! copies dropped), and a memory plan placing every non-constant value in one arena
//! by lifetime, so a call needs one scratch block.

use etch_kernels::BackendError;

use crate::call_cache::CallCache;
use crate::dims::Dims;
use crate::graph::{GraphDef, Quantization, invalid};
use crate::nodes::{self, Node, NodeOp};
use crate::plan_builder::{Builder, f32_data};
use crate::schema::{Datatype, NodeKind};

/// Most f32 one delegate's arena may hold (4 GiB): the official runtime too plans its
/// memory from the serialized dims, so a larger plan is a corrupt or hostile file.
pub const MAX_ARENA_ELEMS: usize = 1 << 30;

/// Arena offsets are multiples of this many f32 (64 bytes).
pub const ALIGN_ELEMS: usize = 16;

/// Where a value lives during a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// At most `capacity` f32 in the call's arena, at an offset each call places for its
    /// real shapes (see [`Plan::placement`]).
    Arena { capacity: usize },
    /// Constant data held by the plan (`Plan::constants[value]`).
    Constant,
    /// Only read as packed weights: no data at run time.
    PackedOnly,
}

/// A value as the interpreter sees it.
#[derive(Debug, Clone)]
pub struct ValuePlan {
    /// Serialized dims (constants' shapes, inputs' expected rank).
    pub dims: Dims,
    pub loc: Loc,
    /// For a qdint8 value: how many trailing dims form one quantized row (its
    /// `(scale, zero point)` pairs follow the values in the arena); 0 for fp32.
    pub row_dims: usize,
    /// A qint8 value: int8 bytes, four to an arena word.
    pub int8: bool,
    /// An fp16 value held as fp32 (see `ValueDef::half`).
    pub half: bool,
}

impl ValuePlan {
    /// Arena elements a value of shape `d` occupies.
    pub fn len(&self, d: &Dims) -> Option<usize> {
        let numel = d.numel()?;
        if self.int8 {
            return Some(numel.div_ceil(4));
        }
        if self.row_dims == 0 {
            return Some(numel);
        }
        let row = self.row_len(d);
        let rows = numel.checked_div(row).unwrap_or(0);
        crate::qd8_slot::slot_len(rows, row)
    }

    /// For a qdint8 value of shape `d`: the values of one quantized row.
    pub fn row_len(&self, d: &Dims) -> usize {
        d.product(d.rank().saturating_sub(self.row_dims.max(1))..d.rank())
    }
}

/// The executable graph.
#[derive(Debug)]
pub struct Plan {
    pub ops: Vec<Node>,
    pub kinds: Vec<NodeKind>,
    /// Per node, the name its time goes under when profiled: its kind, with `qs8` for
    /// an int8 output (a different kernel family).
    pub profile_names: Vec<String>,
    pub values: Vec<ValuePlan>,
    /// Constant f32 data by value index (`None` for non-constants and packed-only).
    pub constants: Vec<Option<Vec<f32>>>,
    /// `(value, argument)` of the external inputs, then of the outputs.
    pub inputs: Vec<(usize, usize)>,
    pub outputs: Vec<(usize, usize)>,
    /// Per output: whether the nodes may write it straight into the call's tensor (see
    /// [`output_in_place`]).
    pub outputs_in_place: Vec<bool>,
    pub num_args: usize,
    /// The arena of a call at the upper-bound shapes (the most any call needs).
    pub arena_len: usize,
    /// Arena values in the order a call places them (smallest bound first).
    pub placement: Vec<usize>,
    /// `[first node writing, last node reading]` of every value (inputs from 0,
    /// outputs to the end); values whose lifetimes overlap never share arena space.
    pub lifetimes: Vec<(usize, usize)>,
    pub packed_bytes: usize,
    /// Elements of im2col blocks one thread of the convolutions needs.
    pub im2col_per_thread: usize,
    /// Shapes and placement of the last call, for the next one with the same input dims.
    pub call_cache: CallCache,
}

impl Plan {
    /// Elements of im2col scratch a call with `threads` threads needs.
    pub fn im2col_len(&self, threads: usize) -> usize {
        self.im2col_per_thread * threads.max(1)
    }
}

/// Builds the plan: ops, packed weights, shape bounds and the arena layout.
pub fn build(graph: &GraphDef) -> Result<Plan, BackendError> {
    let n_values = graph.values.len();
    let mut b = Builder {
        graph,
        plain_use: vec![false; n_values],
        packed_bytes: 0,
    };
    let mut ops = Vec::with_capacity(graph.nodes.len());
    let mut kinds = Vec::with_capacity(graph.nodes.len());
    for (i, node) in graph.nodes.iter().enumerate() {
        ops.push(nodes::plan(&mut b, i, node)?);
        kinds.push(node.kind);
    }
    let plain_use = b.plain_use;
    let packed_bytes = b.packed_bytes;
    let mut constants: Vec<Option<Vec<f32>>> = vec![None; n_values];
    let mut values = Vec::with_capacity(n_values);
    for (v, def) in graph.values.iter().enumerate() {
        let loc = match &def.constant {
            Some(bytes) if plain_use[v] => {
                constants[v] = Some(f32_data(bytes));
                Loc::Constant
            }
            Some(_) => Loc::PackedOnly,
            None => Loc::Arena { capacity: 0 },
        };
        let row_dims = match def.quant {
            Some(Quantization::PerTokenDynamic { num_nonbatch_dims }) => num_nonbatch_dims.max(1),
            _ => 0,
        };
        values.push(ValuePlan {
            dims: def.dims,
            loc,
            row_dims,
            int8: def.datatype == Datatype::QInt8,
            half: def.half,
        });
    }

    let im2col_per_thread = ops
        .iter()
        .map(NodeOp::im2col_len_per_thread)
        .max()
        .unwrap_or(0);

    // Shape bounds: infer every node's shapes from the serialized input dims.
    let mut shapes: Vec<_> = graph.values.iter().map(|v| v.dims).collect();
    for (i, op) in ops.iter().enumerate() {
        op.infer_shape(&mut shapes)
            .map_err(|reason| invalid(format!("xnodes[{i}].{}", kinds[i].name()), reason))?;
    }

    // Lifetimes: [first node writing, last node reading]; inputs from 0, outputs to the end.
    let n_ops = ops.len();
    let mut start = vec![usize::MAX; n_values];
    let mut end = vec![0usize; n_values];
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for (v, def) in graph.values.iter().enumerate() {
        if let Some(e) = def.external {
            if e.input {
                start[v] = 0;
                inputs.push((v, e.arg));
            }
            if e.output {
                end[v] = n_ops;
                outputs.push((v, e.arg));
            }
        }
    }
    for (i, op) in ops.iter().enumerate() {
        let y = op.output();
        start[y] = start[y].min(i);
        end[y] = end[y].max(i);
        for &v in op.inputs().as_slice() {
            end[v] = end[v].max(i);
        }
    }
    let mut order: Vec<usize> = (0..n_values)
        .filter(|&v| matches!(values[v].loc, Loc::Arena { .. }) && start[v] != usize::MAX)
        .collect();
    let capacity = |v: usize| -> Result<usize, BackendError> {
        let a = values[v].len(&shapes[v]).unwrap_or(usize::MAX);
        let s = values[v].len(&graph.values[v].dims).unwrap_or(usize::MAX);
        let c = a.max(s);
        if c > MAX_ARENA_ELEMS {
            return Err(invalid(
                format!("xvalues[{v}].dims"),
                format!("{c} elements is too large"),
            ));
        }
        Ok(c.div_ceil(ALIGN_ELEMS).max(1) * ALIGN_ELEMS)
    };
    let mut caps = vec![0usize; n_values];
    for &v in &order {
        caps[v] = capacity(v)?;
    }
    // Smallest first: serialized dims are upper bounds, and a call touches only the real
    // extents, so large-bound values (a prompt's logits) go above the small ones and a
    // decode step's arena stays small.
    order.sort_by(|&a, &b| caps[a].cmp(&caps[b]).then(a.cmp(&b)));
    let mut placed: Vec<(usize, usize, usize)> = Vec::new(); // (value, offset, end)
    let mut arena_len = 0usize;
    for &v in &order {
        let mut conflicts: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&(u, _, _)| start[u] <= end[v] && start[v] <= end[u])
            .map(|&(_, o, e)| (o, e))
            .collect();
        conflicts.sort_unstable();
        let mut offset = 0usize;
        for (o, e) in conflicts {
            if offset + caps[v] <= o {
                break;
            }
            offset = offset.max(e);
        }
        placed.push((v, offset, offset + caps[v]));
        arena_len = arena_len.max(offset + caps[v]);
        values[v].loc = Loc::Arena { capacity: caps[v] };
    }
    if arena_len > MAX_ARENA_ELEMS {
        return Err(BackendError::OutOfMemory {
            bytes: arena_len.saturating_mul(4),
            what: "the XNNPACK delegate's value arena (over the 4 GiB limit)",
        });
    }
    let outputs_in_place = outputs
        .iter()
        .map(|&(v, _)| output_in_place(&ops, &values, &inputs, &outputs, v))
        .collect();
    let profile_names = ops
        .iter()
        .zip(&kinds)
        .map(|(op, kind)| match values.get(op.output()) {
            Some(v) if v.int8 => format!("{} qs8", kind.name()),
            _ => kind.name().to_string(),
        })
        .collect();
    Ok(Plan {
        ops,
        kinds,
        profile_names,
        values,
        constants,
        inputs,
        outputs,
        outputs_in_place,
        num_args: graph.num_args,
        arena_len,
        placement: order,
        lifetimes: start.into_iter().zip(end).collect(),
        packed_bytes,
        im2col_per_thread,
        call_cache: CallCache::default(),
    })
}

/// Whether the nodes may write external output `v` straight into the call's tensor: an
/// f32 value that a node computes and no node reads, not an external input, listed once
/// among the outputs.
fn output_in_place(
    ops: &[Node],
    values: &[ValuePlan],
    inputs: &[(usize, usize)],
    outputs: &[(usize, usize)],
    v: usize,
) -> bool {
    let read = ops.iter().any(|op| op.inputs().as_slice().contains(&v));
    let computed = ops.iter().any(|op| op.output() == v);
    computed
        && !read
        && values.get(v).is_some_and(|x| !x.int8 && !x.half)
        && !inputs.iter().any(|&(u, _)| u == v)
        && outputs.iter().filter(|&&(u, _)| u == v).count() == 1
}
