//! [`Module`]: the user-facing way to load a program and run its methods.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etch_format::ProgramFile;
use etch_kernels::{Registry, ThreadPool};
use etch_memory::allocator::{CachingAllocator, MallocAllocator};
use etch_memory::{AllocatorStats, MemoryAllocator, SharedBytes};

use crate::{Method, MethodMeta, RuntimeError, Value};

/// Default cache budget of the caching temp allocator.
pub const DEFAULT_TEMP_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// How a program file is brought into memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadMode {
    /// Read the whole file into aligned heap memory.
    File,
    /// Memory-map the file (constants are used in place, paged in on demand).
    #[default]
    Mmap,
    /// Memory-map and `mlock` the file (fails if the pages cannot be locked).
    MmapLocked,
    /// Read the whole file into private memory backed by transparent huge pages where
    /// the OS offers them (Linux `madvise`): fewer TLB misses when every weight is
    /// streamed per token, at the cost of a full read at load and private memory.
    HugePages,
}

enum Source {
    Path(PathBuf),
    Bytes(SharedBytes),
}

/// Builds a [`Module`]; the same options for every source.
///
/// ```no_run
/// use etch_runtime::{LoadMode, Module};
/// let mut module = Module::from_path("model.pte")
///     .load_mode(LoadMode::Mmap)
///     .threads(2)
///     .build()?;
/// let outputs = module.forward(&[])?;
/// # Ok::<(), etch_runtime::RuntimeError>(())
/// ```
pub struct ModuleBuilder {
    source: Source,
    load_mode: LoadMode,
    memory_allocator: Option<Arc<dyn MemoryAllocator>>,
    temp_allocator: Option<Box<dyn MemoryAllocator>>,
    threads: usize,
    registry: Option<Arc<Registry>>,
}

impl ModuleBuilder {
    /// How to load a file source (ignored for byte sources). Default: [`LoadMode::Mmap`].
    pub fn load_mode(mut self, mode: LoadMode) -> Self {
        self.load_mode = mode;
        self
    }

    /// The allocator planned memory comes from (default: [`MallocAllocator`]).
    pub fn memory_allocator(mut self, allocator: Arc<dyn MemoryAllocator>) -> Self {
        self.memory_allocator = Some(allocator);
        self
    }

    /// The allocator kernel scratch comes from, reset after every instruction
    /// (default: a [`CachingAllocator`] of [`DEFAULT_TEMP_CACHE_BYTES`]).
    pub fn temp_allocator(mut self, allocator: Box<dyn MemoryAllocator>) -> Self {
        self.temp_allocator = Some(allocator);
        self
    }

    /// Threads of the kernel pool (0, the default, means the machine's parallelism).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// The kernels to resolve operators against (default: every etch kernel).
    pub fn registry(mut self, registry: Arc<Registry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Loads and validates the program; methods load lazily on first use.
    pub fn build(self) -> Result<Module, RuntimeError> {
        let start = Instant::now();
        let file = match self.source {
            Source::Path(p) => match self.load_mode {
                LoadMode::File => ProgramFile::read(&p)?,
                LoadMode::Mmap => ProgramFile::map(&p, false)?,
                LoadMode::MmapLocked => ProgramFile::map(&p, true)?,
                LoadMode::HugePages => ProgramFile::read_huge_pages(&p)?,
            },
            Source::Bytes(b) => ProgramFile::from_bytes(b)?,
        };
        let pool =
            ThreadPool::new(self.threads).map_err(|e| RuntimeError::ThreadPool(e.to_string()))?;
        Ok(Module {
            file: Arc::new(file),
            registry: self
                .registry
                .unwrap_or_else(|| Arc::new(Registry::with_defaults())),
            pool: Arc::new(pool),
            memory_allocator: self
                .memory_allocator
                .unwrap_or_else(|| Arc::new(MallocAllocator::new())),
            temp_allocator: self
                .temp_allocator
                .unwrap_or_else(|| Box::new(CachingAllocator::new(DEFAULT_TEMP_CACHE_BYTES))),
            methods: HashMap::new(),
            load_time: start.elapsed(),
        })
    }
}

/// A loaded program and its lazily loaded, cached methods.
pub struct Module {
    file: Arc<ProgramFile>,
    registry: Arc<Registry>,
    pool: Arc<ThreadPool>,
    memory_allocator: Arc<dyn MemoryAllocator>,
    temp_allocator: Box<dyn MemoryAllocator>,
    methods: HashMap<String, Method>,
    load_time: Duration,
}

impl Module {
    fn builder(source: Source) -> ModuleBuilder {
        ModuleBuilder {
            source,
            load_mode: LoadMode::default(),
            memory_allocator: None,
            temp_allocator: None,
            threads: 0,
            registry: None,
        }
    }

