//! `etch.MethodMeta` and `etch.ValueMeta`: what a method takes and returns.

use etch_runtime::format::ShapeDynamism;
use etch_runtime::{MethodMeta as RustMethodMeta, ValueInfo};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::dtype::numpy_name;

/// One input or output of a method: a tensor (dtype, shape, dynamism) or a scalar whose
/// value was fixed at export.
#[pyclass(module = "etch", frozen, name = "ValueMeta")]
#[derive(Clone)]
pub struct ValueMeta {
    info: ValueInfo,
}

#[pymethods]
impl ValueMeta {
    /// "tensor", "int", "float", "bool", "str", "none", or the file's tag for other kinds.
    #[getter]
    fn kind(&self) -> &'static str {
        match &self.info {
            ValueInfo::None => "none",
            ValueInfo::Int(_) => "int",
            ValueInfo::Double(_) => "float",
            ValueInfo::Bool(_) => "bool",
            ValueInfo::String(_) => "str",
            ValueInfo::Tensor(_) => "tensor",
            ValueInfo::Other(k) => k,
        }
    }

    /// The numpy dtype name of a tensor ("float32", "int64", ...; "bfloat16" for bf16,
    /// which travels as uint16 bits); None for scalars.
    #[getter]
    fn dtype(&self) -> Option<String> {
        match &self.info {
            ValueInfo::Tensor(t) => Some(
                numpy_name(t.dtype)
                    .map(str::to_string)
                    .unwrap_or_else(|| t.dtype.name().to_string()),
            ),
            _ => None,
        }
    }

    /// The ExecuTorch `ScalarType` code of a tensor's dtype (6 is float32, 4 is int64).
    #[getter]
    fn scalar_type(&self) -> Option<i32> {
        match &self.info {
            ValueInfo::Tensor(t) => Some(t.dtype as i32),
            _ => None,
        }
    }

    /// A tensor's sizes as stored in the program: the upper bounds when it is dynamic.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        match &self.info {
            ValueInfo::Tensor(t) => Ok(Some(PyTuple::new(py, &t.sizes)?)),
            _ => Ok(None),
        }
    }

    /// "static" (sizes never change), "bound" (each size at most `shape`'s) or "unbound".
    #[getter]
    fn dynamism(&self) -> Option<&'static str> {
        match &self.info {
            ValueInfo::Tensor(t) => Some(match t.dynamism {
                ShapeDynamism::Static => "static",
                ShapeDynamism::DynamicBound => "bound",
                ShapeDynamism::DynamicUnbound => "unbound",
            }),
            _ => None,
        }
    }

    /// True when a tensor's bytes live in the method's planned memory.
    #[getter]
    fn memory_planned(&self) -> Option<bool> {
        match &self.info {
            ValueInfo::Tensor(t) => Some(t.memory_planned),
            _ => None,
        }
    }

    /// Bytes of a tensor at `shape`.
    #[getter]
    fn nbytes(&self) -> Option<usize> {
        match &self.info {
            ValueInfo::Tensor(t) => Some(t.nbytes()),
            _ => None,
        }
    }

    /// The value a scalar input or output was traced with; None for tensors.
    #[getter]
    fn value(&self, py: Python<'_>) -> PyResult<PyObject> {
        Ok(match &self.info {
            ValueInfo::Int(v) => v.into_pyobject(py)?.into_any().unbind(),
            ValueInfo::Double(v) => v.into_pyobject(py)?.into_any().unbind(),
            ValueInfo::Bool(v) => v.into_pyobject(py)?.to_owned().into_any().unbind(),
            ValueInfo::String(v) => v.into_pyobject(py)?.into_any().unbind(),
            _ => py.None(),
        })
    }

    fn __repr__(&self) -> String {
        match &self.info {
            ValueInfo::Tensor(t) => format!(
                "ValueMeta(kind='tensor', dtype='{}', shape={:?}, dynamism='{}', memory_planned={})",
                self.dtype().unwrap_or_default(),
                t.sizes,
                self.dynamism().unwrap_or("?"),
                if t.memory_planned { "True" } else { "False" }
            ),
            ValueInfo::Int(v) => format!("ValueMeta(kind='int', value={v})"),
            ValueInfo::Double(v) => format!("ValueMeta(kind='float', value={v:?})"),
            ValueInfo::Bool(v) => {
                format!(
                    "ValueMeta(kind='bool', value={})",
                    if *v { "True" } else { "False" }
                )
            }
            ValueInfo::String(v) => format!("ValueMeta(kind='str', value={v:?})"),
            _ => format!("ValueMeta(kind='{}')", self.kind()),
        }
    }
}

/// What a method takes, returns and needs, read from the program without loading it.
#[pyclass(module = "etch", frozen, name = "MethodMeta")]
pub struct MethodMeta {
    meta: RustMethodMeta,
}

impl MethodMeta {
    pub fn new(meta: RustMethodMeta) -> Self {
        Self { meta }
    }
}

fn describe<'py>(py: Python<'py>, infos: &[ValueInfo]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        infos.iter().map(|info| ValueMeta { info: info.clone() }),
    )
}

#[pymethods]
impl MethodMeta {
    /// The method's name.
    #[getter]
    fn name(&self) -> &str {
        &self.meta.name
    }

    /// Each input's description, in order.
    #[getter]
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        describe(py, &self.meta.inputs)
    }

    /// Each output's description, in order.
    #[getter]
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        describe(py, &self.meta.outputs)
    }

    /// Sizes in bytes of the planned memory buffers a session allocates.
    #[getter]
    fn planned_buffer_sizes(&self) -> Vec<u64> {
        self.meta.planned_buffer_sizes.clone()
    }

    /// Operator names (`namespace::name.overload`) the method calls.
    #[getter]
    fn operators(&self) -> Vec<String> {
        self.meta.operators.clone()
    }

    /// Number of instructions.
    #[getter]
    fn instructions(&self) -> usize {
        self.meta.instructions
    }

    /// True when the method calls a delegate (XNNPACK).
    #[getter]
    fn uses_backend(&self) -> bool {
        self.meta.uses_backend
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let show = |infos: &[ValueInfo]| -> PyResult<String> {
            Ok(describe(py, infos)?.repr()?.to_string())
        };
        Ok(format!(
            "MethodMeta(name={:?}, inputs={}, outputs={})",
            self.meta.name,
            show(&self.meta.inputs)?,
            show(&self.meta.outputs)?
        ))
    }
}
