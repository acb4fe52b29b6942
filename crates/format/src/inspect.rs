//! A serialisable summary of a program, for `etch inspect`.
//!
//! ```no_run
//! use etch_format::{ProgramFile, inspect::ProgramSummary};
//! let file = ProgramFile::read("model.pte")?;
//! let summary = ProgramSummary::new(&file);
//! println!("{}", summary.render_text());
//! # Ok::<(), etch_format::FormatError>(())
//! ```

use std::collections::BTreeSet;
use std::fmt::Write;

use serde::Serialize;

use crate::ShapeDynamism;
use crate::program::ProgramFile;
use crate::program::model::*;

/// Program-level summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgramSummary {
    /// `Program.version`.
    pub version: u32,
    /// Bytes of the whole file.
    pub file_bytes: usize,
    /// Bytes of FlatBuffers program data (headers included).
    pub program_bytes: usize,
    /// Whether the file has an `eh00` extended header.
    pub extended_header: bool,
    /// Segments, as absolute file offsets.
    pub segments: Vec<SegmentSummary>,
    /// Bytes of the constant segment (or of the deprecated inline constant buffers).
    pub constant_data_bytes: usize,
    /// Constant table entries, excluding the reserved entry 0.
    pub constants: usize,
    /// Named-data keys (weights shared with delegates).
    pub named_data: usize,
    /// One entry per method, in file order.
    pub methods: Vec<MethodSummary>,
}

/// One segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SegmentSummary {
    /// Absolute file offset.
    pub offset: usize,
    /// Bytes.
    pub size: usize,
}

/// One method (execution plan). A method that fails validation is listed with its
/// name, `loadable: false` and the reason; its other fields are empty.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodSummary {
    /// Method name.
    pub name: String,
    /// Whether the method's plan passes validation, so that etch can load it.
    pub loadable: bool,
    /// Why the method cannot be loaded, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Method inputs, in order.
    pub inputs: Vec<IoSummary>,
    /// Method outputs, in order.
    pub outputs: Vec<IoSummary>,
    /// `namespace::name.overload`, in operator-table order.
    pub operators: Vec<String>,
    /// For each entry of `operators`, how many KernelCalls use it.
    pub operator_calls: Vec<usize>,
    /// Instructions over all chains.
    pub instructions: usize,
    /// Values (EValues).
    pub values: usize,
    /// Planned memory buffers, memory ids 1.. (the placeholder entry 0 left out).
    pub memory_plan_bytes: Vec<u64>,
    /// Sum of `memory_plan_bytes`.
    pub memory_plan_total: u64,
    /// Bytes of the distinct constant tensors this method uses.
    pub constants_bytes: u64,
    /// Delegates (backend payloads) of this method.
    pub delegates: Vec<DelegateSummary>,
}

/// A method input or output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IoSummary {
    /// The value kind: "Tensor", "Int", "Double", "Bool", ...
    pub kind: String,
    /// The tensor dtype (`f32`, `i64`, ...), `None` for non-tensors.
    pub dtype: Option<String>,
    /// Sizes (upper bounds for dynamic tensors); empty for non-tensors.
    pub shape: Vec<usize>,
    /// True when the tensor's shape may change (`shape_dynamism != Static`).
    pub dynamic: bool,
    /// The tensor's dim order when it is not the default `[0, 1, ..]` (`[0, 2, 3, 1]`
    /// is channels-last); `None` otherwise and for non-tensors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim_order: Option<Vec<u8>>,
}

/// A delegate call target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DelegateSummary {
    /// Backend id, e.g. `XnnpackBackend`.
    pub backend: String,
    /// Bytes of the processed payload.
    pub payload_bytes: usize,
    /// The payload's nodes counted by kind, as the backend reports them after init
    /// (empty until a runtime has initialised the delegate).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<DelegateNodeCount>,
    /// Bytes of weights the initialised delegate holds in its packed layouts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packed_bytes: Option<usize>,
    /// Why the delegate could not be initialised, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How many nodes of one kind a delegate's graph holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DelegateNodeCount {
    /// Node kind, e.g. `FullyConnected`.
    pub kind: String,
    /// Number of nodes of that kind.
    pub count: usize,
}

