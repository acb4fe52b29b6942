//! `etch._etch`: the native module of the `etch` Python package (PyO3, abi3).
//!
//! The Python-facing API is documented in `python/etch/_etch.pyi`; `python/etch/`
//! adds the `etch.runtime` module that mirrors `executorch.runtime`.

// The runtime's and LLM layer's errors carry their context by value; they are cold.
#![allow(clippy::result_large_err)]

mod dtype;
mod errors;
mod generator;
mod meta;
mod method;
mod program;

use pyo3::prelude::*;

/// Loads a `.pte` program from a path (str or os.PathLike) or its bytes.
///
/// `load_mode`: "mmap" (default: weights used in place from the page cache), "read"
/// (into heap memory), "mmap-locked", "huge-pages" (into transparent huge pages:
/// faster LLM decode) or "auto" (huge pages for a program without delegates, a map
/// for a delegated one). `threads`: kernel threads, 0 for one per core. `data_path`: a
/// `.ptd` file holding data the program keeps outside the `.pte`. `max_memory`: the
/// most bytes the program and its sessions may hold (read file, planned memory,
/// packed delegate weights); None: the memory the system has available. Past it,
/// loading fails with what was needed, rather than the process being killed.
/// `fold_constants`: do the work that depends only on constants once at load (a
/// permute of a weight, batch norms folded into their convolutions; the default), or
/// run every instruction as the file has it.
#[pyfunction]
#[pyo3(signature = (source, load_mode = "mmap", threads = 0, data_path = None, max_memory = None, fold_constants = true))]
fn load(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    load_mode: &str,
    threads: usize,
    data_path: Option<std::path::PathBuf>,
    max_memory: Option<u64>,
    fold_constants: bool,
) -> PyResult<program::Program> {
    let options = program::LoadOptions {
        load_mode,
        threads,
        data_path,
        max_memory,
        fold_constants,
    };
    program::Program::load(py, source, options)
}

/// The delegate backends etch runs, by the id programs name them with.
#[pyfunction]
fn backend_names() -> Vec<&'static str> {
    etch_runtime::BackendRegistry::with_defaults().ids()
}

/// The operators etch implements (`namespace::name.overload`).
#[pyfunction]
fn operator_names() -> Vec<&'static str> {
    etch_runtime::kernels::Registry::with_defaults().names()
}

#[pymodule]
fn _etch(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(backend_names, m)?)?;
    m.add_function(wrap_pyfunction!(operator_names, m)?)?;
    m.add_class::<program::Program>()?;
    m.add_class::<method::Method>()?;
    m.add_class::<meta::MethodMeta>()?;
    m.add_class::<meta::ValueMeta>()?;
    m.add_class::<generator::TextGenerator>()?;
    m.add_class::<generator::TextStream>()?;
    m.add("InputError", errors::input_error_type(py)?)?;
    m.add("EtchError", errors::etch_error_type(py)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
