//! `etch.Method`: one session of a method; inputs in, numpy arrays out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::Instant;

use etch_runtime::{Method as RustMethod, RuntimeError, Value, ValueInfo};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::dtype::{set_tensor_input, tensor_to_numpy, type_name};
use crate::errors::{etch_error, input_error, runtime_error};
use crate::meta::MethodMeta;

/// A session of one method: its values and planned memory (a KV cache lives there)
/// persist from call to call. One thread runs it at a time; make another session with
/// `Program.method` for parallel work.
#[pyclass(module = "etch", frozen, name = "Method")]
pub struct Method {
    inner: Mutex<RustMethod>,
    /// Nanoseconds spent in the runtime's `execute` (without the inputs' conversion
    /// and the outputs' copies), for measuring the binding's own cost.
    run_nanos: AtomicU64,
}

impl Method {
    pub fn new(method: RustMethod) -> Self {
        Self {
            inner: Mutex::new(method),
            run_nanos: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, RustMethod>> {
        match self.inner.try_lock() {
            Ok(guard) => Ok(guard),
            Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => Err(etch_error(
                "this method is running in another thread; use Program.method(name) for one session per thread",
            )),
        }
    }
}

/// Sets input `index` from a Python object, by the kind the program declares.
fn set_input(method: &mut RustMethod, index: usize, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let info = method.meta().inputs.get(index).cloned();
    let label = || format!("method {:?} input {index}", method.name());
    let wrong = |expected: &str| {
        input_error(format!(
            "{}: expected {expected}, got {}",
            label(),
            type_name(value)
        ))
    };
    let scalar = match info {
        Some(ValueInfo::Tensor(t)) => return set_tensor_input(method, index, t.dtype, value),
        Some(ValueInfo::Int(_)) => Value::Int(value.extract().map_err(|_| wrong("an int"))?),
        Some(ValueInfo::Double(_)) => Value::Double(value.extract().map_err(|_| wrong("a float"))?),
        Some(ValueInfo::Bool(_)) => Value::Bool(value.extract().map_err(|_| wrong("a bool"))?),
        Some(ValueInfo::String(_)) => Value::String(value.extract().map_err(|_| wrong("a str"))?),
        Some(ValueInfo::None) if value.is_none() => Value::None,
        Some(ValueInfo::None) => return Err(wrong("None")),
        Some(ValueInfo::Other(kind)) => {
            return Err(input_error(format!(
                "{}: inputs of kind {kind} cannot be passed from Python",
                label()
            )));
        }
        None => {
            return Err(runtime_error(RuntimeError::InputCount {
                method: method.name().to_string(),
                expected: method.input_count(),
                got: index + 1,
            }));
        }
    };
    method.set_input(index, &scalar).map_err(runtime_error)
}

/// Output `index` as a Python object: a numpy array (copied once out of method memory)
/// or a Python scalar.
fn output(py: Python<'_>, method: &mut RustMethod, index: usize) -> PyResult<PyObject> {
    let is_tensor = matches!(method.meta().outputs.get(index), Some(ValueInfo::Tensor(_)));
    if is_tensor {
        let view = method.output_tensor(index).map_err(runtime_error)?;
        // A channels-last (or other non-default dim order) output is handed over in
        // row-major logical order, as numpy expects.
        let logical;
        let bytes = if view.tensor.is_contiguous() {
            view.bytes
        } else {
            logical = view.to_host();
            &logical.data
        };
        let array = tensor_to_numpy(py, view.tensor.dtype(), view.tensor.sizes(), bytes)?;
        return Ok(array.unbind());
    }
    Ok(match method.output(index).map_err(runtime_error)? {
        Value::None => py.None(),
        Value::Int(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Double(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Bool(v) => v.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::String(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Tensor(t) => tensor_to_numpy(py, t.dtype, &t.sizes, &t.data)?.unbind(),
    })
}

impl Method {
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &[Bound<'py, PyAny>],
    ) -> PyResult<Bound<'py, PyList>> {
        let mut guard = self.lock()?;
        let method = &mut *guard;
        if inputs.len() != method.input_count() {
            return Err(runtime_error(RuntimeError::InputCount {
                method: method.name().to_string(),
                expected: method.input_count(),
                got: inputs.len(),
            }));
        }
        for (index, value) in inputs.iter().enumerate() {
            set_input(method, index, value)?;
        }
        let ran = py.allow_threads(|| {
            let start = Instant::now();
            let ran = method.execute();
            let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.run_nanos.fetch_add(nanos, Ordering::Relaxed);
            ran
        });
        ran.map_err(runtime_error)?;
        let outputs = (0..method.output_count())
            .map(|i| output(py, method, i))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, outputs)
    }
}

#[pymethods]
impl Method {
    /// Sets the inputs (a sequence: numpy arrays, Python scalars, or anything
    /// `numpy.asarray` converts), runs the method with the GIL released, and returns the
    /// outputs: numpy arrays for tensors, Python scalars for scalars.
    fn execute<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let inputs: Vec<Bound<'py, PyAny>> = inputs
            .try_iter()
            .map_err(|_| {
                input_error(format!(
                    "inputs must be a sequence (list or tuple), got {}",
                    type_name(inputs)
                ))
            })?
            .collect::<PyResult<_>>()?;
        self.run(py, &inputs)
    }

    /// `method(*inputs)` is `method.execute(inputs)`.
    #[pyo3(signature = (*inputs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyList>> {
        let inputs: Vec<Bound<'py, PyAny>> = inputs.iter().collect();
        self.run(py, &inputs)
    }

    /// The method's name.
    #[getter]
    fn name(&self) -> PyResult<String> {
        Ok(self.lock()?.name().to_string())
    }

    /// What the method takes and returns.
    #[getter]
    fn meta(&self) -> PyResult<MethodMeta> {
        Ok(MethodMeta::new(self.lock()?.meta().clone()))
    }

    /// Counters since the session was made: executions, instructions, kernel scratch,
    /// planned bytes, and `run_ns`: nanoseconds spent running the method itself (what
    /// `execute` costs beyond it is the binding's: inputs in, outputs copied out).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let guard = self.lock()?;
        let s = guard.stats();
        let d = PyDict::new(py);
        d.set_item("executions", s.executions)?;
        d.set_item("instructions", s.instructions)?;
        d.set_item("scratch_allocations", s.scratch_allocations)?;
        d.set_item("peak_scratch_bytes", s.peak_scratch_bytes)?;
        d.set_item("scratch_fallbacks", s.scratch_fallbacks)?;
        d.set_item("planned_bytes", guard.planned_bytes())?;
        d.set_item("run_ns", self.run_nanos.load(Ordering::Relaxed))?;
        Ok(d)
    }

    fn __repr__(&self) -> PyResult<String> {
        let guard = self.lock()?;
        Ok(format!(
            "Method({:?}, inputs={}, outputs={})",
            guard.name(),
            guard.input_count(),
            guard.output_count()
        ))
    }
}