impl ProgramSummary {
    /// Summarises a loaded program.
    pub fn new(file: &ProgramFile) -> Self {
        let program = file.program();
        let constant_data_bytes = if program.uses_constant_segment() {
            program
                .constant_segment
                .as_ref()
                .filter(|c| c.offsets.len() > 1)
                .and_then(|c| program.segments.get(c.segment_index))
                .map_or(0, |s| s.len)
        } else {
            program
                .constant_buffers
                .iter()
                .fold(0usize, |acc, b| acc.saturating_add(b.len))
        };
        ProgramSummary {
            version: program.version,
            file_bytes: file.bytes().as_slice().len(),
            program_bytes: file.program_size(),
            extended_header: file.header().is_some(),
            segments: program
                .segments
                .iter()
                .map(|s| SegmentSummary {
                    offset: s.offset,
                    size: s.len,
                })
                .collect(),
            constant_data_bytes,
            constants: program.constant_count().saturating_sub(1),
            named_data: program.named_data.len(),
            methods: file
                .plans()
                .map(|(name, plan)| match plan {
                    Ok(plan) => MethodSummary::new(program, plan),
                    Err(e) => MethodSummary::not_loadable(name, e.to_string()),
                })
                .collect(),
        }
    }

    /// A human-readable report.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let not_loadable = self.methods.iter().filter(|m| !m.loadable).count();
        let _ = writeln!(
            out,
            "program: version {}, {} bytes ({} bytes of program data{}), {} segment(s), {} method(s){}",
            self.version,
            self.file_bytes,
            self.program_bytes,
            if self.extended_header {
                ", eh00 header"
            } else {
                ""
            },
            self.segments.len(),
            self.methods.len(),
            if not_loadable > 0 {
                format!(" ({not_loadable} not loadable)")
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            out,
            "constants: {} tensor(s), {} bytes; named data: {} key(s)",
            self.constants, self.constant_data_bytes, self.named_data
        );
        if !self.segments.is_empty() {
            let _ = writeln!(
                out,
                "\nsegments:\n  {:>5}  {:>12}  {:>12}",
                "#", "offset", "size"
            );
            for (i, s) in self.segments.iter().enumerate() {
                let _ = writeln!(out, "  {i:>5}  {:>12}  {:>12}", s.offset, s.size);
            }
        }
        for m in &self.methods {
            m.render_text(&mut out);
        }
        let mut trimmed: String = out
            .lines()
            .map(|l| l.trim_end().to_owned() + "\n")
            .collect();
        trimmed.truncate(trimmed.trim_end().len() + 1);
        trimmed
    }
}

impl MethodSummary {
    fn new(program: &Program, plan: &ExecutionPlan) -> Self {
        let io = |indices: &[usize]| -> Vec<IoSummary> {
            indices
                .iter()
                .map(|i| IoSummary::new(plan.values.get(*i)))
                .collect()
        };
        let mut operator_calls = vec![0usize; plan.operators.len()];
        let mut instructions = 0;
        for chain in &plan.chains {
            instructions += chain.instructions.len();
            for instruction in &chain.instructions {
                if let Instruction::KernelCall { op_index, .. } = instruction
                    && let Some(count) = operator_calls.get_mut(*op_index)
                {
                    *count += 1;
                }
            }
        }
        let mut constants = BTreeSet::new();
        let mut constants_bytes = 0u64;
        for value in &plan.values {
            if let Value::Tensor(t) = value {
                let external = t
                    .extra_tensor_info
                    .as_ref()
                    .is_some_and(|e| e.location == TensorDataLocation::External);
                if t.data_buffer_idx > 0
                    && t.allocation_info.is_none()
                    && !external
                    && constants.insert(t.data_buffer_idx)
                {
                    constants_bytes = constants_bytes.saturating_add(t.nbytes() as u64);
                }
            }
        }
        let memory_plan_bytes: Vec<u64> = plan
            .non_const_buffer_sizes
            .iter()
            .skip(1)
            .copied()
            .collect();
        MethodSummary {
            name: plan.name.clone(),
            loadable: true,
            error: None,
            inputs: io(&plan.inputs),
            outputs: io(&plan.outputs),
            operators: plan
                .operators
                .iter()
                .map(Operator::qualified_name)
                .collect(),
            operator_calls,
            instructions,
            values: plan.values.len(),
            memory_plan_total: memory_plan_bytes
                .iter()
                .fold(0u64, |acc, b| acc.saturating_add(*b)),
            memory_plan_bytes,
            constants_bytes,
            delegates: plan
                .delegates
                .iter()
                .map(|d| DelegateSummary {
                    backend: d.id.clone(),
                    payload_bytes: program.delegate_data(&d.processed).map_or(0, |r| r.len),
                    nodes: Vec::new(),
                    packed_bytes: None,
                    error: None,
                })
                .collect(),
        }
    }

