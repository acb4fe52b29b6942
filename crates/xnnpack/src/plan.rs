//! The executable form of a validated graph: one [`Op`] per node with value indices
//! resolved, weights packed once into the layouts etch's kernels read (the unpacked
//! copies dropped), and a memory plan placing every non-constant value in one arena
//! by lifetime, so a call needs one scratch block.

use etch_kernels::BackendError;
use etch_linalg::PackedB;

use crate::call_cache::CallCache;
use crate::dims::Dims;
use crate::graph::{GraphDef, NodeDef, Params, Window, invalid};
use crate::nodes::{self, Node, NodeOp};
use crate::plan_builder::{Bias, Builder, f32_data};
use crate::schema::{FLAG_KEEP_DIMS, NodeKind};
use crate::shape;

/// Most f32 one delegate's arena may hold (4 GiB): the official runtime too plans its
/// memory from the serialized dims, so a larger plan is a corrupt or hostile file.
pub const MAX_ARENA_ELEMS: usize = 1 << 30;

/// Arena offsets are multiples of this many f32 (64 bytes).
pub const ALIGN_ELEMS: usize = 16;

/// Which convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvKind {
    /// Grouped convolution, filter `[groups * group_out, kh, kw, group_in]` (OHWI),
    /// which is already the `[n, k]` GEMM layout of the im2col product per group.
    Conv,
    /// Depthwise, filter `[kh, kw, channels * multiplier]`.
    Depthwise,
    /// Transposed (deconvolution), filter `[groups * group_out, kh, kw, group_in]`.
    Transposed,
}

/// A convolution node.
#[derive(Debug, Clone)]
pub struct ConvOp {
    pub kind: ConvKind,
    pub x: usize,
    pub y: usize,
    pub window: Window,
    /// The filter of depthwise and transposed convolutions (empty for `Conv`, whose
    /// filter lives in `packed` only).
    pub filter: Vec<f32>,
    /// `Conv`: the OHWI filter of each group packed for the GEMM (`[group_out, patch]`).
    pub packed: Vec<PackedB>,
    /// One per output channel (zeros without a bias).
    pub bias: Vec<f32>,
    pub min: f32,
    pub max: f32,
    /// The int8 form (qint8 input and output, qcint8 filter): `filter` and `bias` are
    /// then empty.
    pub q: Option<Box<crate::qs8::Qs8Conv>>,
}

/// A pooling node.
#[derive(Debug, Clone)]
pub struct PoolOp {
    pub max_pool: bool,
    pub x: usize,
    pub y: usize,
    pub window: Window,
    pub min: f32,
    pub max: f32,
    /// Max pooling on qint8: the quantized output bounds.
    pub q: Option<(i8, i8)>,
}

/// One executable node.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum Op {
    /// A node of a kind planned by `nodes`.
    Node(Node),
    Conv(ConvOp),
    Pool(PoolOp),
    GlobalAvgPool {
        x: usize,
        y: usize,
        keep_dims: bool,
        min: f32,
        max: f32,
        /// The qint8 form.
        q: Option<crate::qs8::Qs8MeanParams>,
    },
}

impl Op {
    /// Values the op reads (constants included; packed weights are not values): the
    /// first `n` entries of the array.
    pub fn inputs(&self) -> ([usize; 5], usize) {
        let mut a = [0usize; 5];
        let mut n = 0;
        let mut push = |v: usize| {
            if n < 5 {
                a[n] = v;
                n += 1;
            }
        };
        match self {
            Op::GlobalAvgPool { x, .. } => push(*x),
            Op::Node(n) => n.inputs().as_slice().iter().for_each(|&v| push(v)),
            Op::Conv(c) => push(c.x),
            Op::Pool(p) => push(p.x),
        }
        (a, n)
    }

    /// The value the op writes.
    pub fn output(&self) -> usize {
        match self {
            Op::GlobalAvgPool { y, .. } => *y,
            Op::Node(n) => n.output(),
            Op::Conv(c) => c.y,
            Op::Pool(p) => p.y,
        }
    }
}

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
    pub ops: Vec<Op>,
    pub kinds: Vec<NodeKind>,
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
    /// Longest im2col row of the convolutions.
    pub max_patch: usize,
    /// Elements of im2col block (and grouped-output block) one thread of the fp32
    /// convolutions needs.
    pub conv_block_len: usize,
    /// Shapes and placement of the last call, for the next one with the same input dims.
    pub call_cache: CallCache,
}

