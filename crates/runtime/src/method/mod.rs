//! One loaded method: its value table, the storage its tensors live in, and its
//! instructions with kernels resolved at load.

mod batch;
mod execute;
mod fold;
mod io;
mod load;
mod meta;
mod node_profile;

use std::sync::Arc;

use etch_kernels::{
    BatchKernelFn, DelegateHandle, DelegateSummary, EValue, Epilogue, KernelFn, ThreadPool,
};
use etch_memory::{AllocatorStats, MemoryAllocator, MemoryBudget, Storage};

use crate::RuntimeError;

pub use io::TensorView;
pub(crate) use load::file_plan;
pub use node_profile::DelegateNodeProfile;

/// The instructions folding at load removed from a method, by kind
/// ([`MethodPlan::folded_steps`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FoldCounts {
    /// Steps whose inputs are all constants, run once at load.
    pub constant_steps: usize,
    /// Inference batch norms folded into the convolutions before them.
    pub batch_norms: usize,
    /// `hardtanh` and `relu` steps folded into the convolutions before them (as their
    /// output clamp).
    pub activations: usize,
    /// Max pooling steps whose indices nothing reads, which write their values alone.
    pub unread_indices: usize,
    /// Filters of convolutions over small planes stored input-channel major (the layout
    /// of the kernel with the output channels in the vector lanes).
    pub input_major_filters: usize,
}
pub use meta::{MethodMeta, TensorInfo, ValueInfo};

/// Most instructions one `execute` may run (guards against jump loops), as upstream.
pub const MAX_INSTRUCTIONS: usize = 10_000_000;

/// An instruction with everything resolved at load.
#[derive(Clone)]
pub(crate) enum Step {
    Kernel {
        kernel: KernelFn,
        /// The kernel's batched form, where it has one (see [`Method::execute_batch`]).
        batched: Option<BatchKernelFn>,
        /// Index into `MethodPlan::operator_names`.
        op: usize,
        args: Box<[usize]>,
        /// An activation folded into the step at load (none in the file's steps).
        epilogue: Epilogue,
    },
    Delegate {
        /// Index into `MethodPlan::delegates`.
        delegate: usize,
        args: Box<[usize]>,
    },
    Move {
        from: usize,
        to: usize,
    },
    JumpFalse {
        cond: usize,
        destination: usize,
    },
    Free {
        value: usize,
    },
}

/// A delegate initialised by its backend at load, shared by every session.
pub struct LoadedDelegate {
    /// The backend id, e.g. `XnnpackBackend`.
    pub backend: String,
    /// Bytes of the processed payload the backend was given.
    pub payload_bytes: usize,
    pub(crate) handle: Box<dyn DelegateHandle>,
    /// The packed weights, held against the program's memory budget.
    pub(crate) _packed: etch_memory::Reservation,
}

impl LoadedDelegate {
    /// Node counts and packed bytes, as the backend reports them.
    pub fn summary(&self) -> DelegateSummary {
        self.handle.summary()
    }
}

impl std::fmt::Debug for LoadedDelegate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedDelegate")
            .field("backend", &self.backend)
            .field("payload_bytes", &self.payload_bytes)
            .finish_non_exhaustive()
    }
}

/// How [`MethodPlan::load`] prepares a method.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// What delegates' packed weights and folded constants are reserved against.
    pub budget: MemoryBudget,
    /// Give a mapped file's pages back after each delegate has packed its weights.
    pub release_pages: bool,
    /// Fold at load (default on): kernel steps whose inputs are all constants run once
    /// and become constants, and inference batch norms and activations are folded into
    /// the f32 convolutions before them (see [`MethodPlan::folded_steps`]).
    pub fold_constants: bool,
}

impl PlanOptions {
    /// Folding on, pages kept, against `budget`.
    pub fn new(budget: MemoryBudget) -> Self {
        PlanOptions {
            budget,
            release_pages: false,
            fold_constants: true,
        }
    }
}

