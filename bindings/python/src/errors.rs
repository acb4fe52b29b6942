//! Python exceptions for etch's errors.
//!
//! * `etch.InputError`: a bad method input (count, kind, dtype, shape, value). It is a
//!   `ValueError` and, so that scripts written for `executorch.runtime` (which raises
//!   `RuntimeError` there) keep working, a `RuntimeError` too.
//! * `etch.EtchError` (a `RuntimeError`): anything else etch reports while loading or
//!   running a program.
//! * `KeyError` for an unknown method name, `FileNotFoundError` for a missing file.

use etch_llm::LlmError;
use etch_runtime::RuntimeError;
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple, PyType};

static INPUT_ERROR: GILOnceCell<Py<PyType>> = GILOnceCell::new();
static ETCH_ERROR: GILOnceCell<Py<PyType>> = GILOnceCell::new();

fn make_class<'py>(
    py: Python<'py>,
    name: &str,
    bases: Bound<'py, PyTuple>,
    doc: &str,
) -> PyResult<Py<PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__module__", "etch")?;
    namespace.set_item("__doc__", doc)?;
    let class = py
        .get_type::<PyType>()
        .call1((name, bases, namespace))?
        .downcast_into::<PyType>()?;
    Ok(class.unbind())
}

/// `etch.InputError(ValueError, RuntimeError)`.
pub fn input_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    INPUT_ERROR
        .get_or_try_init(py, || {
            let bases = PyTuple::new(
                py,
                [
                    py.get_type::<PyValueError>(),
                    py.get_type::<PyRuntimeError>(),
                ],
            )?;
            make_class(
                py,
                "InputError",
                bases,
                "A method input etch cannot take: wrong count, kind, dtype, shape or value. \
                 The message names the method and the input.",
            )
        })
        .map(|t| t.bind(py))
}

/// `etch.EtchError(RuntimeError)`.
pub fn etch_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    ETCH_ERROR
        .get_or_try_init(py, || {
            let bases = PyTuple::new(py, [py.get_type::<PyRuntimeError>()])?;
            make_class(
                py,
                "EtchError",
                bases,
                "etch could not load or run a program (the message says what and where).",
            )
        })
        .map(|t| t.bind(py))
}

fn raise(class: PyResult<&Bound<'_, PyType>>, message: String) -> PyErr {
    match class {
        Ok(class) => PyErr::from_type(class.clone(), message),
        Err(e) => e,
    }
}

/// An `etch.InputError` with this message.
pub fn input_error(message: impl Into<String>) -> PyErr {
    Python::with_gil(|py| raise(input_error_type(py), message.into()))
}

/// An `etch.EtchError` with this message.
pub fn etch_error(message: impl Into<String>) -> PyErr {
    Python::with_gil(|py| raise(etch_error_type(py), message.into()))
}

/// True for the runtime errors that describe a bad input.
fn is_input_error(e: &RuntimeError) -> bool {
    matches!(
        e,
        RuntimeError::InputCount { .. }
            | RuntimeError::InputKind { .. }
            | RuntimeError::InputDtype { .. }
            | RuntimeError::InputShape { .. }
            | RuntimeError::InputValue { .. }
            | RuntimeError::InputNotSet { .. }
    )
}

/// The Python exception for a runtime error.
pub fn runtime_error(e: RuntimeError) -> PyErr {
    match &e {
        RuntimeError::MethodNotFound { .. } => PyKeyError::new_err(e.to_string()),
        _ if is_input_error(&e) => input_error(e.to_string()),
        _ => etch_error(e.to_string()),
    }
}

/// The Python exception for a text-generation error.
pub fn llm_error(e: LlmError) -> PyErr {
    match e {
        LlmError::Runtime(e) => runtime_error(e),
        e @ (LlmError::EmptyPrompt
        | LlmError::PromptTooLong { .. }
        | LlmError::TokenOutOfRange { .. }
        | LlmError::Sampling(_)) => PyValueError::new_err(e.to_string()),
        e => etch_error(e.to_string()),
    }
}