    /// A method whose plan fails validation: its name and why.
    fn not_loadable(name: &str, error: String) -> Self {
        MethodSummary {
            name: name.to_owned(),
            loadable: false,
            error: Some(error),
            inputs: Vec::new(),
            outputs: Vec::new(),
            operators: Vec::new(),
            operator_calls: Vec::new(),
            instructions: 0,
            values: 0,
            memory_plan_bytes: Vec::new(),
            memory_plan_total: 0,
            constants_bytes: 0,
            delegates: Vec::new(),
        }
    }

    fn render_text(&self, out: &mut String) {
        if !self.loadable {
            let _ = writeln!(
                out,
                "\nmethod {}: [not loadable] {}",
                self.name,
                self.error.as_deref().unwrap_or("")
            );
            return;
        }
        let _ = writeln!(
            out,
            "\nmethod {}: {} value(s), {} instruction(s), planned memory {:?} = {} bytes, constants {} bytes",
            self.name,
            self.values,
            self.instructions,
            self.memory_plan_bytes,
            self.memory_plan_total,
            self.constants_bytes
        );
        for (label, list) in [("inputs", &self.inputs), ("outputs", &self.outputs)] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(out, "  {label}:");
            for (i, io) in list.iter().enumerate() {
                let order = match &io.dim_order {
                    Some(o) if o.as_slice() == [0, 2, 3, 1] => "channels-last".to_string(),
                    Some(o) => format!("dim order {o:?}"),
                    None => String::new(),
                };
                let _ = writeln!(
                    out,
                    "    {i:>3}  {:<8} {:<6} {:<20} {}",
                    io.kind,
                    io.dtype.as_deref().unwrap_or("-"),
                    format!("{:?}", io.shape),
                    [if io.dynamic { "dynamic" } else { "" }, order.as_str()]
                        .iter()
                        .filter(|s| !s.is_empty())
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        if !self.operators.is_empty() {
            let width = self
                .operators
                .iter()
                .map(String::len)
                .max()
                .unwrap_or(0)
                .max(8);
            let _ = writeln!(out, "  {:<width$}  calls", "operator");
            for (name, calls) in self.operators.iter().zip(&self.operator_calls) {
                let _ = writeln!(out, "  {name:<width$}  {calls:>5}");
            }
        }
        for (i, d) in self.delegates.iter().enumerate() {
            let _ = write!(
                out,
                "  delegate {i} {}: {} bytes",
                d.backend, d.payload_bytes
            );
            if let Some(packed) = d.packed_bytes {
                let _ = write!(out, ", {packed} bytes packed");
            }
            if let Some(e) = &d.error {
                let _ = write!(out, " (not initialised: {e})");
            }
            let _ = writeln!(out);
            if !d.nodes.is_empty() {
                let total: usize = d.nodes.iter().map(|n| n.count).sum();
                let kinds: Vec<String> = d
                    .nodes
                    .iter()
                    .map(|n| format!("{} {}", n.kind, n.count))
                    .collect();
                let _ = writeln!(out, "    {total} nodes: {}", kinds.join(", "));
            }
        }
    }
}

impl IoSummary {
    fn new(value: Option<&Value>) -> Self {
        match value {
            Some(Value::Tensor(t)) => IoSummary {
                kind: "Tensor".into(),
                dtype: Some(t.scalar_type.name().into()),
                shape: t.sizes.clone(),
                dynamic: t.shape_dynamism != ShapeDynamism::Static,
                dim_order: (!t
                    .dim_order
                    .iter()
                    .enumerate()
                    .all(|(i, &d)| i == d as usize))
                .then(|| t.dim_order.clone()),
            },
            other => IoSummary {
                kind: other.map_or("Null", Value::kind).into(),
                dtype: None,
                shape: Vec::new(),
                dynamic: false,
                dim_order: None,
            },
        }
    }
}
