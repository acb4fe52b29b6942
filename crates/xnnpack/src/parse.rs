//! Reading and validating the XNNGraph flatbuffer (field ids of
//! `serialization/runtime_schema.fbs`) into [`GraphDef`]: every value id, node
//! input and output, dim, flag, datatype, constant index, named key, offset and length
//! is checked here, at init, so that execution meets only validated data.

use std::collections::HashMap;

use etch_format::FormatError;
use etch_format::flatbuf::{Buffer, FieldPath, Table};
use etch_kernels::backend::NamedDataMap;
use etch_kernels::{BackendError, BackendInitContext};

use crate::dims::{Dims, MAX_DIMS};
use crate::graph::*;
use crate::header::PayloadLayout;
use crate::node_reader::NodeReader;
use crate::schema::*;

/// Most values or nodes one graph may hold.
const MAX_ITEMS: usize = 1 << 20;

fn from_format(e: FormatError) -> BackendError {
    invalid(
        e.path().unwrap_or("<flatbuffer>").to_string(),
        e.to_string(),
    )
}

trait Checked<T> {
    fn fb(self) -> Result<T, BackendError>;
}

impl<T> Checked<T> for Result<T, FormatError> {
    fn fb(self) -> Result<T, BackendError> {
        self.map_err(from_format)
    }
}

/// Where constant bytes come from.
struct ConstantSource<'a> {
    payload: &'a [u8],
    layout: &'a PayloadLayout,
    named: &'a dyn NamedDataMap,
}

/// Parses and validates the flatbuffer of `payload` laid out as `layout`.
pub fn parse_graph(
    payload: &[u8],
    layout: &PayloadLayout,
    ctx: &BackendInitContext<'_>,
) -> Result<GraphDef, BackendError> {
    let fb = payload.get(layout.flatbuffer.clone()).unwrap_or(&[]);
    let ident = fb.get(4..8).unwrap_or(&[]);
    if ident != b"XN00" && ident != b"XN01" {
        return Err(invalid(
            "identifier",
            format!(
                "expected XN00 or XN01, found {:?}",
                String::from_utf8_lossy(ident)
            ),
        ));
    }
    let buf = Buffer::new(fb);
    let root_path = FieldPath::Root;
    let root = buf.root(&root_path).fb()?;
    let num_externs = root
        .scalar::<u32>(3, 0, &root_path.field("num_externs"))
        .fb()?;
    if num_externs > MAX_EXTERNS {
        return Err(invalid(
            "num_externs",
            format!("{num_externs} exceeds the maximum of {MAX_EXTERNS}"),
        ));
    }
    let source = ConstantSource {
        payload,
        layout,
        named: ctx.named_data,
    };
    let values = parse_values(&root, &source, num_externs)?;
    let mut index_of = HashMap::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        if index_of.insert(v.id, i).is_some() {
            return Err(invalid(
                format!("xvalues[{i}].id_out"),
                format!("id {} is defined twice", v.id),
            ));
        }
    }
    let mut values = values;
    let mut nodes = parse_nodes(&root, &values, &index_of)?;
    check_dataflow(&values, &nodes)?;
    crate::fuse::fuse_int8_clamps(&values, &mut nodes);
    round_trip_dynamic_conv_inputs(&mut values, &nodes)?;
    let num_args = values
        .iter()
        .filter_map(|v| v.external.map(|e| e.arg + 1))
        .max()
        .unwrap_or(0);
    Ok(GraphDef {
        values,
        nodes,
        num_args,
    })
}

