//! [`Module`]: the convenient way to load a program and run its methods, as upstream's
//! `extension/module`: one session per method, made on first use.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use etch_format::ProgramFile;
use etch_kernels::ThreadPool;
use etch_memory::{AllocatorStats, SharedBytes};

use crate::program::ModuleBuilder;
use crate::{Method, MethodMeta, Program, RuntimeError, Value};

/// A loaded [`Program`] and one session ([`Method`]) per method name, loaded lazily.
///
/// For several sessions of one method (two conversations on one model), use
/// [`Program::method`] directly.
pub struct Module {
    program: Program,
    methods: HashMap<String, Method>,
}

impl Module {
    /// A module over an already loaded program: its sessions share the program's
    /// weights, plans and delegates with every other module and session made from it.
    pub fn from_program(program: Program) -> Self {
        Self::new(program)
    }

    pub(crate) fn new(program: Program) -> Self {
        Module {
            program,
            methods: HashMap::new(),
        }
    }

    /// A builder for a `.pte` file.
    pub fn from_path(path: impl AsRef<Path>) -> ModuleBuilder {
        Program::from_path(path)
    }

    /// A builder for a program already in memory (used zero-copy).
    pub fn from_bytes(bytes: SharedBytes) -> ModuleBuilder {
        Program::from_bytes(bytes)
    }

    /// Loads a file with every default.
    pub fn load(path: impl AsRef<Path>) -> Result<Module, RuntimeError> {
        Self::from_path(path).build()
    }

    /// The shared program (clone it to make more sessions).
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The validated program file.
    pub fn file(&self) -> &ProgramFile {
        self.program.file()
    }

    /// Time spent reading and validating the program.
    pub fn load_time(&self) -> Duration {
        self.program.load_time()
    }

    /// The kernel pool.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        self.program.pool()
    }

    /// Method names in file order.
    pub fn method_names(&self) -> Vec<&str> {
        self.program.method_names()
    }

    /// True when the program has a method of this name.
    pub fn has_method(&self, name: &str) -> bool {
        self.program.has_method(name)
    }

    /// What a method takes and returns, without loading it.
    pub fn method_meta(&self, name: &str) -> Result<MethodMeta, RuntimeError> {
        self.program.method_meta(name)
    }

    /// Loads a method (allocating its planned memory) if it is not loaded yet.
    pub fn load_method(&mut self, name: &str) -> Result<(), RuntimeError> {
        if !self.methods.contains_key(name) {
            let method = self.program.method(name)?;
            self.methods.insert(name.to_string(), method);
        }
        Ok(())
    }

    /// The session of a method (loading it on first use), for setting inputs, running
    /// ([`Method::execute`]) and reading outputs without copies.
    pub fn method_mut(&mut self, name: &str) -> Result<&mut Method, RuntimeError> {
        self.load_method(name)?;
        let program = &self.program;
        self.methods
            .get_mut(name)
            .ok_or_else(|| program.not_found(name))
    }

    /// Takes a method's session out of the module (loading it first), for a caller that
    /// runs it in a loop without a lookup per call. A later use of the name through the
    /// module loads a fresh session.
    pub fn take_method(&mut self, name: &str) -> Result<Method, RuntimeError> {
        self.load_method(name)?;
        self.methods
            .remove(name)
            .ok_or_else(|| self.program.not_found(name))
    }

    /// Sets the inputs, runs the method and copies its outputs out
    /// (upstream's `Module::execute(method_name, inputs)`).
    pub fn execute(&mut self, name: &str, inputs: &[Value]) -> Result<Vec<Value>, RuntimeError> {
        let method = self.method_mut(name)?;
        method.set_inputs(inputs)?;
        method.execute()?;
        method.outputs()
    }

    /// `execute("forward", inputs)`.
    pub fn forward(&mut self, inputs: &[Value]) -> Result<Vec<Value>, RuntimeError> {
        self.execute("forward", inputs)
    }

    /// Output 0 of a method with no inputs (how LLM metadata is stored), if present.
    pub fn get_scalar(&mut self, name: &str) -> Result<Option<Value>, RuntimeError> {
        if !self.has_method(name) {
            return Ok(None);
        }
        Ok(self.execute(name, &[])?.into_iter().next())
    }

    /// Counters of the temp allocators of the loaded sessions, added up.
    pub fn temp_allocator_stats(&self) -> AllocatorStats {
        self.methods
            .values()
            .map(Method::temp_allocator_stats)
            .fold(AllocatorStats::default(), add_stats)
    }

    /// Counters of the planned-memory allocators of the loaded sessions, added up (the
    /// program's own when it was given one for all sessions).
    pub fn memory_allocator_stats(&self) -> AllocatorStats {
        self.program.memory_allocator_stats().unwrap_or_else(|| {
            self.methods
                .values()
                .map(Method::planned_allocator_stats)
                .fold(AllocatorStats::default(), add_stats)
        })
    }

    /// Bytes of planned memory held by loaded sessions.
    pub fn planned_bytes(&self) -> usize {
        self.methods.values().map(Method::planned_bytes).sum()
    }
}

/// Sums of the counters; peaks are the largest one (sessions run one at a time here).
fn add_stats(a: AllocatorStats, b: AllocatorStats) -> AllocatorStats {
    AllocatorStats {
        allocations: a.allocations + b.allocations,
        hits: a.hits + b.hits,
        misses: a.misses + b.misses,
        system_allocations: a.system_allocations + b.system_allocations,
        system_frees: a.system_frees + b.system_frees,
        bytes_live: a.bytes_live + b.bytes_live,
        peak_bytes_live: a.peak_bytes_live.max(b.peak_bytes_live),
        bytes_cached: a.bytes_cached + b.bytes_cached,
        resets: a.resets + b.resets,
    }
}
