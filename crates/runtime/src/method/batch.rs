//! Several sessions of one method run in lockstep ([`Method::execute_batch`]): the
//! instructions in order, each for every session before the next, so that the
//! instructions whose cost is a product with constant weights (kernels with a batched
//! form, delegate calls) run once over all sessions' rows and stream the weights once.

use std::sync::Arc;

use etch_kernels::{Args, Batch, Batched, KernelContext};
use etch_memory::{MemoryAllocator, TempScope};

use super::{Method, Step};
use crate::RuntimeError;

impl Method {
    /// Runs the method once for each of `sessions` (sessions of one plan: the same
    /// method of the same loaded program, at most [`etch_kernels::MAX_BATCH`]), each with its own
    /// inputs, planned memory and KV cache, and each getting the outputs it gets from
    /// [`Method::execute`] alone. Steps run in lockstep: a kernel with a batched form
    /// (`linear` with shared weights) and every delegate call run once for all
    /// sessions; other steps run session by session. A method with control flow
    /// (`JumpFalse`) runs each session alone.
    ///
    /// Runs on the first session's thread pool. Profiling and the scratch counters of
    /// [`Method::stats`] cover single executions only.
    pub fn execute_batch(sessions: &mut Batch<&mut Method>) -> Result<(), RuntimeError> {
        let Some(first) = sessions.get(0) else {
            return Ok(());
        };
        let plan = Arc::clone(&first.plan);
        let batch_error = |what: String| RuntimeError::Batch {
            method: plan.name.clone(),
            what,
        };
        for (i, s) in sessions.iter().enumerate() {
            if !Arc::ptr_eq(&s.plan, &plan) {
                return Err(batch_error(format!(
                    "session {i} belongs to another method or program"
                )));
            }
            if let Some(index) = s.input_set.iter().position(|set| !set) {
                return Err(RuntimeError::InputNotSet {
                    method: plan.name.clone(),
                    index,
                });
            }
        }
        if sessions.len() == 1 || plan.has_jumps {
            return sessions.iter_mut().try_for_each(|s| s.execute());
        }
        let pool = Arc::clone(&first.pool);
        pool.install_hot(|| lockstep(sessions, &pool))
    }
}

/// The steps of `sessions`' plan (no jumps), each for every session.
fn lockstep(
    sessions: &mut Batch<&mut Method>,
    pool: &etch_kernels::ThreadPool,
) -> Result<(), RuntimeError> {
    let Some(plan) = sessions.get(0).map(|s| Arc::clone(&s.plan)) else {
        return Ok(());
    };
    let name = &plan.name;
    let mut shared_steps = 0u64;
    for (pc, step) in plan.steps.iter().enumerate() {
        for s in sessions.iter_mut() {
            if let Some(t) = s.temp.as_deref_mut() {
                t.reset();
            }
        }
        let (args, epilogue) = match step {
            Step::Kernel { args, epilogue, .. } => (args, *epilogue),
            Step::Delegate { args, .. } => (args, Default::default()),
            Step::Move { .. } | Step::Free { .. } | Step::JumpFalse { .. } => {
                for s in sessions.iter_mut() {
                    s.run_plain_step(pc)?;
                }
                continue;
            }
        };
        let mut ctxs = Batch::new();
        let mut call_args = Batch::new();
        for s in sessions.iter_mut() {
            let Method {
                values,
                storage,
                temp,
                ..
            } = &mut **s;
            let scope = TempScope::new(temp.as_deref().map(|t| t as &dyn MemoryAllocator));
            let ctx = KernelContext::new(storage.access(), scope, pool).with_epilogue(epilogue);
            // Both batches hold MAX_BATCH and `execute_batch` admits no more sessions.
            let _ = ctxs.push(ctx);
            let _ = call_args.push(Args::new(values, args));
        }
        match step {
            Step::Kernel {
                kernel,
                batched,
                op,
                ..
            } => {
                let error = |source| RuntimeError::Kernel {
                    method: name.clone(),
                    instruction: pc,
                    op: plan.operator_names.get(*op).cloned().unwrap_or_default(),
                    source,
                };
                let shared = match batched {
                    Some(batched) => batched(&ctxs, &mut call_args).map_err(error)?,
                    None => Batched::PerSession,
                };
                if shared == Batched::PerSession {
                    for (ctx, a) in ctxs.iter().zip(call_args.iter_mut()) {
                        kernel(ctx, a).map_err(error)?;
                    }
                } else {
                    shared_steps += 1;
                }
            }
            Step::Delegate { delegate, .. } => {
                let loaded = &plan.delegates[*delegate];
                let shared =
                    loaded
                        .handle
                        .execute_batch(&ctxs, &mut call_args)
                        .map_err(|source| RuntimeError::Delegate {
                            method: name.clone(),
                            instruction: pc,
                            backend: loaded.backend.clone(),
                            source,
                        })?;
                if shared == Batched::Done {
                    shared_steps += 1;
                }
            }
            _ => {}
        }
    }
    for s in sessions.iter_mut() {
        if let Some(t) = s.temp.as_deref_mut() {
            t.reset();
        }
        s.stats.executions += 1;
        s.stats.instructions += plan.steps.len() as u64;
        s.stats.batched_executions += 1;
        s.stats.shared_instructions += shared_steps;
    }
    Ok(())
}
