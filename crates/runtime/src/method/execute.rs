//! Running a method's instructions.

use etch_kernels::{Args, EValue, KernelContext};
use std::time::Instant;

use etch_memory::counting::CountingAllocator;
use etch_memory::{MemoryAllocator, TempScope};

use super::{MAX_INSTRUCTIONS, Method, Step};
use crate::RuntimeError;

impl Method {
    /// Runs every instruction once, in order. Every input must have been set.
    ///
    /// Kernel scratch comes from `temp` (heap fallback, counted, when `None`), which is
    /// reset at the start and after every instruction, as upstream: scratch never
    /// outlives one kernel call.
    pub fn execute(
        &mut self,
        mut temp: Option<&mut dyn MemoryAllocator>,
    ) -> Result<(), RuntimeError> {
        if let Some(index) = self.input_set.iter().position(|set| !set) {
            return Err(RuntimeError::InputNotSet {
                method: self.name.clone(),
                index,
            });
        }
        if let Some(t) = temp.as_deref_mut() {
            t.reset();
        }
        let Method {
            name,
            values,
            storage,
            steps,
            operator_names,
            pool,
            stats,
            profile,
            ..
        } = self;
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
                Step::Kernel { kernel, op, args } => {
                    let scope = TempScope::new(temp.as_deref().map(|t| t as &dyn MemoryAllocator));
                    let ctx = KernelContext::new(storage.access(), scope, pool);
                    let mut a = Args::new(values, args);
                    let r = kernel(&ctx, &mut a);
                    let scratch = ctx.scratch_stats();
                    drop(ctx);
                    stats.scratch_allocations += scratch.allocations;
                    stats.scratch_fallbacks += scratch.fallbacks;
                    stats.peak_scratch_bytes = stats.peak_scratch_bytes.max(scratch.bytes);
                    r.map_err(|source| RuntimeError::Kernel {
                        method: name.clone(),
                        instruction: pc,
                        op: operator_names.get(*op).cloned().unwrap_or_default(),
                        source,
                    })
                }
                Step::Delegate { backend } => Err(RuntimeError::DelegateUnavailable {
                    method: name.clone(),
                    instruction: pc,
                    backend: backend.clone(),
                }),
                Step::Move { from, to } => match values.get(*from).cloned() {
                    Some(v) if *to < values.len() => {
                        values[*to] = v;
                        Ok(())
                    }
                    _ => Err(instruction_error(name, pc, "move between invalid values")),
                },
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
                Step::Free { value } => match values.get_mut(*value) {
                    Some(EValue::Tensor(t)) => {
                        t.set_data(None);
                        Ok(())
                    }
                    _ => Err(instruction_error(name, pc, "free of a non-tensor value")),
                },
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
