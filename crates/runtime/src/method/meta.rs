//! Static descriptions of a method's inputs and outputs.

use etch_format::{ExecutionPlan, ScalarType, ShapeDynamism, Value as FileValue};

/// A tensor input's or output's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: ScalarType,
    /// Sizes in the file (upper bounds when dynamic).
    pub sizes: Vec<usize>,
    pub dim_order: Vec<u8>,
    pub dynamism: ShapeDynamism,
    /// True when its bytes live in planned memory.
    pub memory_planned: bool,
}

impl TensorInfo {
    /// Bytes at the stored sizes.
    pub fn nbytes(&self) -> usize {
        self.sizes.iter().product::<usize>() * self.dtype.element_size()
    }
}

/// One input's or output's description.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueInfo {
    None,
    Int(i64),
    Double(f64),
    Bool(bool),
    String(String),
    Tensor(TensorInfo),
    /// A list or other kind methods rarely take or return.
    Other(&'static str),
}

impl ValueInfo {
    /// The tag name.
    pub fn kind(&self) -> &'static str {
        match self {
            ValueInfo::None => "None",
            ValueInfo::Int(_) => "Int",
            ValueInfo::Double(_) => "Double",
            ValueInfo::Bool(_) => "Bool",
            ValueInfo::String(_) => "String",
            ValueInfo::Tensor(_) => "Tensor",
            ValueInfo::Other(k) => k,
        }
    }

    pub(crate) fn from_file(v: &FileValue) -> Self {
        match v {
            FileValue::Null => ValueInfo::None,
            FileValue::Int(i) => ValueInfo::Int(*i),
            FileValue::Double(d) => ValueInfo::Double(*d),
            FileValue::Bool(b) => ValueInfo::Bool(*b),
            FileValue::String(s) => ValueInfo::String(s.clone()),
            FileValue::Tensor(t) => ValueInfo::Tensor(TensorInfo {
                dtype: t.scalar_type,
                sizes: t.sizes.clone(),
                dim_order: t.dim_order.clone(),
                dynamism: t.shape_dynamism,
                memory_planned: t.is_memory_planned(),
            }),
            other => ValueInfo::Other(other.kind()),
        }
    }
}

/// What a method takes, returns and needs.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodMeta {
    pub name: String,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    /// Planned buffer sizes for memory ids 1.. (the file's placeholder 0 dropped).
    pub planned_buffer_sizes: Vec<u64>,
    /// Operator names (`namespace::name.overload`) in table order.
    pub operators: Vec<String>,
    pub instructions: usize,
    /// True when the method calls a delegate (backend).
    pub uses_backend: bool,
}

impl MethodMeta {
    /// Describes a plan from the file.
    pub fn from_plan(plan: &ExecutionPlan) -> Self {
        let describe = |idx: &usize| {
            plan.values
                .get(*idx)
                .map(ValueInfo::from_file)
                .unwrap_or(ValueInfo::Other("missing"))
        };
        Self {
            name: plan.name.clone(),
            inputs: plan.inputs.iter().map(describe).collect(),
            outputs: plan.outputs.iter().map(describe).collect(),
            planned_buffer_sizes: plan
                .non_const_buffer_sizes
                .iter()
                .skip(1)
                .copied()
                .collect(),
            operators: plan.operators.iter().map(|o| o.qualified_name()).collect(),
            instructions: plan.chains.iter().map(|c| c.instructions.len()).sum(),
            uses_backend: !plan.delegates.is_empty(),
        }
    }
}