impl Plan {
    /// Elements of im2col scratch a call with `threads` threads needs.
    pub fn im2col_len(&self, threads: usize) -> usize {
        (self.max_patch * crate::exec::IM2COL_BLOCK).max(self.conv_block_len) * threads.max(1)
    }
}

impl Builder<'_> {
    fn op(&mut self, i: usize, node: &NodeDef) -> Result<Op, BackendError> {
        let y = node.outputs.first().copied().unwrap_or(0);
        if crate::nodes::quantized::touches_qint8(&self.graph.values, node)
            && let Some(op) = crate::qs8_plan::build(self, i, node, y)?
        {
            return Ok(op);
        }
        self.plain_op(i, node)
    }

    /// The op of a node as the fp32 path builds it (the int8 path reuses its checks).
    pub(crate) fn plain_op(&mut self, i: usize, node: &NodeDef) -> Result<Op, BackendError> {
        use NodeKind::*;
        if let Some(n) = nodes::plan(self, i, node)? {
            return Ok(Op::Node(n));
        }
        let (min, max) = (node.output_min, node.output_max);
        let y = node.outputs.first().copied().unwrap_or(0);
        let op = match node.kind {
            GlobalAvgPooling2d => Op::GlobalAvgPool {
                x: self.input(node, 0),
                y,
                keep_dims: node.flags & FLAG_KEEP_DIMS != 0,
                min,
                max,
                q: None,
            },
            AvgPooling2d | MaxPooling2d => {
                let Params::Window(window) = node.params else {
                    return Err(invalid(self.field(i, node, "pooling_height"), "missing"));
                };
                Op::Pool(PoolOp {
                    max_pool: node.kind == MaxPooling2d,
                    x: self.input(node, 0),
                    y,
                    window,
                    min,
                    max,
                    q: None,
                })
            }
            Conv2d | DepthwiseConv2d | ConvTranspose2d => {
                let op = self.conv_op(i, node, y)?;
                self.pack_conv(i, node, op)?
            }
            ArgMaxPooling2d | ScaledDotProductAttention => {
                return Err(BackendError::Unsupported(format!(
                    "XNNPACK node {}",
                    node.kind.name()
                )));
            }
            _ => {
                return Err(invalid(
                    self.field(i, node, "kind"),
                    "planned by its node kind",
                ));
            }
        };
        Ok(op)
    }

    pub(crate) fn conv_op(
        &mut self,
        i: usize,
        node: &NodeDef,
        y: usize,
    ) -> Result<Op, BackendError> {
        let Params::Window(window) = node.params else {
            return Err(invalid(self.field(i, node, "kernel_height"), "missing"));
        };
        let kind = match node.kind {
            NodeKind::DepthwiseConv2d => ConvKind::Depthwise,
            NodeKind::ConvTranspose2d => ConvKind::Transposed,
            _ => ConvKind::Conv,
        };
        let w = &window;
        let fv = node.inputs.get(1).copied().flatten().unwrap_or(0);
        let fd = self.graph.values[fv].dims;
        let (expect, out_c): (Vec<usize>, usize) = match kind {
            ConvKind::Depthwise => {
                if w.group_out % w.group_in != 0 {
                    return Err(invalid(
                        self.field(i, node, "group_output_channels"),
                        format!(
                            "{} is not a multiple of group_input_channels {}",
                            w.group_out, w.group_in
                        ),
                    ));
                }
                let c = w.groups * (w.group_out / w.group_in);
                (vec![1, w.kernel_h, w.kernel_w, c], c)
            }
            _ => {
                let oc = w.groups * w.group_out;
                (vec![oc, w.kernel_h, w.kernel_w, w.group_in], oc)
            }
        };
        if fd.as_slice() != expect.as_slice() {
            return Err(invalid(
                self.field(i, node, "filter_id"),
                format!("filter dims {fd:?}, the node's geometry needs {expect:?}"),
            ));
        }
        let Some(bytes) = self.constant(fv) else {
            return Err(BackendError::Unsupported(format!(
                "xnodes[{i}].{}: a filter that is not constant",
                node.kind.name()
            )));
        };
        let mut window = window;
        if kind == ConvKind::Depthwise {
            // Depth multiplier (group_out / group_in) in group_out, channels in groups.
            window.group_out = w.group_out / w.group_in;
            window.group_in = 1;
        }
        let filter = f32_data(bytes);
        self.packed_bytes += filter.len() * 4;
        let bias = match self.bias(i, node, out_c)? {
            Bias::None => vec![0f32; out_c],
            Bias::Packed(b) => b,
            Bias::Value(_) => {
                return Err(BackendError::Unsupported(format!(
                    "xnodes[{i}].{}: a bias that is not constant",
                    node.kind.name()
                )));
            }
        };
        Ok(Op::Conv(ConvOp {
            kind,
            x: self.input(node, 0),
            y,
            window,
            filter,
            packed: Vec::new(),
            bias,
            min: node.output_min,
            max: node.output_max,
            q: None,
        }))
    }

    /// Packs an fp32 `Conv`'s OHWI filter into GEMM panels, one per group, and drops
    /// the unpacked copy; depthwise and transposed filters stay as they are.
    fn pack_conv(&mut self, i: usize, node: &NodeDef, op: Op) -> Result<Op, BackendError> {
        let Op::Conv(mut c) = op else {
            return Ok(op);
        };
        if c.kind != ConvKind::Conv {
            return Ok(Op::Conv(c));
        }
        let w = c.window;
        let patch = w.kernel_h * w.kernel_w * w.group_in;
        let per_group = w.group_out * patch;
        let mut packed = Vec::with_capacity(w.groups);
        for grp in 0..w.groups {
            let rows = c
                .filter
                .get(grp * per_group..(grp + 1) * per_group)
                .ok_or_else(|| {
                    invalid(
                        self.field(i, node, "filter_id"),
                        "shorter than the node's geometry",
                    )
                })?;
            let p = PackedB::from_nk(rows, w.group_out, patch)
                .map_err(|e| invalid(self.field(i, node, "filter_id"), e.to_string()))?;
            packed.push(p);
        }
        self.packed_bytes -= c.filter.len() * 4;
        self.packed_bytes += packed.iter().map(PackedB::packed_bytes).sum::<usize>();
        c.filter = Vec::new();
        c.packed = packed;
        Ok(Op::Conv(c))
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
        ops.push(b.op(i, node)?);
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
            Some(crate::graph::Quantization::PerTokenDynamic { num_nonbatch_dims }) => {
                num_nonbatch_dims.max(1)
            }
            _ => 0,
        };
        values.push(ValuePlan {
            dims: def.dims,
            loc,
            row_dims,
            int8: def.datatype == crate::schema::Datatype::QInt8,
        });
    }

    let max_patch = ops
        .iter()
        .filter_map(|op| match op {
            Op::Conv(c) if c.kind == ConvKind::Conv => {
                Some(c.window.kernel_h * c.window.kernel_w * c.window.group_in)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let conv_block_len = ops
        .iter()
        .filter_map(|op| match op {
            Op::Conv(c) if c.kind == ConvKind::Conv && c.q.is_none() => {
                let w = &c.window;
                let grouped_out = if w.groups > 1 { w.group_out } else { 0 };
                Some(
                    crate::exec::CONV_BLOCK_PIXELS
                        * (w.kernel_h * w.kernel_w * w.group_in + grouped_out),
                )
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);

    // Shape bounds: infer every node's shapes from the serialized input dims.
    let mut shapes: Vec<_> = graph.values.iter().map(|v| v.dims).collect();
    for (i, op) in ops.iter().enumerate() {
        shape::infer(op, &mut shapes)
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
        let (ins, n) = op.inputs();
        for &v in &ins[..n] {
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
    Ok(Plan {
        ops,
        kinds,
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
        max_patch,
        conv_block_len,
        call_cache: CallCache::default(),
    })
}

/// Whether the nodes may write external output `v` straight into the call's tensor: an
/// f32 value that a node computes and no node reads, not an external input, listed once
/// among the outputs.
fn output_in_place(
    ops: &[Op],
    values: &[ValuePlan],
    inputs: &[(usize, usize)],
    outputs: &[(usize, usize)],
    v: usize,
) -> bool {
    let read = ops.iter().any(|op| {
        let (vs, n) = op.inputs();
        vs[..n].contains(&v)
    });
    let computed = ops.iter().any(|op| op.output() == v);
    computed
        && !read
        && values.get(v).is_some_and(|x| !x.int8)
        && !inputs.iter().any(|&(u, _)| u == v)
        && outputs.iter().filter(|&&(u, _)| u == v).count() == 1
}
