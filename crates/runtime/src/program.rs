//! [`Program`]: what is immutable after load (the validated file, its weights, the
//! resolved kernel plans and initialised delegates), shared by every session.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etch_format::{DataFile, ProgramFile};
use etch_kernels::{Backend, Registry, ThreadPool};
use etch_memory::allocator::{CachingAllocator, MallocAllocator};
use etch_memory::{MemoryAllocator, MemoryBudget, Reservation, SharedBytes};

use crate::backends::BackendRegistry;
use crate::{Method, MethodMeta, MethodPlan, Module, PlanOptions, RuntimeError};

/// Default cache budget of each session's caching temp allocator.
pub const DEFAULT_TEMP_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// How a program file is brought into memory; the variants are the CLI's `--load` values.
///
/// Defaults per use: [`LoadMode::Mmap`] for [`Module`] and [`Program`] (the fastest load,
/// weights shared with the page cache), [`LoadMode::Auto`] for the text runner
/// (`etch generate`, `chat`, `bench`), where every weight is streamed once per token.
///
/// With a memory-mapped file (`Mmap`, or `Auto` on a delegated program), the pages that
/// a delegate's initialisation read (the weights it packs into its own memory) are given
/// back to the page cache as soon as it has packed them: the process holds one copy of
/// those weights, the packed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadMode {
    /// Read the whole file into aligned heap memory (`--load read`).
    Read,
    /// Memory-map the file (constants are used in place, paged in on demand).
    #[default]
    Mmap,
    /// Memory-map and `mlock` the file (fails if the pages cannot be locked).
    MmapLocked,
    /// Read the whole file into private memory backed by transparent huge pages where
    /// the OS offers them (Linux `madvise`): fewer TLB misses when every weight is
    /// streamed per token, at the cost of a full read at load and private memory.
    HugePages,
    /// Map the file, then choose by what the program is. A program without delegates
    /// is read onto huge pages, as [`LoadMode::HugePages`]: its portable kernels stream
    /// the file's weights on every call. A delegated program stays mapped: its delegates
    /// pack their weights at init into memory of their own (on huge pages), and the
    /// file's pages are released afterwards.
    Auto,
}

/// Makes each session's temp allocator.
pub type TempAllocatorFactory = Arc<dyn Fn() -> Box<dyn MemoryAllocator> + Send + Sync>;

enum Source {
    Path(PathBuf),
    Bytes(SharedBytes),
}

/// Builds a [`Program`] (or a [`Module`] over one); the same options for every source.
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
    data_files: Vec<PathBuf>,
    load_mode: LoadMode,
    memory_allocator: Option<Arc<dyn MemoryAllocator>>,
    temp_allocator: Option<TempAllocatorFactory>,
    threads: usize,
    registry: Option<Arc<Registry>>,
    backends: Option<BackendRegistry>,
    memory_budget: Option<MemoryBudget>,
    fold_constants: bool,
}

impl ModuleBuilder {
    fn new(source: Source) -> Self {
        ModuleBuilder {
            source,
            data_files: Vec::new(),
            load_mode: LoadMode::default(),
            memory_allocator: None,
            temp_allocator: None,
            threads: 0,
            registry: None,
            backends: None,
            memory_budget: None,
            fold_constants: true,
        }
    }

    /// How to load a file source (ignored for byte sources). Default: [`LoadMode::Mmap`].
    pub fn load_mode(mut self, mode: LoadMode) -> Self {
        self.load_mode = mode;
        self
    }

    /// A `.ptd` file whose named data (weights kept outside the program) delegates may
    /// read; loaded with the same [`LoadMode`]. May be given several times.
    pub fn data_file(mut self, path: impl AsRef<Path>) -> Self {
        self.data_files.push(path.as_ref().to_path_buf());
        self
    }