/// What is immutable about a method after load: its instructions with kernels resolved,
/// delegates initialised and constant work folded. One plan serves every session
/// ([`Method`]) of a program.
pub struct MethodPlan {
    name: String,
    meta: MethodMeta,
    steps: Vec<Step>,
    /// Whether any step jumps (such a method runs batched sessions one by one).
    has_jumps: bool,
    operator_names: Vec<String>,
    delegates: Vec<LoadedDelegate>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    planned_bytes: usize,
    /// Constants made by folding, bound into every session.
    folded: fold::Folded,
}

impl MethodPlan {
    /// The method's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Static description of inputs, outputs and memory.
    pub fn meta(&self) -> &MethodMeta {
        &self.meta
    }

    /// Number of instructions run per call (the file's, less those folded away).
    pub fn instruction_count(&self) -> usize {
        self.steps.len()
    }

    /// Bytes of constants made by folding at load, held once per plan (shared by its
    /// sessions) against the memory budget.
    pub fn folded_bytes(&self) -> usize {
        self.folded.bytes
    }

    /// Instructions folded away at load, by kind.
    pub fn folded_steps(&self) -> FoldCounts {
        self.folded.counts
    }

    /// The method's delegates, in the order of its delegate table.
    pub fn delegates(&self) -> &[LoadedDelegate] {
        &self.delegates
    }

    /// Bytes of planned memory each session of this method holds.
    pub fn planned_bytes(&self) -> usize {
        self.planned_bytes
    }

    fn step_name(&self, step: &Step) -> String {
        match step {
            Step::Kernel { op, .. } => self.operator_names.get(*op).cloned().unwrap_or_default(),
            Step::Delegate { delegate, .. } => format!(
                "delegate:{}",
                self.delegates
                    .get(*delegate)
                    .map(|d| d.backend.as_str())
                    .unwrap_or_default()
            ),
            Step::Move { .. } => "move".into(),
            Step::JumpFalse { .. } => "jump_false".into(),
            Step::Free { .. } => "free".into(),
        }
    }
}

impl std::fmt::Debug for MethodPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodPlan")
            .field("name", &self.name)
            .field("instructions", &self.steps.len())
            .field("folded_bytes", &self.folded.bytes)
            .field("delegates", &self.delegates)
            .finish_non_exhaustive()
    }
}

/// Counters of one method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MethodStats {
    /// Completed `execute` calls.
    pub executions: u64,
    /// Instructions run, all calls together.
    pub instructions: u64,
    /// Scratch requests made by kernels, all calls together.
    pub scratch_allocations: u64,
    /// Largest scratch total one kernel call asked for.
    pub peak_scratch_bytes: usize,
    /// Scratch requests the temp allocator could not serve (heap fallback).
    pub scratch_fallbacks: u64,
    /// Executions that ran in a batched step with other sessions
    /// ([`Method::execute_batch`]).
    pub batched_executions: u64,
    /// Instructions of those that ran once for the whole batch (a batched kernel, or a
    /// delegate call that shared a pass over its weights).
    pub shared_instructions: u64,
}

/// Per-instruction measurements, collected when profiling is on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstructionProfile {
    /// `namespace::name.overload` for kernel calls, or the instruction kind.
    pub name: String,
    pub calls: u64,
    pub nanos: u64,
    /// Heap allocations made meanwhile (all threads; 0 unless the binary installs
    /// `etch_memory::counting::CountingAllocator`).
    pub heap_allocations: u64,
}

/// A session of a method: the values, planned memory, temp allocator and stats that a
/// run mutates (a KV cache lives in its planned memory), over a shared [`MethodPlan`].
/// Sessions of one program share its weights and plans; each is `Send`.
pub struct Method {
    plan: Arc<MethodPlan>,
    values: Vec<EValue>,
    storage: Storage,
    /// Per input: whether it has been set.
    input_set: Vec<bool>,
    /// Per input tensor: where its bytes live (planned or a dedicated buffer).
    input_spans: Vec<Option<etch_memory::Span>>,
    pool: Arc<ThreadPool>,
    /// Kernel scratch, reset after every instruction; `None` sends scratch to the heap.
    temp: Option<Box<dyn MemoryAllocator>>,
    stats: MethodStats,
    profile: Option<Vec<InstructionProfile>>,
    /// Time per node inside delegates (with `profile`).
    node_times: Option<node_profile::NodeTimes>,
    /// Each planned buffer whole (what [`Method::reset_state`] clears).
    planned_spans: Vec<etch_memory::Span>,
    /// Mutable buffers with initial contents in the file.
    mutable_inits: Vec<load::MutableInit>,
    /// The planned memory, held against the program's memory budget.
    _planned_reservation: etch_memory::Reservation,
    /// Where the planned memory came from (this session's own, unless the program was
    /// given one for all).
    planned_allocator: Arc<dyn MemoryAllocator>,
}

