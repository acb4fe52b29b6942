//! The validated, owned model of a `.pte` program.
//!
//! Metadata (plans, values, instructions) is parsed into plain Rust values at load;
//! tensor bytes are never copied: they are described by [`ByteRange`]s into the
//! file's bytes, each checked against the file length at load.

use crate::{ScalarType, ShapeDynamism};

/// A byte range inside the program file (absolute offsets), checked at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteRange {
    /// Absolute offset of the first byte in the file.
    pub offset: usize,
    /// Number of bytes.
    pub len: usize,
}

impl ByteRange {
    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.offset.saturating_add(self.len)
    }
}

/// The optional `eh00` extended header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedHeader {
    /// Bytes of this header including magic and length (>= 24; 32 when written by EXIR).
    pub header_length: u32,
    /// Bytes of FlatBuffers program data counted from file offset 0.
    pub program_size: u64,
    /// File offset of the first segment; 0 when there are none.
    pub segment_base_offset: u64,
    /// Bytes from `segment_base_offset` to the end of the last segment (0 in old files).
    pub segment_data_size: u64,
}

/// Root table: the program-level data every method shares. The execution plans are
/// not here: [`crate::ProgramFile`] parses and validates each when its method is
/// loaded ([`crate::ProgramFile::load_plan`]).
#[derive(Debug, Clone, Default)]
pub struct Program {
    /// `Program.version` (0 in files seen so far).
    pub version: u32,
    /// Deprecated inline constants (pre-0.7 files); index 0 is reserved.
    pub constant_buffers: Vec<ByteRange>,
    /// Inline delegate payloads.
    pub backend_delegate_data: Vec<ByteRange>,
    /// Segments, as absolute file ranges (segment base already added).
    pub segments: Vec<ByteRange>,
    /// Where constants live (`offsets[data_buffer_idx]` inside `segments[segment_index]`).
    pub constant_segment: Option<SubsegmentOffsets>,
    /// Initial state of mutable planned tensors; the runtime always uses entry 0.
    pub mutable_data_segments: Vec<SubsegmentOffsets>,
    /// Named data in the program's own segments (e.g. XNNPACK weights).
    pub named_data: Vec<NamedData>,
}

/// Offsets of sub-buffers inside one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubsegmentOffsets {
    /// Index into `Program::segments`.
    pub segment_index: usize,
    /// Byte offsets inside that segment; entry 0 is a reserved placeholder.
    pub offsets: Vec<u64>,
}

/// A key naming a whole segment (weights shared with delegates, `.ptd` data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedData {
    /// The key (exact match).
    pub key: String,
    /// Index into `Program::segments`; the key names the whole segment.
    pub segment_index: usize,
}

/// One method of the program.
#[derive(Debug, Clone, Default)]
pub struct ExecutionPlan {
    /// Method name, e.g. `forward`.
    pub name: String,
    /// The value table every index refers to.
    pub values: Vec<Value>,
    /// Indices into `values`.
    pub inputs: Vec<usize>,
    /// Indices into `values`.
    pub outputs: Vec<usize>,
    /// Instruction chains; real programs have exactly one.
    pub chains: Vec<Chain>,
    /// Operator table referenced by `KernelCall::op_index`.
    pub operators: Vec<Operator>,
    /// Delegates referenced by `DelegateCall::delegate_index`.
    pub delegates: Vec<BackendDelegate>,
    /// Index 0 is a reserved placeholder; entry `i` is the size of memory id `i`.
    pub non_const_buffer_sizes: Vec<u64>,
}

/// A sequence of instructions.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    /// Value indices of the chain inputs.
    pub inputs: Vec<usize>,
    /// Value indices of the chain outputs.
    pub outputs: Vec<usize>,
    /// The instructions, executed in order (with jumps).
    pub instructions: Vec<Instruction>,
}

/// One instruction; every index has been checked against its table at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    /// Call operator `op_index` with the values `args` (schema arguments then outputs).
    KernelCall {
        /// Index into `ExecutionPlan::operators`.
        op_index: usize,
        /// Value indices.
        args: Vec<usize>,
    },
    /// Call delegate `delegate_index` with the values `args`.
    DelegateCall {
        /// Index into `ExecutionPlan::delegates`.
        delegate_index: usize,
        /// Value indices.
        args: Vec<usize>,
    },
    /// Copy value `move_from` into value `move_to`.
    MoveCall {
        /// Source value index.
        move_from: usize,
        /// Destination value index.
        move_to: usize,
    },
    /// Jump to `destination_instruction` when value `cond_value_index` is false.
    JumpFalseCall {
        /// Value index of a Bool.
        cond_value_index: usize,
        /// Instruction index inside the same chain.
        destination_instruction: usize,
    },
    /// Release value `value_index` (a tensor's dynamic memory).
    FreeCall {
        /// Value index.
        value_index: usize,
    },
}

/// An operator table entry, e.g. `aten::add` with overload `out`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// `namespace::name`, e.g. `aten::add`.
    pub name: String,
    /// Overload, e.g. `out`; may be empty.
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
    /// Backend id, e.g. `XnnpackBackend`.
    pub id: String,
    /// Where the processed payload lives.
    pub processed: DelegateDataReference,
    /// Options handed to the backend at init.
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
    /// Option name.
    pub key: String,
    /// Option value (opaque bytes).
    pub value: Vec<u8>,
}

/// A value slot of an execution plan (the format's `EValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// No value (`None`).
    Null,
    /// An integer (also SymInts and ScalarType codes).
    Int(i64),
    /// A float.
    Double(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(String),
    /// A tensor.
    Tensor(TensorMeta),
    /// Items are **value indices** of Int values (checked at load), not literals.
    IntList(Vec<usize>),
    /// Literal floats.
    DoubleList(Vec<f64>),
    /// Literal booleans.
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

/// Where a constant's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TensorDataLocation {
    #[default]
    /// Constant bytes live in the program's constant segment.
    Segment,
    /// Constant bytes live in a named data map (`.ptd`), found by `fully_qualified_name`.
    External,
}

/// Planned-memory placement of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationDetails {
    /// 1-based memory id (0 is reserved and rejected at load).
    pub memory_id: usize,
    /// Byte offset inside that buffer (`memory_offset_low | memory_offset_high << 32`).
    pub offset: u64,
}

/// Optional extra tensor information.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtraTensorInfo {
    /// Ignored by ExecuTorch, which always reads `mutable_data_segments[0]`.
    pub mutable_data_segments_idx: u64,
    /// Name used to look external data up.
    pub fully_qualified_name: Option<String>,
    /// Where the data lives.
    pub location: TensorDataLocation,
}

/// Tensor metadata as stored in the file, validated at load.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TensorMeta {
    /// Element type.
    pub scalar_type: ScalarType,
    /// Sizes (upper bounds for dynamic tensors); each is >= 0.
    pub sizes: Vec<usize>,
    /// A permutation of `0..sizes.len()`.
    pub dim_order: Vec<u8>,
    /// Index into the constant table (0 = none).
    pub data_buffer_idx: usize,
    /// Planned-memory placement; `Some` means memory-planned.
    pub allocation_info: Option<AllocationDetails>,
    /// Whether sizes may change at run time.
    pub shape_dynamism: ShapeDynamism,
    /// Extra information (external data, mutable state index).
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