    /// One allocator every session's planned memory comes from. Its blocks are freed
    /// only when it is reset or dropped, so sessions made and dropped keep adding to it:
    /// give one for a fixed set of sessions (an arena sized for them, say). By default
    /// each session allocates its planned memory from its own [`MallocAllocator`] and
    /// frees it when it is dropped.
    pub fn memory_allocator(mut self, allocator: Arc<dyn MemoryAllocator>) -> Self {
        self.memory_allocator = Some(allocator);
        self
    }

    /// Makes the allocator each session's kernel scratch comes from, reset after every
    /// instruction (default: a [`CachingAllocator`] of [`DEFAULT_TEMP_CACHE_BYTES`]).
    pub fn temp_allocator(
        mut self,
        factory: impl Fn() -> Box<dyn MemoryAllocator> + Send + Sync + 'static,
    ) -> Self {
        self.temp_allocator = Some(Arc::new(factory));
        self
    }

    /// Each session's scratch from a [`CachingAllocator`] that keeps up to `bytes`.
    pub fn temp_cache_bytes(self, bytes: usize) -> Self {
        self.temp_allocator(move || Box::new(CachingAllocator::new(bytes)))
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

    /// The backends to resolve delegates against (default:
    /// [`BackendRegistry::with_defaults`], every etch backend).
    pub fn backends(mut self, backends: BackendRegistry) -> Self {
        self.backends = Some(backends);
        self
    }

    /// Adds one backend to the registry (to the defaults unless [`Self::backends`] was
    /// given), replacing one of the same id.
    pub fn backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backends
            .get_or_insert_with(BackendRegistry::with_defaults)
            .register(backend);
        self
    }

    /// The most memory the program may hold, in bytes: the file when it is read into
    /// memory (`--load read`, `huge-pages`), each session's planned memory (a KV cache
    /// lives there), delegates' packed weights and folded constants
    /// ([`Self::fold_constants`]). A load that would exceed it fails with
    /// [`RuntimeError::MemoryBudget`] before allocating. Default: the memory the system
    /// reports as available when the builder is built (`MemAvailable`).
    pub fn max_memory(self, bytes: u64) -> Self {
        self.memory_budget(MemoryBudget::new(bytes))
    }

    /// The budget to check allocations against (see [`Self::max_memory`]); a budget
    /// shared by several programs limits them together.
    pub fn memory_budget(mut self, budget: MemoryBudget) -> Self {
        self.memory_budget = Some(budget);
        self
    }

    /// Whether each method's plan folds constant work at load (default `true`): kernel
    /// steps whose tensor inputs are all constants (a `permute_copy` of a weight) run
    /// once and their outs become constants; an inference batch norm after an f32
    /// convolution is folded into the convolution's weight and bias. The folded
    /// constants are made once per plan, shared by its sessions and held against the
    /// memory budget ([`MethodPlan::folded_bytes`]). Turn it off to run the file's
    /// instructions as they are (the CLI's `--no-fold`).
    pub fn fold_constants(mut self, on: bool) -> Self {
        self.fold_constants = on;
        self
    }