fn parse_values(
    root: &Table<'_>,
    source: &ConstantSource<'_>,
    num_externs: u32,
) -> Result<Vec<ValueDef>, BackendError> {
    let root_path = FieldPath::Root;
    let xvalues_path = root_path.field("xvalues");
    let xvalues = root.tables(2, MAX_ITEMS, &xvalues_path).fb()?;
    let constant_data_path = root_path.field("constant_data");
    let constant_data = root.tables(8, MAX_ITEMS, &constant_data_path).fb()?;
    let constant_buffer_path = root_path.field("constant_buffer");
    let constant_buffer = root.tables(6, MAX_ITEMS, &constant_buffer_path).fb()?;
    let mut values = Vec::with_capacity(xvalues.len());
    let mut seen_external = HashMap::new();
    for i in 0..xvalues.len() {
        let path = xvalues_path.index(i);
        let xvalue = xvalues.get(i, &path).fb()?;
        let (tag, table) = xvalue.union(0, &path.field("xvalue_union")).fb()?;
        let table = table.ok_or_else(|| invalid(format!("xvalues[{i}]"), "no value"))?;
        let (tensor, quant_table) = match tag {
            1 => (table, None),
            2 => {
                let qpath = path.field("XNNQuantizedTensorValue");
                let tensor = table.required_table(0, &qpath.field("tensor_value")).fb()?;
                let (qtag, qtable) = table.union(1, &qpath.field("quant_params")).fb()?;
                (tensor, Some((qtag, qtable)))
            }
            other => {
                return Err(invalid(
                    format!("xvalues[{i}].xvalue_union"),
                    format!("unknown value kind {other}"),
                ));
            }
        };
        let field = |name: &str| format!("xvalues[{i}].{name}");
        let tpath = path.field("tensor_value");
        let code = tensor.scalar::<i16>(0, 0, &tpath.field("datatype")).fb()?;
        let datatype = Datatype::from_code(code)
            .ok_or_else(|| invalid(field("datatype"), format!("unknown datatype {code}")))?;
        let dq = tensor
            .scalar::<i16>(7, 0, &tpath.field("dq_datatype"))
            .fb()?;
        if dq != 0 {
            return Err(BackendError::Unsupported(format!(
                "{}: legacy dq_datatype {dq} (dynamic quantization of an external input)",
                field("dq_datatype")
            )));
        }
        let dims_vec = tensor
            .vector_or_empty::<u32>(2, MAX_DIMS + 1, &tpath.field("dims"))
            .fb()?;
        let raw: Vec<usize> = dims_vec.iter().map(|d| d as usize).collect();
        let dims = Dims::new(&raw).ok_or_else(|| {
            invalid(
                field("dims"),
                format!("{} dims exceed the limit of {MAX_DIMS}", raw.len()),
            )
        })?;
        let num_dims = tensor.scalar::<u32>(1, 0, &tpath.field("num_dims")).fb()?;
        if num_dims as usize != dims.rank() {
            return Err(invalid(
                field("num_dims"),
                format!("{num_dims} but dims has {} entries", dims.rank()),
            ));
        }
        let numel = dims
            .numel()
            .ok_or_else(|| invalid(field("dims"), format!("{dims:?} overflows")))?;
        let flags = tensor.scalar::<u32>(5, 0, &tpath.field("flags")).fb()?;
        if flags & !(VALUE_FLAG_EXTERNAL_INPUT | VALUE_FLAG_EXTERNAL_OUTPUT) != 0 {
            return Err(invalid(
                field("flags"),
                format!("unsupported flag bits {flags:#x}"),
            ));
        }
        let external_id = tensor
            .scalar::<u32>(4, 0, &tpath.field("external_id"))
            .fb()?;
        let external = if flags != 0 {
            if external_id >= num_externs {
                return Err(invalid(
                    field("external_id"),
                    format!("{external_id} is not below num_externs {num_externs}"),
                ));
            }
            if let Some(prev) = seen_external.insert(external_id, i) {
                return Err(invalid(
                    field("external_id"),
                    format!("{external_id} is also used by xvalues[{prev}]"),
                ));
            }
            Some(External {
                arg: external_id as usize,
                input: flags & VALUE_FLAG_EXTERNAL_INPUT != 0,
                output: flags & VALUE_FLAG_EXTERNAL_OUTPUT != 0,
            })
        } else {
            None
        };
        let id = tensor.scalar::<u32>(6, 0, &tpath.field("id_out")).fb()?;
        if id == INVALID_VALUE_ID {
            return Err(invalid(field("id_out"), "the invalid value id"));
        }
        let cidx = tensor
            .scalar::<u32>(3, 0, &tpath.field("constant_buffer_idx"))
            .fb()?;
        let row = dims.as_slice().last().copied().unwrap_or(1);
        let constant = if cidx == 0 {
            None
        } else {
            if external.is_some() {
                return Err(invalid(
                    field("constant_buffer_idx"),
                    "an external value cannot be constant",
                ));
            }
            let need = datatype.constant_bytes(numel, row).ok_or_else(|| {
                invalid(field("dims"), "constant byte size overflows".to_string())
            })?;
            let bytes = constant_bytes(
                cidx,
                need,
                &field("constant_buffer_idx"),
                source,
                &constant_data,
                &constant_buffer,
            )?;
            Some(bytes)
        };
        // fp16 values are held as fp32 (see `ValueDef::half`).
        let half = datatype == Datatype::Fp16 && quant_table.is_none();
        let (datatype, constant) = if half {
            (Datatype::Fp32, constant.map(|bytes| widen_f16(&bytes)))
        } else {
            (datatype, constant)
        };
        let quant = match quant_table {
            None => None,
            Some((qtag, qtable)) => Some(parse_quant(
                i,
                datatype,
                qtag,
                qtable,
                &dims,
                source,
                &constant_data,
                &constant_buffer,
            )?),
        };
        values.push(ValueDef {
            id,
            datatype,
            dims,
            external,
            constant,
            quant,
            qd8_round_trip: None,
            half,
        });
    }
    Ok(values)
}