impl Method {
    /// The method's name.
    pub fn name(&self) -> &str {
        &self.plan.name
    }

    /// Static description of inputs, outputs and memory.
    pub fn meta(&self) -> &MethodMeta {
        &self.plan.meta
    }

    /// The shared, immutable part of this method.
    pub fn plan(&self) -> &Arc<MethodPlan> {
        &self.plan
    }

    /// Counters since load.
    pub fn stats(&self) -> MethodStats {
        self.stats
    }

    /// Bytes of planned memory this session holds.
    pub fn planned_bytes(&self) -> usize {
        self.plan.planned_bytes
    }

    /// Number of instructions.
    pub fn instruction_count(&self) -> usize {
        self.plan.steps.len()
    }

    /// The thread pool this session runs on.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Replaces the temp allocator kernel scratch comes from (`None`: the heap, counted
    /// as fallbacks).
    pub fn set_temp_allocator(&mut self, temp: Option<Box<dyn MemoryAllocator>>) {
        self.temp = temp;
    }

    /// Counters of the allocator this session's planned memory came from (shared by
    /// every session when the program was given one).
    pub fn planned_allocator_stats(&self) -> AllocatorStats {
        self.planned_allocator.stats()
    }

    /// Counters of this session's temp allocator (all zero without one).
    pub fn temp_allocator_stats(&self) -> AllocatorStats {
        self.temp.as_ref().map(|t| t.stats()).unwrap_or_default()
    }

    /// Turns per-instruction profiling (time and heap allocations) on or off.
    pub fn set_profiling(&mut self, on: bool) {
        self.node_times = on.then(node_profile::NodeTimes::default);
        self.profile = on.then(|| {
            self.plan
                .steps
                .iter()
                .map(|s| InstructionProfile {
                    name: self.plan.step_name(s),
                    ..Default::default()
                })
                .collect()
        });
    }

    /// Per-instruction measurements since profiling was turned on.
    pub fn profile(&self) -> Option<&[InstructionProfile]> {
        self.profile.as_deref()
    }

    /// Time per node inside the delegates since profiling was turned on, by backend and
    /// node name in the order they first ran (empty when the delegates report none).
    pub fn delegate_node_profile(&self) -> Vec<DelegateNodeProfile> {
        self.node_times
            .as_ref()
            .map(node_profile::NodeTimes::rows)
            .unwrap_or_default()
    }

    /// Returns the session's state to what it was at creation: every planned buffer is
    /// zeroed (KV caches, and the convolution and recurrent state hybrid models keep in
    /// mutable buffers that no instruction clears), then the mutable buffers the file
    /// gives initial contents get them again. Inputs must be set again before the next
    /// `execute`.
    pub fn reset_state(&mut self) -> Result<(), RuntimeError> {
        let method = &self.plan.name;
        let invalid = |what: String| RuntimeError::InvalidValue {
            method: method.clone(),
            value: 0,
            what,
        };
        for &span in &self.planned_spans {
            self.storage
                .bytes_mut(span)
                .map_err(|e| invalid(format!("planned memory: {e}")))?
                .fill(0);
        }
        let access = self.storage.access();
        for init in &self.mutable_inits {
            let from = access
                .bytes(init.initial)
                .map_err(|e| invalid(format!("initial mutable data: {e}")))?;
            access
                .bytes_mut(init.planned)
                .map_err(|e| invalid(format!("mutable buffer: {e}")))?
                .copy_from_slice(from);
        }
        self.input_set.iter_mut().for_each(|s| *s = false);
        Ok(())
    }

    /// The current value table (for debugging and tools).
    pub fn values(&self) -> &[EValue] {
        &self.values
    }
}

impl std::fmt::Debug for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Method")
            .field("name", &self.plan.name)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}
