//! FlatBuffers `executorch_flatbuffer` tables to the owned [`Program`] model.
//!
//! This pass checks everything local to a field: offsets, UTF-8, union tags, enum
//! values, negative indices, tensor rank, dim order, size overflow, limits. Checks
//! that relate fields to each other (an index against its table, a value's kind,
//! planned memory ranges) are in [`super::validate`].
//!
//! As ExecuTorch's `Program::load` and `Program::load_method`, a program's load reads
//! the program-level tables and only the name of each execution plan
//! ([`parse_program`]); a plan is parsed when its method is loaded ([`parse_plan_at`]),
//! so one method etch cannot read leaves the others usable.

use crate::error::{FormatError, Result};
use crate::flatbuf::{Buffer, FieldPath, Table, Tables};
use crate::limits::*;
use crate::program::model::*;
use crate::{ScalarType, ShapeDynamism};

/// Field ids of schema/program.fbs (brief §1.3).
mod id {
    pub mod program {
        pub const VERSION: u16 = 0;
        pub const EXECUTION_PLAN: u16 = 1;
        pub const CONSTANT_BUFFER: u16 = 2;
        pub const BACKEND_DELEGATE_DATA: u16 = 3;
        pub const SEGMENTS: u16 = 4;
        pub const CONSTANT_SEGMENT: u16 = 5;
        pub const MUTABLE_DATA_SEGMENTS: u16 = 6;
        pub const NAMED_DATA: u16 = 7;
    }
    pub mod plan {
        pub const NAME: u16 = 0;
        pub const VALUES: u16 = 2;
        pub const INPUTS: u16 = 3;
        pub const OUTPUTS: u16 = 4;
        pub const CHAINS: u16 = 5;
        pub const OPERATORS: u16 = 6;
        pub const DELEGATES: u16 = 7;
        pub const NON_CONST_BUFFER_SIZES: u16 = 8;
    }
    pub mod chain {
        pub const INPUTS: u16 = 0;
        pub const OUTPUTS: u16 = 1;
        pub const INSTRUCTIONS: u16 = 2;
    }
    pub mod tensor {
        pub const SCALAR_TYPE: u16 = 0;
        pub const STORAGE_OFFSET: u16 = 1;
        pub const SIZES: u16 = 2;
        pub const DIM_ORDER: u16 = 3;
        pub const DATA_BUFFER_IDX: u16 = 5;
        pub const ALLOCATION_INFO: u16 = 6;
        pub const SHAPE_DYNAMISM: u16 = 8;
        pub const EXTRA_TENSOR_INFO: u16 = 9;
    }
}

/// Union tags of `KernelTypes` (EValue.val).
mod kernel_types {
    pub const NULL: u8 = 1;
    pub const INT: u8 = 2;
    pub const BOOL: u8 = 3;
    pub const DOUBLE: u8 = 4;
    pub const TENSOR: u8 = 5;
    pub const STRING: u8 = 6;
    pub const INT_LIST: u8 = 7;
    pub const DOUBLE_LIST: u8 = 8;
    pub const BOOL_LIST: u8 = 9;
    pub const TENSOR_LIST: u8 = 10;
    pub const OPTIONAL_TENSOR_LIST: u8 = 11;
}

/// Union tags of `InstructionArguments`.
mod instruction_args {
    pub const KERNEL_CALL: u8 = 1;
    pub const DELEGATE_CALL: u8 = 2;
    pub const MOVE_CALL: u8 = 3;
    pub const JUMP_FALSE_CALL: u8 = 4;
    pub const FREE_CALL: u8 = 5;
}

/// What a program's load reads of each execution plan: enough to list it and find it.
#[derive(Debug, Clone)]
pub(crate) struct PlanHeader {
    /// The method name.
    pub name: String,
    /// True when the plan lists delegates (false where that list cannot be read: the
    /// plan's own load then reports why).
    pub has_delegates: bool,
}