    /// A builder for a `.pte` file.
    pub fn from_path(path: impl AsRef<Path>) -> ModuleBuilder {
        Self::builder(Source::Path(path.as_ref().to_path_buf()))
    }

    /// A builder for a program already in memory (used zero-copy).
    pub fn from_bytes(bytes: SharedBytes) -> ModuleBuilder {
        Self::builder(Source::Bytes(bytes))
    }

    /// Loads a file with every default.
    pub fn load(path: impl AsRef<Path>) -> Result<Module, RuntimeError> {
        Self::from_path(path).build()
    }

    /// The validated program.
    pub fn program(&self) -> &ProgramFile {
        &self.file
    }

    /// Time spent reading and validating the program.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// The kernel pool.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Method names in file order.
    pub fn method_names(&self) -> Vec<&str> {
        self.file.method_names().collect()
    }

    /// True when the program has a method of this name.
    pub fn has_method(&self, name: &str) -> bool {
        self.file.plan(name).is_some()
    }

    fn not_found(&self, name: &str) -> RuntimeError {
        RuntimeError::MethodNotFound {
            name: name.to_string(),
            available: self.method_names().join(", "),
        }
    }

    /// What a method takes and returns, without loading it.
    pub fn method_meta(&self, name: &str) -> Result<MethodMeta, RuntimeError> {
        self.file
            .plan(name)
            .map(MethodMeta::from_plan)
            .ok_or_else(|| self.not_found(name))
    }

    /// Loads a method (allocating its planned memory) if it is not loaded yet.
    pub fn load_method(&mut self, name: &str) -> Result<(), RuntimeError> {
        if !self.methods.contains_key(name) {
            let method = Method::load(
                &self.file,
                name,
                &self.registry,
                &self.memory_allocator,
                Arc::clone(&self.pool),
            )?;
            self.methods.insert(name.to_string(), method);
        }
        Ok(())
    }

    /// A loaded method (loading it on first use), for setting inputs and reading
    /// outputs without copies.
    pub fn method_mut(&mut self, name: &str) -> Result<&mut Method, RuntimeError> {
        self.load_method(name)?;
        self.methods
            .get_mut(name)
            .ok_or_else(|| RuntimeError::MethodNotFound {
                name: name.to_string(),
                available: String::new(),
            })
    }

    /// Runs a loaded method with the inputs already set, using the module's temp
    /// allocator. Allocates nothing when the method's kernels don't.
    pub fn run(&mut self, name: &str) -> Result<(), RuntimeError> {
        self.load_method(name)?;
        let Some(method) = self.methods.get_mut(name) else {
            return Err(RuntimeError::MethodNotFound {
                name: name.to_string(),
                available: String::new(),
            });
        };
        let temp: &mut dyn MemoryAllocator = &mut *self.temp_allocator;
        self.pool.install(|| method.execute(Some(temp)))
    }

    /// Sets the inputs, runs the method and copies its outputs out.
    pub fn execute(&mut self, name: &str, inputs: &[Value]) -> Result<Vec<Value>, RuntimeError> {
        self.method_mut(name)?.set_inputs(inputs)?;
        self.run(name)?;
        self.method_mut(name)?.outputs()
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

    /// Counters of the temp allocator.
    pub fn temp_allocator_stats(&self) -> AllocatorStats {
        self.temp_allocator.stats()
    }

    /// Counters of the planned-memory allocator.
    pub fn memory_allocator_stats(&self) -> AllocatorStats {
        self.memory_allocator.stats()
    }

    /// Bytes of planned memory held by loaded methods.
    pub fn planned_bytes(&self) -> usize {
        self.methods.values().map(Method::planned_bytes).sum()
    }
}