/// The `need` bytes of constant `idx`: from named data, the header's constant region,
/// or (headerless payloads) the legacy inline `constant_buffer`.
fn constant_bytes(
    idx: u32,
    need: usize,
    field: &str,
    source: &ConstantSource<'_>,
    constant_data: &etch_format::flatbuf::Tables<'_>,
    constant_buffer: &etch_format::flatbuf::Tables<'_>,
) -> Result<Vec<u8>, BackendError> {
    let idx = idx as usize;
    let too_short = |have: usize| {
        invalid(
            field,
            format!("constant {idx} holds {have} bytes, the value needs {need}"),
        )
    };
    if !source.layout.has_header {
        if idx >= constant_buffer.len() {
            return Err(invalid(
                field,
                format!(
                    "{idx} is out of range for constant_buffer of {}",
                    constant_buffer.len()
                ),
            ));
        }
        let path = FieldPath::Root.field("constant_buffer");
        let path = path.index(idx);
        let entry = constant_buffer.get(idx, &path).fb()?;
        let storage = entry
            .vector_or_empty::<u8>(0, usize::MAX, &path.field("storage"))
            .fb()?;
        let bytes = storage.bytes();
        return bytes
            .get(..need)
            .map(<[u8]>::to_vec)
            .ok_or(too_short(bytes.len()));
    }
    if idx >= constant_data.len() {
        return Err(invalid(
            field,
            format!(
                "{idx} is out of range for constant_data of {}",
                constant_data.len()
            ),
        ));
    }
    let root = FieldPath::Root;
    let cd_path = root.field("constant_data");
    let path = cd_path.index(idx);
    let entry = constant_data.get(idx, &path).fb()?;
    let offset = entry.scalar::<u64>(0, 0, &path.field("offset")).fb()?;
    let size = entry.scalar::<u64>(1, 0, &path.field("size")).fb()?;
    let key = entry.string(2, &path.field("named_key")).fb()?;
    match key {
        Some(key) => {
            let named = source
                .named
                .get(key)
                .ok_or_else(|| BackendError::MissingNamedData {
                    key: key.to_string(),
                })?;
            let bytes = named.as_slice();
            bytes
                .get(..need)
                .map(<[u8]>::to_vec)
                .ok_or(too_short(bytes.len()))
        }
        None => {
            let region = &source.layout.constants;
            let region_len = (region.end - region.start) as u64;
            if offset > region_len || size > region_len - offset {
                return Err(invalid(
                    format!("constant_data[{idx}].offset"),
                    format!(
                        "offset {offset} + size {size} exceeds the constant region of {region_len} bytes"
                    ),
                ));
            }
            if (size as usize) < need {
                return Err(too_short(size as usize));
            }
            let start = region.start + offset as usize;
            source
                .payload
                .get(start..start + need)
                .map(<[u8]>::to_vec)
                .ok_or(too_short(0))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn parse_quant(
    i: usize,
    datatype: Datatype,
    tag: u8,
    table: Option<Table<'_>>,
    dims: &Dims,
    source: &ConstantSource<'_>,
    constant_data: &etch_format::flatbuf::Tables<'_>,
    constant_buffer: &etch_format::flatbuf::Tables<'_>,
) -> Result<Quantization, BackendError> {
    let field = |name: &str| format!("xvalues[{i}].quant_params.{name}");
    let table = table.ok_or_else(|| invalid(field("value"), "missing"))?;
    let p = FieldPath::Root.field("quant_params");
    let channel_dim = |id: u16| -> Result<usize, BackendError> {
        let c = table.scalar::<i32>(id, 0, &p.field("channel_dim")).fb()?;
        usize::try_from(c)
            .ok()
            .filter(|&c| c < dims.rank().max(1))
            .ok_or_else(|| invalid(field("channel_dim"), format!("{c} out of range")))
    };
    let scales_f32 = |id: u16, buf_id: u16, num_id: u16, expect: usize, bf16: bool| {
        let idx = table
            .scalar::<u32>(buf_id, 0, &p.field("scale_buffer_idx"))
            .fb()?;
        if idx != 0 {
            let num = table
                .scalar::<u32>(num_id, 0, &p.field("num_scales"))
                .fb()? as usize;
            if num != expect {
                return Err(invalid(
                    field("num_scales"),
                    format!("{num} scales, the value needs {expect}"),
                ));
            }
            let width = if bf16 { 2 } else { 4 };
            constant_bytes(
                idx,
                expect * width,
                &field("scale_buffer_idx"),
                source,
                constant_data,
                constant_buffer,
            )
        } else {
            let v = table
                .vector_or_empty::<f32>(id, MAX_ITEMS, &p.field("scale"))
                .fb()?;
            if v.len() != expect {
                return Err(invalid(
                    field("scale"),
                    format!("{} scales, the value needs {expect}", v.len()),
                ));
            }
            Ok(v.bytes().to_vec())
        }
    };
    // Scales as `xnn_define_quantized_tensor_value` and
    // `xnn_define_channelwise_quantized_tensor_value` require them: normal and positive.
    let check_scale = |s: f32, what: String| {
        if s > 0.0 && s.is_normal() {
            Ok(())
        } else {
            Err(invalid(
                what,
                format!("scale {s} is not finite, normal and positive"),
            ))
        }
    };
    match tag {
        1 => {
            if !matches!(
                datatype,
                Datatype::QcInt8 | Datatype::QcInt32 | Datatype::QcInt4
            ) {
                return Err(invalid(
                    field("type"),
                    format!("per-channel quantization of a {} value", datatype.name()),
                ));
            }
            let cd = channel_dim(1)?;
            let bytes = scales_f32(0, 2, 3, dims.get(cd), false)?;
            let scales: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
            for (c, &s) in scales.iter().enumerate() {
                check_scale(s, field(&format!("scale[{c}]")))?;
            }
            Ok(Quantization::PerChannel {
                channel_dim: cd,
                scales,
            })
        }
        2 => {
            let scale = table.scalar::<f32>(0, 0.0, &p.field("scale")).fb()?;
            let zero_point = table.scalar::<i32>(1, 0, &p.field("zero_point")).fb()?;
            check_scale(scale, field("scale"))?;
            let range = match datatype {
                Datatype::QInt8 => -128..=127,
                Datatype::QUInt8 => 0..=255,
                Datatype::QInt32 => 0..=0,
                other => {
                    return Err(invalid(
                        field("type"),
                        format!("per-tensor quantization of a {} value", other.name()),
                    ));
                }
            };
            if !range.contains(&zero_point) {
                return Err(invalid(
                    field("zero_point"),
                    format!("{zero_point} is out of range for {}", datatype.name()),
                ));
            }
            Ok(Quantization::PerTensor { scale, zero_point })
        }
        3 => {
            let n = table
                .scalar::<i32>(0, 0, &p.field("num_nonbatch_dims"))
                .fb()?;
            let n = usize::try_from(n)
                .ok()
                .filter(|&n| n <= dims.rank())
                .ok_or_else(|| invalid(field("num_nonbatch_dims"), format!("{n} out of range")))?;
            Ok(Quantization::PerTokenDynamic {
                num_nonbatch_dims: n,
            })
        }
        4 => {
            let cd = channel_dim(1)?;
            let gs = table.scalar::<i32>(2, 0, &p.field("group_size")).fb()?;
            let ic = dims.get(1);
            let gs = usize::try_from(gs)
                .ok()
                .filter(|&g| g > 0 && dims.rank() == 2 && ic.is_multiple_of(g))
                .ok_or_else(|| {
                    invalid(field("group_size"), format!("{gs} does not divide {ic}"))
                })?;
            let expect = dims.get(0) * (ic / gs);
            let idx = table
                .scalar::<u32>(4, 0, &p.field("scale_buffer_idx"))
                .fb()?;
            let scales_bf16 = if idx != 0 {
                let bytes = scales_f32(0, 4, 5, expect, true)?;
                bytemuck::pod_collect_to_vec(&bytes)
            } else {
                // Old files: fp32 scales, converted as `XNNCompiler.cpp` does (x 1.00389105,
                // then truncated to bf16).
                let bytes = scales_f32(0, 4, 5, expect, false)?;
                let f: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
                f.iter()
                    .map(|&s| ((s * 1.003_891_f32).to_bits() >> 16) as u16)
                    .collect()
            };
            Ok(Quantization::PerChannelGroup {
                channel_dim: cd,
                group_size: gs,
                scales_bf16,
            })
        }
        other => Err(invalid(
            field("type"),
            format!("unknown quantization kind {other}"),
        )),
    }
}

fn parse_nodes(
    root: &Table<'_>,
    values: &[ValueDef],
    index_of: &HashMap<u32, usize>,
) -> Result<Vec<NodeDef>, BackendError> {
    let root_path = FieldPath::Root;
    let xnodes_path = root_path.field("xnodes");
    let xnodes = root.tables(1, MAX_ITEMS, &xnodes_path).fb()?;
    let mut nodes = Vec::with_capacity(xnodes.len());
    for i in 0..xnodes.len() {
        let path = xnodes_path.index(i);
        let xnode = xnodes.get(i, &path).fb()?;
        let (tag, table) = xnode.union(0, &path.field("xnode_union")).fb()?;
        let kind = NodeKind::from_tag(tag).ok_or_else(|| {
            invalid(
                format!("xnodes[{i}].xnode_union"),
                format!("unknown node kind {tag}"),
            )
        })?;
        let table =
            table.ok_or_else(|| invalid(format!("xnodes[{i}].{}", kind.name()), "missing"))?;
        let (output_min, output_max) = match xnode.table(3, &path.field("output_min_max")).fb()? {
            Some(t) => {
                let mp = path.field("output_min_max");
                (
                    t.scalar::<f32>(0, 0.0, &mp.field("output_min")).fb()?,
                    t.scalar::<f32>(1, 0.0, &mp.field("output_max")).fb()?,
                )
            }
            None => (f32::NEG_INFINITY, f32::INFINITY),
        };
        if output_min.is_nan() || output_max.is_nan() || output_min > output_max {
            return Err(invalid(
                format!("xnodes[{i}].output_min_max"),
                format!("[{output_min}, {output_max}] is not a range"),
            ));
        }
        let reader = NodeReader {
            i,
            kind,
            table,
            index_of,
        };
        let mut node = reader.blank(output_min, output_max);
        crate::nodes::read(&reader, &mut node)?;
        crate::nodes::datatypes::check(values, i, &node)?;
        nodes.push(node);
    }
    Ok(nodes)
}

/// fp16 constant bytes as fp32 bytes.
fn widen_f16(bytes: &[u8]) -> Vec<u8> {
    bytes
        .chunks_exact(2)
        .flat_map(|b| {
            half::f16::from_le_bytes([b[0], b[1]])
                .to_f32()
                .to_le_bytes()
        })
        .collect()
}

/// Dynamically quantized convolutions (`Conv2d` of a qdint8 input, a `Convert` of its
/// fp32 input per image, and a qcint8 filter) run as fp32 convolutions: the qdint8
/// value becomes fp32 values rounded through int8 with its per-row parameters
/// (`(q - zero point) / scale`, exactly what the integer product weighs), and the
/// filter is dequantized when the node is planned. Every reader of such a value must be
/// a convolution.
fn round_trip_dynamic_conv_inputs(
    values: &mut [ValueDef],
    nodes: &[NodeDef],
) -> Result<(), BackendError> {
    for (i, node) in nodes.iter().enumerate() {
        let Some(&Some(x)) = node.inputs.first() else {
            continue;
        };
        if node.kind != NodeKind::Conv2d || values[x].datatype != Datatype::QdInt8 {
            continue;
        }
        let Some(Quantization::PerTokenDynamic { num_nonbatch_dims }) = values[x].quant else {
            continue;
        };
        let other_reader = nodes
            .iter()
            .position(|n| n.kind != NodeKind::Conv2d && n.inputs.iter().flatten().any(|&v| v == x));
        if let Some(j) = other_reader {
            return Err(BackendError::Unsupported(format!(
                "XNNPACK node {} (xnodes[{j}]) reads the dynamically quantized input of Conv2d (xnodes[{i}])",
                nodes[j].kind.name()
            )));
        }
        let v = &mut values[x];
        v.datatype = Datatype::Fp32;
        v.quant = None;
        v.qd8_round_trip = Some(num_nonbatch_dims.max(1));
    }
    Ok(())
}

/// Values are defined in order and nodes run in order: every input must be an external
/// input, a constant, or the output of an earlier node; every output is written by
/// exactly one node and is neither constant nor an external input.
fn check_dataflow(values: &[ValueDef], nodes: &[NodeDef]) -> Result<(), BackendError> {
    let mut defined: Vec<bool> = values
        .iter()
        .map(|v| v.constant.is_some() || v.external.is_some_and(|e| e.input))
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        let name = node.kind.name();
        for (k, input) in node.inputs.iter().enumerate() {
            if let Some(v) = *input
                && !defined[v]
            {
                return Err(invalid(
                    format!("xnodes[{i}].{name}.inputs[{k}]"),
                    format!(
                        "value id {} is read before any node writes it",
                        values[v].id
                    ),
                ));
            }
        }
        for (k, &out) in node.outputs.iter().enumerate() {
            if defined[out] {
                return Err(invalid(
                    format!("xnodes[{i}].{name}.output_id"),
                    format!(
                        "value id {} (output {k}) is already defined (constant, input, or an earlier node's output)",
                        values[out].id
                    ),
                ));
            }
            defined[out] = true;
        }
    }
    for (i, v) in values.iter().enumerate() {
        if v.external.is_some_and(|e| e.output) && !defined[i] {
            return Err(invalid(
                format!("xvalues[{i}].flags"),
                format!("external output id {} is written by no node", v.id),
            ));
        }
    }
    Ok(())
}