/// Parses the program-level tables of the FlatBuffers program data `fb` (file bytes
/// `[0, program_size)`) and the header of each execution plan; the plans themselves
/// are parsed by [`parse_plan_at`] when their method is loaded.
///
/// `segment_base_offset` and `file_len` turn segment offsets into absolute,
/// bounds-checked file ranges.
pub(crate) fn parse_program(
    fb: &[u8],
    segment_base_offset: u64,
    file_len: usize,
) -> Result<(Program, Vec<PlanHeader>)> {
    let buf = Buffer::new(fb);
    let root_path = FieldPath::Root;
    let root = buf.root(&root_path)?;

    let p = root_path.field("version");
    let version = root.scalar::<u32>(id::program::VERSION, 0, &p)?;

    let p = root_path.field("segments");
    let segments = parse_segments(
        root.tables(id::program::SEGMENTS, MAX_SEGMENTS, &p)?,
        &p,
        segment_base_offset,
        file_len,
    )?;

    let p = root_path.field("constant_buffer");
    let buffers = root.tables(id::program::CONSTANT_BUFFER, MAX_CONSTANTS, &p)?;
    let mut constant_buffers = Vec::with_capacity(buffers.len());
    for i in 0..buffers.len() {
        let ep = p.index(i);
        let t = buffers.get(i, &ep)?;
        constant_buffers.push(byte_vector(&t, 0, &ep.field("storage"))?);
    }

    let p = root_path.field("backend_delegate_data");
    let inline = root.tables(
        id::program::BACKEND_DELEGATE_DATA,
        MAX_INLINE_DELEGATE_DATA,
        &p,
    )?;
    let mut backend_delegate_data = Vec::with_capacity(inline.len());
    for i in 0..inline.len() {
        let ep = p.index(i);
        let t = inline.get(i, &ep)?;
        backend_delegate_data.push(byte_vector(&t, 0, &ep.field("data"))?);
    }

    let p = root_path.field("constant_segment");
    let constant_segment = match root.table(id::program::CONSTANT_SEGMENT, &p)? {
        Some(t) => Some(parse_subsegment(&t, &p)?),
        None => None,
    };

    let p = root_path.field("mutable_data_segments");
    let tables = root.tables(id::program::MUTABLE_DATA_SEGMENTS, MAX_SEGMENTS, &p)?;
    let mut mutable_data_segments = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        mutable_data_segments.push(parse_subsegment(&tables.get(i, &ep)?, &ep)?);
    }

    let p = root_path.field("named_data");
    let tables = root.tables(id::program::NAMED_DATA, MAX_NAMED_DATA, &p)?;
    let mut named_data = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        let t = tables.get(i, &ep)?;
        let key = t.required_string(0, &ep.field("key"))?.to_owned();
        let segment_index = t.scalar::<u32>(1, 0, &ep.field("segment_index"))? as usize;
        named_data.push(NamedData { key, segment_index });
    }

    let p = root_path.field("execution_plan");
    let tables = root.tables(id::program::EXECUTION_PLAN, MAX_PLANS, &p)?;
    let mut plans = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        plans.push(parse_plan_header(&tables.get(i, &ep)?, &ep)?);
    }

    let program = Program {
        version,
        constant_buffers,
        backend_delegate_data,
        segments,
        constant_segment,
        mutable_data_segments,
        named_data,
    };
    Ok((program, plans))
}

/// The name of a plan (required: a method without one cannot be asked for) and
/// whether it lists delegates.
fn parse_plan_header(t: &Table<'_>, path: &FieldPath<'_>) -> Result<PlanHeader> {
    let name = t
        .required_string(id::plan::NAME, &path.field("name"))?
        .to_owned();
    let has_delegates = t
        .tables(id::plan::DELEGATES, MAX_DELEGATES, &path.field("delegates"))
        .is_ok_and(|d| !d.is_empty());
    Ok(PlanHeader {
        name,
        has_delegates,
    })
}

/// Parses execution plan `index` of the program data `fb`, whose program-level
/// tables [`parse_program`] has read.
pub(crate) fn parse_plan_at(fb: &[u8], index: usize) -> Result<ExecutionPlan> {
    let buf = Buffer::new(fb);
    let root_path = FieldPath::Root;
    let root = buf.root(&root_path)?;
    let p = root_path.field("execution_plan");
    let tables = root.tables(id::program::EXECUTION_PLAN, MAX_PLANS, &p)?;
    let ep = p.index(index);
    parse_plan(&tables.get(index, &ep)?, &ep)
}

