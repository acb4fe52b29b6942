//! Running a method's instructions.

use etch_kernels::{Args, EValue, KernelContext};
use std::time::Instant;

use etch_memory::counting::CountingAllocator;
use etch_memory::{MemoryAllocator, TempScope};

use std::sync::Arc;

use super::{MAX_INSTRUCTIONS, Method, MethodPlan, MethodStats, Step};
use crate::RuntimeError;

impl Method {
    /// Runs every instruction once, in order, on the session's thread pool, entered
    /// once per call with `ThreadPool::install_hot`: the other workers poll for the
    /// instructions' parallel loops rather than sleep between them, until the call
    /// returns (a no-op when the caller already runs on the pool, as the text runner
    /// does for a whole generation). Every input must have been set.
    ///
    /// Kernel scratch comes from the session's temp allocator (heap fallback, counted,
    /// when it has none), which is reset at the start and after every instruction, as
    /// upstream: scratch never outlives one kernel call.
    pub fn execute(&mut self) -> Result<(), RuntimeError> {
        let pool = Arc::clone(&self.pool);
        pool.install_hot(|| self.execute_here())
    }

    fn execute_here(&mut self) -> Result<(), RuntimeError> {
        if let Some(index) = self.input_set.iter().position(|set| !set) {
            return Err(RuntimeError::InputNotSet {
                method: self.plan.name.clone(),
                index,
            });
        }
        let Method {
            plan,
            values,
            storage,
            pool,
            temp,
            stats,
            profile,
            node_times,
            ..
        } = self;
        let MethodPlan {
            name,
            steps,
            operator_names,
            delegates,
            ..
        } = &**plan;
        let mut temp: Option<&mut dyn MemoryAllocator> = temp.as_deref_mut();
        if let Some(t) = temp.as_deref_mut() {
            t.reset();
        }
        let mut pc = 0usize;
        let mut executed = 0usize;
        while pc < steps.len() {
            executed += 1;
            if executed > MAX_INSTRUCTIONS {
                return Err(RuntimeError::TooManyInstructions {
                    method: name.clone(),
                    limit: MAX_INSTRUCTIONS,
                });
            }
            let mut next = pc + 1;
            let probe = profile
                .is_some()
                .then(|| (Instant::now(), CountingAllocator::global_counts()));
            let result = match &steps[pc] {
                Step::Kernel {
                    kernel,
                    op,
                    args,
                    epilogue,
                    ..
                } => {
                    let scope = TempScope::new(temp.as_deref().map(|t| t as &dyn MemoryAllocator));
                    let ctx =
                        KernelContext::new(storage.access(), scope, pool).with_epilogue(*epilogue);
                    let mut a = Args::new(values, args);
                    let r = kernel(&ctx, &mut a);
                    record_scratch(stats, &ctx);
                    r.map_err(|source| RuntimeError::Kernel {
                        method: name.clone(),
                        instruction: pc,
                        op: operator_names.get(*op).cloned().unwrap_or_default(),
                        source,
                    })
                }
                Step::Delegate { delegate, args } => {
                    let loaded = &delegates[*delegate];
                    let scope = TempScope::new(temp.as_deref().map(|t| t as &dyn MemoryAllocator));
                    let node_times = node_times.as_ref().map(|t| t.of(&loaded.backend));
                    let ctx = KernelContext::new(storage.access(), scope, pool).with_profiler(
                        node_times
                            .as_ref()
                            .map(|t| t as &dyn etch_kernels::NodeProfiler),
                    );
                    let mut a = Args::new(values, args);
                    let r = loaded.handle.execute(&ctx, &mut a);
                    record_scratch(stats, &ctx);
                    r.map_err(|source| RuntimeError::Delegate {
                        method: name.clone(),
                        instruction: pc,
                        backend: loaded.backend.clone(),
                        source,
                    })
                }
                Step::Move { from, to } => {
                    move_value(values, *from, *to).map_err(|what| instruction_error(name, pc, what))
                }
                Step::JumpFalse { cond, destination } => {
                    match condition(values.get(*cond), storage) {
                        Ok(true) => Ok(()),
                        Ok(false) => {
                            next = *destination;
                            Ok(())
                        }
                        Err(what) => Err(instruction_error(name, pc, what)),
                    }
                }
                Step::Free { value } => {
                    free_value(values, *value).map_err(|what| instruction_error(name, pc, what))
                }
            };
            if let (Some(p), Some((t0, c0))) = (profile.as_mut().and_then(|p| p.get_mut(pc)), probe)
            {
                p.calls += 1;
                p.nanos += t0.elapsed().as_nanos() as u64;
                p.heap_allocations += CountingAllocator::global_counts().since(&c0).allocations;
            }
            if let Some(t) = temp.as_deref_mut() {
                t.reset();
            }
            result?;
            pc = next;
        }
        stats.executions += 1;
        stats.instructions += executed as u64;
        Ok(())
    }
}

impl Method {
    /// Runs step `pc` when it moves or frees a value (for [`Method::execute_batch`],
    /// which runs these session by session; a jump is not run here).
    pub(super) fn run_plain_step(&mut self, pc: usize) -> Result<(), RuntimeError> {
        let name = &self.plan.name;
        let result = match self.plan.steps.get(pc) {
            Some(Step::Move { from, to }) => move_value(&mut self.values, *from, *to),
            Some(Step::Free { value }) => free_value(&mut self.values, *value),
            _ => Err("not a move or free"),
        };
        result.map_err(|what| instruction_error(name, pc, what))
    }
}

/// `values[to] = values[from]`.
fn move_value(values: &mut [EValue], from: usize, to: usize) -> Result<(), &'static str> {
    match values.get(from).cloned() {
        Some(v) if to < values.len() => {
            values[to] = v;
            Ok(())
        }
        _ => Err("move between invalid values"),
    }
}

/// Drops the data of tensor `value` (its memory may be reused).
fn free_value(values: &mut [EValue], value: usize) -> Result<(), &'static str> {
    match values.get_mut(value) {
        Some(EValue::Tensor(t)) => {
            t.set_data(None);
            Ok(())
        }
        _ => Err("free of a non-tensor value"),
    }
}

fn record_scratch(stats: &mut MethodStats, ctx: &KernelContext<'_>) {
    let scratch = ctx.scratch_stats();
    stats.scratch_allocations += scratch.allocations;
    stats.scratch_fallbacks += scratch.fallbacks;
    stats.peak_scratch_bytes = stats.peak_scratch_bytes.max(scratch.bytes);
}

fn instruction_error(method: &str, instruction: usize, what: &str) -> RuntimeError {
    RuntimeError::Instruction {
        method: method.to_string(),
        instruction,
        what: what.to_string(),
    }
}

/// A JumpFalse condition: a Bool, or a bool tensor whose elements are all true.
fn condition(v: Option<&EValue>, storage: &mut etch_memory::Storage) -> Result<bool, &'static str> {
    match v {
        Some(EValue::Bool(b)) => Ok(*b),
        Some(EValue::Tensor(t)) if t.dtype() == etch_format::ScalarType::Bool => {
            let span = t.data().ok_or("condition tensor has no data")?;
            let span = etch_memory::Span {
                len: t.nbytes(),
                ..span
            };
            let bytes = storage
                .bytes(span)
                .map_err(|_| "condition tensor out of bounds")?;
            Ok(bytes.iter().all(|&b| b != 0))
        }
        _ => Err("jump condition is neither a Bool nor a bool tensor"),
    }
}