    /// Loads and validates the program; method plans are resolved on first use.
    pub fn build_program(self) -> Result<Program, RuntimeError> {
        let start = Instant::now();
        let budget = self
            .memory_budget
            .unwrap_or_else(MemoryBudget::system_available);
        let mut file_reservations = Vec::new();
        // `Auto` maps the file first and looks at it.
        let mut mode = self.load_mode;
        let mut mapped = None;
        if let (LoadMode::Auto, Source::Path(p)) = (mode, &self.source) {
            let file = ProgramFile::map(p, false)?;
            if file.has_delegates() {
                mode = LoadMode::Mmap;
                mapped = Some(file);
            } else {
                // Read afresh rather than copy the map: copying would fault every page
                // of the file into this process beside the copy.
                mode = LoadMode::HugePages;
            }
        }
        let copies = matches!(mode, LoadMode::Read | LoadMode::HugePages);
        if copies && let Source::Path(p) = &self.source {
            file_reservations.push(reserve_file(&budget, p)?);
        }
        if copies {
            for p in &self.data_files {
                file_reservations.push(reserve_file(&budget, p)?);
            }
        }
        let file = match self.source {
            Source::Path(p) => match (mode, mapped) {
                (_, Some(file)) => file,
                (LoadMode::Read, _) => ProgramFile::read(&p)?,
                (LoadMode::Mmap | LoadMode::Auto, _) => ProgramFile::map(&p, false)?,
                (LoadMode::MmapLocked, _) => ProgramFile::map(&p, true)?,
                (LoadMode::HugePages, _) => ProgramFile::read_huge_pages(&p)?,
            },
            Source::Bytes(b) => ProgramFile::from_bytes(b)?,
        };
        let data_files = self
            .data_files
            .iter()
            .map(|p| match mode {
                LoadMode::Read | LoadMode::HugePages => DataFile::read(p),
                LoadMode::Mmap | LoadMode::Auto => DataFile::map(p, false),
                LoadMode::MmapLocked => DataFile::map(p, true),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let pool =
            ThreadPool::new(self.threads).map_err(|e| RuntimeError::ThreadPool(e.to_string()))?;
        Ok(Program {
            shared: Arc::new(Shared {
                file,
                data_files,
                release_pages: mode == LoadMode::Mmap,
                registry: self
                    .registry
                    .unwrap_or_else(|| Arc::new(Registry::with_defaults())),
                backends: self.backends.unwrap_or_else(BackendRegistry::with_defaults),
                pool: Arc::new(pool),
                memory_allocator: self.memory_allocator,
                temp_allocator: self.temp_allocator.unwrap_or_else(|| {
                    Arc::new(|| Box::new(CachingAllocator::new(DEFAULT_TEMP_CACHE_BYTES)))
                }),
                plans: Mutex::new(HashMap::new()),
                fold_constants: self.fold_constants,
                load_time: start.elapsed(),
                budget,
                _file_reservations: file_reservations,
            }),
        })
    }

    /// Loads the program and wraps it in a [`Module`]; methods load lazily.
    pub fn build(self) -> Result<Module, RuntimeError> {
        Ok(Module::new(self.build_program()?))
    }
}

struct Shared {
    file: ProgramFile,
    data_files: Vec<DataFile>,
    /// Give the mapped files' pages back after each delegate has packed its weights.
    release_pages: bool,
    registry: Arc<Registry>,
    backends: BackendRegistry,
    pool: Arc<ThreadPool>,
    /// `None`: each session has its own (see [`ProgramBuilder::memory_allocator`]).
    memory_allocator: Option<Arc<dyn MemoryAllocator>>,
    temp_allocator: TempAllocatorFactory,
    plans: Mutex<HashMap<String, Arc<MethodPlan>>>,
    /// Fold constant work when a plan is made.
    fold_constants: bool,
    load_time: Duration,
    budget: MemoryBudget,
    /// The file (and data files) read into memory, held against the budget.
    _file_reservations: Vec<Reservation>,
}

/// Reserves the size of a file about to be read into memory.
fn reserve_file(budget: &MemoryBudget, path: &Path) -> Result<Reservation, RuntimeError> {
    let len = std::fs::metadata(path)
        .map_err(|source| {
            RuntimeError::Format(etch_format::FormatError::Io {
                file: path.to_path_buf(),
                source,
            })
        })?
        .len();
    Ok(budget.reserve(|| format!("reading {} into memory", path.display()), len)?)
}

/// A loaded program: immutable, cheap to clone, `Send + Sync`. Sessions made with
/// [`Program::method`] share its weights, kernel plans and delegates; each has its own
/// values, planned memory (a KV cache lives there) and temp allocator.
///
/// ```no_run
/// let program = etch_runtime::Program::from_path("llm.pte").build_program()?;
/// let mut a = program.method("forward")?; // one conversation
/// let mut b = program.method("forward")?; // another, on the same weights
/// # Ok::<(), etch_runtime::RuntimeError>(())
/// ```
#[derive(Clone)]
pub struct Program {
    shared: Arc<Shared>,
}

impl Program {
    /// A builder for a `.pte` file.
    pub fn from_path(path: impl AsRef<Path>) -> ModuleBuilder {
        ModuleBuilder::new(Source::Path(path.as_ref().to_path_buf()))
    }

    /// A builder for a program already in memory (used zero-copy).
    pub fn from_bytes(bytes: SharedBytes) -> ModuleBuilder {
        ModuleBuilder::new(Source::Bytes(bytes))
    }

    /// The validated program file.
    pub fn file(&self) -> &ProgramFile {
        &self.shared.file
    }

    /// Time spent reading and validating the program.
    pub fn load_time(&self) -> Duration {
        self.shared.load_time
    }

    /// The kernel pool every session runs on.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.shared.pool
    }

    /// The backends delegates resolve against.
    pub fn backends(&self) -> &BackendRegistry {
        &self.shared.backends
    }

    /// Method names in file order.
    pub fn method_names(&self) -> Vec<&str> {
        self.shared.file.method_names().collect()
    }

    /// True when the program has a method of this name (whether or not it loads).
    pub fn has_method(&self, name: &str) -> bool {
        self.shared.file.has_method(name)
    }

    pub(crate) fn not_found(&self, name: &str) -> RuntimeError {
        RuntimeError::MethodNotFound {
            name: name.to_string(),
            available: self.method_names().join(", "),
        }
    }

    /// What a method takes and returns, without planning it (its execution plan is
    /// validated: a method that fails is [`RuntimeError::InvalidMethod`]).
    pub fn method_meta(&self, name: &str) -> Result<MethodMeta, RuntimeError> {
        crate::method::file_plan(&self.shared.file, name).map(MethodMeta::from_plan)
    }

    /// The resolved plan of a method (kernels looked up, delegates initialised, constant
    /// work folded), made on first use and shared afterwards.
    pub fn plan(&self, name: &str) -> Result<Arc<MethodPlan>, RuntimeError> {
        let mut plans = self
            .shared
            .plans
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(plan) = plans.get(name) {
            return Ok(Arc::clone(plan));
        }
        let s = &*self.shared;
        let options = PlanOptions {
            budget: s.budget.clone(),
            release_pages: s.release_pages,
            fold_constants: s.fold_constants,
        };
        let plan = Arc::new(MethodPlan::load(
            &s.file,
            name,
            &s.registry,
            &s.backends,
            &s.data_files,
            &options,
        )?);
        plans.insert(name.to_string(), Arc::clone(&plan));
        Ok(plan)
    }

    /// A new session of a method, with its own planned memory and temp allocator.
    pub fn method(&self, name: &str) -> Result<Method, RuntimeError> {
        let plan = self.plan(name)?;
        let s = &*self.shared;
        let planned_allocator = s.memory_allocator.clone().unwrap_or_else(|| {
            let own: Arc<dyn MemoryAllocator> = Arc::new(MallocAllocator::new());
            own
        });
        Method::new(
            plan,
            &s.file,
            &planned_allocator,
            Arc::clone(&s.pool),
            Some((s.temp_allocator)()),
            &s.budget,
        )
    }

    /// The memory budget this program's allocations are checked against.
    pub fn memory_budget(&self) -> &MemoryBudget {
        &self.shared.budget
    }

    /// Counters of the planned-memory allocator given to the builder (`None` when each
    /// session has its own: see [`Method::planned_allocator_stats`]).
    pub fn memory_allocator_stats(&self) -> Option<etch_memory::AllocatorStats> {
        self.shared.memory_allocator.as_ref().map(|a| a.stats())
    }
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("methods", &self.method_names())
            .field("backends", &self.shared.backends)
            .finish_non_exhaustive()
    }
}