/// `[DataSegment]` (id0 offset: u64, id1 size: u64) to absolute file ranges.
///
/// Files without an extended header have base 0 (the exporter still writes an
/// empty `DataSegment{0, 0}` for them); every range is checked against the file.
pub(crate) fn parse_segments(
    tables: Tables<'_>,
    path: &FieldPath<'_>,
    segment_base_offset: u64,
    file_len: usize,
) -> Result<Vec<ByteRange>> {
    let mut segments = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = path.index(i);
        let t = tables.get(i, &ep)?;
        let offset = t.scalar::<u64>(0, 0, &ep.field("offset"))?;
        let size = t.scalar::<u64>(1, 0, &ep.field("size"))?;
        let range = segment_base_offset
            .checked_add(offset)
            .and_then(|start| Some((start, start.checked_add(size)?)))
            .filter(|(_, end)| *end <= file_len as u64);
        let Some((start, _)) = range else {
            return Err(FormatError::out_of_bounds(
                ep,
                format!(
                    "segment base {segment_base_offset} + offset {offset} + size {size} exceeds the file of {file_len} bytes"
                ),
            ));
        };
        // Both fit in the file length, a usize.
        segments.push(ByteRange {
            offset: start as usize,
            len: size as usize,
        });
    }
    Ok(segments)
}

/// A `[ubyte]` field as an absolute range (the program data starts at file offset 0).
fn byte_vector(t: &Table<'_>, id: u16, path: &FieldPath<'_>) -> Result<ByteRange> {
    let v = t.vector_or_empty::<u8>(id, usize::MAX, path)?;
    let (offset, len) = v.byte_span();
    Ok(ByteRange { offset, len })
}

/// `SubsegmentOffsets`: id0 segment_index: uint, id1 offsets: [uint64].
fn parse_subsegment(t: &Table<'_>, path: &FieldPath<'_>) -> Result<SubsegmentOffsets> {
    let segment_index = t.scalar::<u32>(0, 0, &path.field("segment_index"))? as usize;
    let offsets = t
        .vector_or_empty::<u64>(1, MAX_CONSTANTS, &path.field("offsets"))?
        .iter()
        .collect();
    Ok(SubsegmentOffsets {
        segment_index,
        offsets,
    })
}

/// A non-negative index from the file.
fn to_index(raw: i64, path: &FieldPath<'_>) -> Result<usize> {
    usize::try_from(raw).map_err(|_| FormatError::invalid(path, format!("negative index {raw}")))
}

/// An `[int]` or `[long]` vector of indices.
fn index_list<T>(t: &Table<'_>, id: u16, path: &FieldPath<'_>) -> Result<Vec<usize>>
where
    T: crate::flatbuf::Scalar + Into<i64>,
{
    let v = t.vector_or_empty::<T>(id, MAX_LIST_ITEMS, path)?;
    let mut out = Vec::with_capacity(v.len());
    for (i, raw) in v.iter().enumerate() {
        out.push(to_index(raw.into(), &path.index(i))?);
    }
    Ok(out)
}

fn parse_plan(t: &Table<'_>, path: &FieldPath<'_>) -> Result<ExecutionPlan> {
    let name = t
        .required_string(id::plan::NAME, &path.field("name"))?
        .to_owned();

    let p = path.field("values");
    let tables = t.tables(id::plan::VALUES, MAX_VALUES, &p)?;
    let mut values = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        values.push(parse_value(&tables.get(i, &ep)?, &ep)?);
    }

    let inputs = index_list::<i32>(t, id::plan::INPUTS, &path.field("inputs"))?;
    let outputs = index_list::<i32>(t, id::plan::OUTPUTS, &path.field("outputs"))?;

    let p = path.field("chains");
    let tables = t.tables(id::plan::CHAINS, MAX_CHAINS, &p)?;
    let mut chains = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        chains.push(parse_chain(&tables.get(i, &ep)?, &ep)?);
    }

    let p = path.field("operators");
    let tables = t.tables(id::plan::OPERATORS, MAX_OPERATORS, &p)?;
    let mut operators = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        let op = tables.get(i, &ep)?;
        operators.push(Operator {
            name: op.required_string(0, &ep.field("name"))?.to_owned(),
            overload: op
                .string(1, &ep.field("overload"))?
                .unwrap_or("")
                .to_owned(),
        });
    }

    let p = path.field("delegates");
    let tables = t.tables(id::plan::DELEGATES, MAX_DELEGATES, &p)?;
    let mut delegates = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        delegates.push(parse_delegate(&tables.get(i, &ep)?, &ep)?);
    }

    let p = path.field("non_const_buffer_sizes");
    let sizes =
        t.vector_or_empty::<i64>(id::plan::NON_CONST_BUFFER_SIZES, MAX_PLANNED_BUFFERS, &p)?;
    let mut non_const_buffer_sizes = Vec::with_capacity(sizes.len());
    for (i, size) in sizes.iter().enumerate() {
        let u = u64::try_from(size).map_err(|_| {
            FormatError::invalid(p.index(i), format!("negative buffer size {size}"))
        })?;
        let what = "planned buffer bytes";
        FormatError::check_limit(&p.index(i), what, u, MAX_PLANNED_BUFFER_BYTES)?;
        non_const_buffer_sizes.push(u);
    }

    Ok(ExecutionPlan {
        name,
        values,
        inputs,
        outputs,
        chains,
        operators,
        delegates,
        non_const_buffer_sizes,
    })
}

