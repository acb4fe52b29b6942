//! One loaded method: its value table, the storage its tensors live in, and its
//! instructions with kernels resolved at load.

mod execute;
mod io;
mod load;
mod meta;

use std::sync::Arc;

use etch_kernels::{EValue, KernelFn, ThreadPool};
use etch_memory::{RegionId, Storage};

pub use io::TensorView;
pub use meta::{MethodMeta, TensorInfo, ValueInfo};

/// Most instructions one `execute` may run (guards against jump loops), as upstream.
pub const MAX_INSTRUCTIONS: usize = 10_000_000;

/// An instruction with everything resolved at load.
#[derive(Clone)]
pub(crate) enum Step {
    Kernel {
        kernel: KernelFn,
        /// Index into `Method::operator_names`.
        op: usize,
        args: Box<[usize]>,
    },
    Delegate {
        backend: String,
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

/// A loaded method, ready to run.
pub struct Method {
    name: String,
    values: Vec<EValue>,
    storage: Storage,
    steps: Vec<Step>,
    operator_names: Vec<String>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    /// Per input: whether it has been set.
    input_set: Vec<bool>,
    /// Per input tensor: where its bytes live (planned or a dedicated buffer).
    input_spans: Vec<Option<etch_memory::Span>>,
    pool: Arc<ThreadPool>,
    meta: MethodMeta,
    planned_bytes: usize,
    #[allow(dead_code)]
    program_region: Option<RegionId>,
    stats: MethodStats,
    profile: Option<Vec<InstructionProfile>>,
}

impl Method {
    /// The method's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Static description of inputs, outputs and memory.
    pub fn meta(&self) -> &MethodMeta {
        &self.meta
    }

    /// Counters since load.
    pub fn stats(&self) -> MethodStats {
        self.stats
    }

    /// Bytes of planned memory this method holds.
    pub fn planned_bytes(&self) -> usize {
        self.planned_bytes
    }

    /// Number of instructions.
    pub fn instruction_count(&self) -> usize {
        self.steps.len()
    }

    /// Turns per-instruction profiling (time and heap allocations) on or off.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(|| {
            self.steps
                .iter()
                .map(|s| InstructionProfile {
                    name: match s {
                        Step::Kernel { op, .. } => {
                            self.operator_names.get(*op).cloned().unwrap_or_default()
                        }
                        Step::Delegate { backend } => format!("delegate:{backend}"),
                        Step::Move { .. } => "move".into(),
                        Step::JumpFalse { .. } => "jump_false".into(),
                        Step::Free { .. } => "free".into(),
                    },
                    ..Default::default()
                })
                .collect()
        });
    }

    /// Per-instruction measurements since profiling was turned on.
    pub fn profile(&self) -> Option<&[InstructionProfile]> {
        self.profile.as_deref()
    }

    /// The current value table (for debugging and tools).
    pub fn values(&self) -> &[EValue] {
        &self.values
    }
}
