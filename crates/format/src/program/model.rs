//! The validated, owned model of a `.pte` program.
//!
//! Metadata (plans, values, instructions) is parsed into plain Rust values at load;
//! tensor bytes are never copied: they are described by [`ByteRange`]s into the
//! file's bytes, each checked against the file length at load.

use crate::ScalarType;

/// A byte range inside the program file (absolute offsets), checked at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteRange {
    pub offset: usize,
    pub len: usize,
}

impl ByteRange {
    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// The optional `eh00` extended header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedHeader {
    pub header_length: u32,
    pub program_size: u64,
    pub segment_base_offset: u64,
    pub segment_data_size: u64,
}

/// Root table: the whole program.
#[derive(Debug, Clone, Default)]
pub struct Program {
    pub version: u32,
    pub execution_plans: Vec<ExecutionPlan>,
    /// Deprecated inline constants (pre-0.7 files); index 0 is reserved.
    pub constant_buffers: Vec<ByteRange>,
    /// Inline delegate payloads.
    pub backend_delegate_data: Vec<ByteRange>,
    /// Segments, as absolute file ranges (segment base already added).
    pub segments: Vec<ByteRange>,
    pub constant_segment: Option<SubsegmentOffsets>,
    pub mutable_data_segments: Vec<SubsegmentOffsets>,
    pub named_data: Vec<NamedData>,
}

/// Offsets of sub-buffers inside one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubsegmentOffsets {
    pub segment_index: usize,
    pub offsets: Vec<u64>,
}

/// A key naming a whole segment (weights shared with delegates, `.ptd` data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedData {
    pub key: String,
    pub segment_index: usize,
}

/// One method of the program.
#[derive(Debug, Clone, Default)]
pub struct ExecutionPlan {
    pub name: String,
    pub values: Vec<Value>,
    /// Indices into `values`.
    pub inputs: Vec<usize>,
    /// Indices into `values`.
    pub outputs: Vec<usize>,
    pub chains: Vec<Chain>,
    pub operators: Vec<Operator>,
    pub delegates: Vec<BackendDelegate>,
    /// Index 0 is a reserved placeholder; entry `i` is the size of memory id `i`.
    pub non_const_buffer_sizes: Vec<u64>,
}

/// A sequence of instructions.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
    pub instructions: Vec<Instruction>,
}

/// One instruction; every index has been checked against its table at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    KernelCall {
        op_index: usize,
        args: Vec<usize>,
    },
    DelegateCall {
        delegate_index: usize,
        args: Vec<usize>,
    },
    MoveCall {
        move_from: usize,
        move_to: usize,
    },
    JumpFalseCall {
        cond_value_index: usize,
        destination_instruction: usize,
    },
    FreeCall {
        value_index: usize,
    },
}

/// An operator table entry, e.g. `aten::add` with overload `out`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub name: String,
    pub overload: String,
}

impl Operator {
    /// `namespace::name.overload` (or `namespace::name` when the overload is empty),
    /// the key the kernel registry uses.
    pub fn qualified_name(&self) -> String {
        if self.overload.is_empty() {
            self.name.clone()
        } else {
            format!("{}.{}", self.name, self.overload)
        }
    }
}

/// A delegate (backend) call target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendDelegate {
    pub id: String,
    pub processed: DelegateDataReference,
    pub compile_specs: Vec<CompileSpec>,
}

/// Where a delegate payload lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelegateDataReference {
    /// Index into `Program::backend_delegate_data`.
    Inline(usize),
    /// Index into `Program::segments`.
    Segment(usize),
}

/// A key/value compile option handed to a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileSpec {
    pub key: String,
    pub value: Vec<u8>,
}

/// A value slot of an execution plan (the format's `EValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Double(f64),
    Bool(bool),
    String(String),
    Tensor(TensorMeta),
    /// Items are **value indices** of Int values (checked at load), not literals.
    IntList(Vec<usize>),
    DoubleList(Vec<f64>),
    BoolList(Vec<bool>),
    /// Items are value indices of Tensor values.
    TensorList(Vec<usize>),
    /// Items are value indices of Tensor or Null values; `None` for -1.
    OptionalTensorList(Vec<Option<usize>>),
}

impl Value {
    /// The tag name, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "Null",
            Value::Int(_) => "Int",
            Value::Double(_) => "Double",
            Value::Bool(_) => "Bool",
            Value::String(_) => "String",
            Value::Tensor(_) => "Tensor",
            Value::IntList(_) => "IntList",
            Value::DoubleList(_) => "DoubleList",
            Value::BoolList(_) => "BoolList",
            Value::TensorList(_) => "TensorList",
            Value::OptionalTensorList(_) => "OptionalTensorList",
        }
    }
}

/// How a tensor's shape may change at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShapeDynamism {
    #[default]
    Static,
    /// Sizes in the file are upper bounds (by element count).
    DynamicBound,
    DynamicUnbound,
}

/// Where a constant's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TensorDataLocation {
    #[default]
    Segment,
    External,
}

/// Planned-memory placement of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationDetails {
    /// 1-based memory id (0 is reserved and rejected at load).
    pub memory_id: usize,
    pub offset: u64,
}

/// Optional extra tensor information.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtraTensorInfo {
    pub mutable_data_segments_idx: u64,
    pub fully_qualified_name: Option<String>,
    pub location: TensorDataLocation,
}

/// Tensor metadata as stored in the file, validated at load.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TensorMeta {
    pub scalar_type: ScalarType,
    /// Sizes (upper bounds for dynamic tensors); each is >= 0.
    pub sizes: Vec<usize>,
    /// A permutation of `0..sizes.len()`.
    pub dim_order: Vec<u8>,
    /// Index into the constant table (0 = none).
    pub data_buffer_idx: usize,
    pub allocation_info: Option<AllocationDetails>,
    pub shape_dynamism: ShapeDynamism,
    pub extra_tensor_info: Option<ExtraTensorInfo>,
}

impl TensorMeta {
    /// Number of elements at the stored sizes.
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    /// Bytes at the stored sizes (checked against overflow at load).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.scalar_type.element_size()
    }

    /// True when the tensor's bytes live in planned memory.
    pub fn is_memory_planned(&self) -> bool {
        self.allocation_info.is_some()
    }
}