fn parse_delegate(t: &Table<'_>, path: &FieldPath<'_>) -> Result<BackendDelegate> {
    let id = t.required_string(0, &path.field("id"))?.to_owned();
    let pp = path.field("processed");
    let processed = t.required_table(1, &pp)?;
    let location = processed.scalar::<i8>(0, 0, &pp.field("location"))?;
    let index = processed.scalar::<u32>(1, 0, &pp.field("index"))? as usize;
    let processed = match location {
        0 => DelegateDataReference::Inline(index),
        1 => DelegateDataReference::Segment(index),
        other => {
            return Err(FormatError::UnknownTag {
                path: pp.field("location").to_string(),
                what: "DataLocation",
                tag: other.into(),
            });
        }
    };
    let p = path.field("compile_specs");
    let tables = t.tables(2, MAX_COMPILE_SPECS, &p)?;
    let mut compile_specs = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        let spec = tables.get(i, &ep)?;
        compile_specs.push(CompileSpec {
            key: spec.string(0, &ep.field("key"))?.unwrap_or("").to_owned(),
            value: spec
                .vector_or_empty::<u8>(1, usize::MAX, &ep.field("value"))?
                .bytes()
                .to_vec(),
        });
    }
    Ok(BackendDelegate {
        id,
        processed,
        compile_specs,
    })
}

fn parse_chain(t: &Table<'_>, path: &FieldPath<'_>) -> Result<Chain> {
    let inputs = index_list::<i32>(t, id::chain::INPUTS, &path.field("inputs"))?;
    let outputs = index_list::<i32>(t, id::chain::OUTPUTS, &path.field("outputs"))?;
    let p = path.field("instructions");
    let tables = t.tables(id::chain::INSTRUCTIONS, MAX_INSTRUCTIONS, &p)?;
    let mut instructions = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let ep = p.index(i);
        instructions.push(parse_instruction(&tables.get(i, &ep)?, &ep)?);
    }
    Ok(Chain {
        inputs,
        outputs,
        instructions,
    })
}

/// Reads an `int` index field of an instruction table.
fn index_field(t: &Table<'_>, id: u16, path: &FieldPath<'_>) -> Result<usize> {
    to_index(t.scalar::<i32>(id, 0, path)?.into(), path)
}

fn parse_instruction(t: &Table<'_>, path: &FieldPath<'_>) -> Result<Instruction> {
    use instruction_args::*;
    let tag_path = path.field("instr_args_type");
    let (tag, args) = t.union(0, &tag_path)?;
    let (name, check_tag) = match tag {
        KERNEL_CALL => ("kernel_call", true),
        DELEGATE_CALL => ("delegate_call", true),
        MOVE_CALL => ("move_call", true),
        JUMP_FALSE_CALL => ("jump_false_call", true),
        FREE_CALL => ("free_call", true),
        _ => ("", false),
    };
    if !check_tag {
        return Err(FormatError::UnknownTag {
            path: tag_path.to_string(),
            what: "InstructionArguments tag",
            tag: tag.into(),
        });
    }
    let p = path.field(name);
    let a = args.ok_or_else(|| FormatError::MissingField {
        path: p.to_string(),
    })?;
    Ok(match tag {
        KERNEL_CALL => Instruction::KernelCall {
            op_index: index_field(&a, 0, &p.field("op_index"))?,
            args: index_list::<i32>(&a, 1, &p.field("args"))?,
        },
        DELEGATE_CALL => Instruction::DelegateCall {
            delegate_index: index_field(&a, 0, &p.field("delegate_index"))?,
            args: index_list::<i32>(&a, 1, &p.field("args"))?,
        },
        MOVE_CALL => Instruction::MoveCall {
            move_from: index_field(&a, 0, &p.field("move_from"))?,
            move_to: index_field(&a, 1, &p.field("move_to"))?,
        },
        JUMP_FALSE_CALL => Instruction::JumpFalseCall {
            cond_value_index: index_field(&a, 0, &p.field("cond_value_index"))?,
            destination_instruction: index_field(&a, 1, &p.field("destination_instruction"))?,
        },
        _ => Instruction::FreeCall {
            value_index: index_field(&a, 0, &p.field("value_index"))?,
        },
    })
}

