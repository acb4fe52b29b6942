//! `etch.load` and `etch.Program`.

use std::path::PathBuf;
use std::sync::Arc;

use etch_runtime::memory::{AlignedBuffer, FILE_ALIGNMENT, SharedBytes};
use etch_runtime::{LoadMode, Program as RustProgram};
use pyo3::exceptions::{PyFileNotFoundError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::errors::{etch_error, runtime_error};
use crate::meta::MethodMeta;
use crate::method::Method;

/// Parses a load mode as the CLI spells it (`_` accepted for `-`).
pub fn parse_load_mode(mode: &str) -> PyResult<LoadMode> {
    match mode.replace('_', "-").as_str() {
        "mmap" => Ok(LoadMode::Mmap),
        "read" => Ok(LoadMode::Read),
        "mmap-locked" => Ok(LoadMode::MmapLocked),
        "huge-pages" => Ok(LoadMode::HugePages),
        "auto" => Ok(LoadMode::Auto),
        _ => Err(PyValueError::new_err(format!(
            "load_mode {mode:?}: expected \"mmap\", \"read\", \"mmap-locked\", \"huge-pages\" or \"auto\""
        ))),
    }
}

/// Where a program comes from: a path, or bytes already in memory.
pub enum ProgramSource {
    Path(PathBuf),
    Bytes(SharedBytes),
}

impl ProgramSource {
    /// Reads a Python `str`/`os.PathLike` (a path) or `bytes`/`bytearray`/buffer (the
    /// file's contents, copied once into aligned memory).
    pub fn extract(source: &Bound<'_, PyAny>, load_mode: LoadMode) -> PyResult<Self> {
        let copy = |bytes: &[u8]| -> PyResult<SharedBytes> {
            if load_mode == LoadMode::HugePages {
                return SharedBytes::copy_to_huge_pages(bytes)
                    .map_err(|e| etch_error(format!("cannot copy the program: {e}")));
            }
            AlignedBuffer::copy_from(bytes, FILE_ALIGNMENT)
                .map(|b| SharedBytes::Heap(Arc::new(b)))
                .map_err(|e| etch_error(format!("cannot copy the program: {e}")))
        };
        if let Ok(bytes) = source.downcast::<PyBytes>() {
            return Ok(Self::Bytes(copy(bytes.as_bytes())?));
        }
        if let Ok(bytes) = source.downcast::<PyByteArray>() {
            return Ok(Self::Bytes(copy(&bytes.to_vec())?));
        }
        if let Ok(path) = source.extract::<PathBuf>() {
            if !path.exists() {
                return Err(PyFileNotFoundError::new_err(format!(
                    "program file {} does not exist",
                    path.display()
                )));
            }
            return Ok(Self::Path(path));
        }
        if source.hasattr("__buffer__")? || source.hasattr("tobytes")? {
            let bytes = source
                .py()
                .import("builtins")?
                .call_method1("bytes", (source,))?;
            return Ok(Self::Bytes(copy(bytes.downcast::<PyBytes>()?.as_bytes())?));
        }
        Err(PyTypeError::new_err(format!(
            "expected a path (str or os.PathLike) or the program's bytes, got {}",
            crate::dtype::type_name(source)
        )))
    }
}

/// A loaded `.pte` program: immutable and shared. Each `method(name)` call makes a new
/// session with its own state (planned memory, so its own KV cache) on the shared
/// weights.
#[pyclass(module = "etch", frozen, name = "Program")]
pub struct Program {
    inner: RustProgram,
    /// Where it came from, for `repr`.
    origin: String,
}

/// The options of `etch.load`.
pub struct LoadOptions<'a> {
    pub load_mode: &'a str,
    pub threads: usize,
    pub data_path: Option<PathBuf>,
    pub max_memory: Option<u64>,
    pub fold_constants: bool,
}

impl Program {
    /// Loads a program (without the GIL for a file: reading it may take a while).
    pub fn load(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        options: LoadOptions<'_>,
    ) -> PyResult<Self> {
        let LoadOptions {
            load_mode,
            threads,
            data_path,
            max_memory,
            fold_constants,
        } = options;
        let mode = parse_load_mode(load_mode)?;
        if let Some(p) = data_path.as_ref().filter(|p| !p.exists()) {
            return Err(PyFileNotFoundError::new_err(format!(
                "data file {} does not exist",
                p.display()
            )));
        }
        let source = ProgramSource::extract(source, mode)?;
        let origin = match &source {
            ProgramSource::Path(p) => p.display().to_string(),
            ProgramSource::Bytes(b) => format!("<{} bytes>", b.as_slice().len()),
        };
        let inner = py
            .allow_threads(|| {
                let builder = match source {
                    ProgramSource::Path(p) => RustProgram::from_path(p),
                    ProgramSource::Bytes(b) => RustProgram::from_bytes(b),
                };
                let builder = match data_path {
                    Some(p) => builder.data_file(p),
                    None => builder,
                };
                let builder = match max_memory {
                    Some(bytes) => builder.max_memory(bytes),
                    None => builder,
                };
                builder
                    .load_mode(mode)
                    .threads(threads)
                    .fold_constants(fold_constants)
                    .build_program()
            })
            .map_err(|e| etch_error(format!("{origin}: {e}")))?;
        Ok(Self { inner, origin })
    }
}

#[pymethods]
impl Program {
    /// Method names, in file order.
    #[getter]
    fn method_names(&self) -> Vec<String> {
        self.inner
            .method_names()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// What a method takes and returns, without loading it. KeyError for an unknown name.
    fn method_meta(&self, name: &str) -> PyResult<MethodMeta> {
        self.inner
            .method_meta(name)
            .map(MethodMeta::new)
            .map_err(runtime_error)
    }

    /// A new session of a method: its own planned memory (a KV cache lives there) on
    /// the program's shared weights and kernel plans. KeyError for an unknown name.
    fn method(&self, py: Python<'_>, name: &str) -> PyResult<Method> {
        let session = py
            .allow_threads(|| self.inner.method(name))
            .map_err(runtime_error)?;
        Ok(Method::new(session))
    }

    /// Threads of the kernel pool the program's sessions run on.
    #[getter]
    fn threads(&self) -> usize {
        self.inner.pool().threads()
    }

    /// Milliseconds spent reading and validating the program.
    #[getter]
    fn load_ms(&self) -> f64 {
        self.inner.load_time().as_secs_f64() * 1e3
    }

    fn __contains__(&self, name: &str) -> bool {
        self.inner.has_method(name)
    }

    fn __repr__(&self) -> String {
        format!(
            "Program({}, methods={:?})",
            self.origin,
            self.inner.method_names()
        )
    }
}