fn parse_value(t: &Table<'_>, path: &FieldPath<'_>) -> Result<Value> {
    use kernel_types::*;
    let tag_path = path.field("val_type");
    let (tag, val) = t.union(0, &tag_path)?;
    let name = match tag {
        NULL => return Ok(Value::Null),
        INT => "int",
        BOOL => "bool",
        DOUBLE => "double",
        TENSOR => "tensor",
        STRING => "string",
        INT_LIST => "int_list",
        DOUBLE_LIST => "double_list",
        BOOL_LIST => "bool_list",
        TENSOR_LIST => "tensor_list",
        OPTIONAL_TENSOR_LIST => "optional_tensor_list",
        _ => {
            return Err(FormatError::UnknownTag {
                path: tag_path.to_string(),
                what: "KernelTypes tag",
                tag: tag.into(),
            });
        }
    };
    let p = path.field(name);
    let v = val.ok_or_else(|| FormatError::MissingField {
        path: p.to_string(),
    })?;
    Ok(match tag {
        INT => Value::Int(v.scalar::<i64>(0, 0, &p.field("int_val"))?),
        BOOL => Value::Bool(v.scalar::<bool>(0, false, &p.field("bool_val"))?),
        DOUBLE => Value::Double(v.scalar::<f64>(0, 0.0, &p.field("double_val"))?),
        STRING => Value::String(
            v.string(0, &p.field("string_val"))?
                .unwrap_or("")
                .to_owned(),
        ),
        TENSOR => Value::Tensor(parse_tensor(&v, &p)?),
        INT_LIST => Value::IntList(index_list::<i64>(&v, 0, &p.field("items"))?),
        DOUBLE_LIST => Value::DoubleList(
            v.vector_or_empty::<f64>(0, MAX_LIST_ITEMS, &p.field("items"))?
                .iter()
                .collect(),
        ),
        BOOL_LIST => Value::BoolList(
            v.vector_or_empty::<bool>(0, MAX_LIST_ITEMS, &p.field("items"))?
                .iter()
                .collect(),
        ),
        TENSOR_LIST => Value::TensorList(index_list::<i32>(&v, 0, &p.field("items"))?),
        _ => {
            let ip = p.field("items");
            let items = v.vector_or_empty::<i32>(0, MAX_LIST_ITEMS, &ip)?;
            let mut out = Vec::with_capacity(items.len());
            for (i, raw) in items.iter().enumerate() {
                out.push(if raw == -1 {
                    None
                } else {
                    Some(to_index(raw.into(), &ip.index(i))?)
                });
            }
            Value::OptionalTensorList(out)
        }
    })
}

/// `Tensor` (brief §1.3), with the per-tensor checks of ExecuTorch's
/// `parseTensor` and `validate_tensor`.
pub(crate) fn parse_tensor(t: &Table<'_>, path: &FieldPath<'_>) -> Result<TensorMeta> {
    use id::tensor::*;
    let p = path.field("scalar_type");
    let code = t.scalar::<i8>(SCALAR_TYPE, 0, &p)?;
    let scalar_type =
        ScalarType::from_code(code.into()).ok_or_else(|| FormatError::UnknownTag {
            path: p.to_string(),
            what: "ScalarType",
            tag: code.into(),
        })?;

    let p = path.field("storage_offset");
    let storage_offset = t.scalar::<i32>(STORAGE_OFFSET, 0, &p)?;
    if storage_offset != 0 {
        return Err(FormatError::Unsupported {
            path: p.to_string(),
            reason: format!("storage offset {storage_offset} (must be 0)"),
        });
    }

    let sp = path.field("sizes");
    let raw_sizes = t
        .vector::<i32>(SIZES, MAX_LIST_ITEMS, &sp)?
        .ok_or_else(|| FormatError::MissingField {
            path: sp.to_string(),
        })?;
    let dp = path.field("dim_order");
    let dim_order: Vec<u8> = t
        .vector::<u8>(DIM_ORDER, MAX_LIST_ITEMS, &dp)?
        .ok_or_else(|| FormatError::MissingField {
            path: dp.to_string(),
        })?
        .iter()
        .collect();
    let (sizes, _) = check_shape(
        raw_sizes.len(),
        raw_sizes.iter(),
        &dim_order,
        scalar_type,
        &sp,
        &dp,
    )?;

    let data_buffer_idx =
        t.scalar::<u32>(DATA_BUFFER_IDX, 0, &path.field("data_buffer_idx"))? as usize;

    let ap = path.field("allocation_info");
    let allocation_info = match t.table(ALLOCATION_INFO, &ap)? {
        Some(a) => {
            let memory_id = a.scalar::<u32>(0, 0, &ap.field("memory_id"))? as usize;
            let low = a.scalar::<u32>(1, 0, &ap.field("memory_offset_low"))?;
            let high = a.scalar::<u32>(2, 0, &ap.field("memory_offset_high"))?;
            Some(AllocationDetails {
                memory_id,
                offset: u64::from(low) | (u64::from(high) << 32),
            })
        }
        None => None,
    };

    let p = path.field("shape_dynamism");
    let shape_dynamism = match t.scalar::<i8>(SHAPE_DYNAMISM, 0, &p)? {
        0 => ShapeDynamism::Static,
        1 => ShapeDynamism::DynamicBound,
        2 => ShapeDynamism::DynamicUnbound,
        other => {
            return Err(FormatError::UnknownTag {
                path: p.to_string(),
                what: "TensorShapeDynamism",
                tag: other.into(),
            });
        }
    };

    let ep = path.field("extra_tensor_info");
    let extra_tensor_info = match t.table(EXTRA_TENSOR_INFO, &ep)? {
        Some(e) => {
            let mutable_data_segments_idx =
                e.scalar::<u64>(0, 0, &ep.field("mutable_data_segments_idx"))?;
            let fully_qualified_name = e
                .string(1, &ep.field("fully_qualified_name"))?
                .map(str::to_owned);
            let lp = ep.field("location");
            let location = match e.scalar::<i8>(2, 0, &lp)? {
                0 => TensorDataLocation::Segment,
                1 => TensorDataLocation::External,
                other => {
                    return Err(FormatError::UnknownTag {
                        path: lp.to_string(),
                        what: "TensorDataLocation",
                        tag: other.into(),
                    });
                }
            };
            Some(ExtraTensorInfo {
                mutable_data_segments_idx,
                fully_qualified_name,
                location,
            })
        }
        None => None,
    };

    Ok(TensorMeta {
        scalar_type,
        sizes,
        dim_order,
        data_buffer_idx,
        allocation_info,
        shape_dynamism,
        extra_tensor_info,
    })
}

/// Checks sizes (>= 0, rank <= [`MAX_RANK`], bytes without overflow, <=
/// [`MAX_TENSOR_BYTES`]) and that `dim_order` is a permutation of `0..rank`.
/// Returns the sizes and the byte count.
pub(crate) fn check_shape(
    rank: usize,
    raw_sizes: impl Iterator<Item = i32>,
    dim_order: &[u8],
    scalar_type: ScalarType,
    sizes_path: &FieldPath<'_>,
    dim_order_path: &FieldPath<'_>,
) -> Result<(Vec<usize>, u64)> {
    FormatError::check_limit(sizes_path, "tensor rank", rank as u64, MAX_RANK as u64)?;
    let mut sizes = Vec::with_capacity(rank);
    let mut nbytes = scalar_type.element_size() as u64;
    for (i, size) in raw_sizes.enumerate() {
        let s = usize::try_from(size).map_err(|_| {
            FormatError::invalid(sizes_path.index(i), format!("negative size {size}"))
        })?;
        // Every partial product is bounded, not only the total, so that
        // `TensorMeta::numel` (an in-order product) can never overflow.
        nbytes = nbytes.saturating_mul(s as u64);
        if nbytes > MAX_TENSOR_BYTES || usize::try_from(nbytes).is_err() {
            return Err(FormatError::LimitExceeded {
                path: sizes_path.index(i).to_string(),
                what: "tensor bytes",
                count: nbytes,
                limit: MAX_TENSOR_BYTES,
            });
        }
        sizes.push(s);
    }
    if dim_order.len() != rank {
        return Err(FormatError::invalid(
            dim_order_path,
            format!(
                "dim_order has {} entries but the tensor has rank {rank}",
                dim_order.len()
            ),
        ));
    }
    let mut seen = [false; MAX_RANK];
    for (i, d) in dim_order.iter().enumerate() {
        let d = usize::from(*d);
        match seen.get_mut(d) {
            Some(s) if d < rank && !*s => *s = true,
            _ => {
                return Err(FormatError::invalid(
                    dim_order_path.index(i),
                    format!("dim_order is not a permutation of 0..{rank} (entry {d})"),
                ));
            }
        }
    }
    Ok((sizes, nbytes))
}
