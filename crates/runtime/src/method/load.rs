//! Building a [`Method`] from an execution plan.

use std::sync::Arc;

use etch_format::{
    DataFile, ExecutionPlan, Instruction, ProgramFile, TensorDataLocation, TensorMeta,
    Value as FileValue,
};
use etch_kernels::backend::{BackendInitContext, CompileSpecRef};
use etch_kernels::{BackendError, EValue, Epilogue, Registry, Tensor, ThreadPool};
use etch_memory::{
    AlignedBuffer, MemoryAllocator, MemoryBudget, PlannedMemory, RegionId, Span, Storage,
};

use super::fold::{self, Folded};
use super::{LoadedDelegate, Method, MethodMeta, MethodPlan, MethodStats, PlanOptions, Step};
use crate::RuntimeError;
use crate::backends::{BackendRegistry, ProgramNamedData};

/// Alignment of the buffers that hold non-planned inputs.
const INPUT_ALIGNMENT: usize = 64;

/// Binds a method's values to storage: constants zero-copy in the program's bytes,
/// planned tensors in planned memory. Without planned memory (the fold pass, which
/// evaluates constants only), planned tensors are left unbound.
pub(super) struct Loader<'a> {
    pub(super) file: &'a ProgramFile,
    pub(super) plan: &'a ExecutionPlan,
    pub(super) storage: Storage,
    pub(super) planned: Option<PlannedMemory>,
    pub(super) program_region: Option<RegionId>,
    /// Mutable buffers with initial contents in the file: where each lives in planned
    /// memory and where its initial bytes are in the program's region.
    pub(super) mutable_inits: Vec<MutableInit>,
}

/// A planned tensor whose initial bytes come from the file's mutable data segment.
#[derive(Debug, Clone, Copy)]
pub(super) struct MutableInit {
    pub(super) planned: Span,
    pub(super) initial: Span,
}

impl Loader<'_> {
    pub(super) fn err(&self, value: usize, what: impl Into<String>) -> RuntimeError {
        RuntimeError::InvalidValue {
            method: self.plan.name.clone(),
            value,
            what: what.into(),
        }
    }

    pub(super) fn program_region(&mut self) -> RegionId {
        *self
            .program_region
            .get_or_insert_with(|| self.storage.add_shared(self.file.bytes().clone()))
    }

    fn tensor(
        &mut self,
        index: usize,
        meta: &TensorMeta,
        is_input: bool,
    ) -> Result<Tensor, RuntimeError> {
        let nbytes = meta.nbytes();
        let external = meta
            .extra_tensor_info
            .as_ref()
            .is_some_and(|e| e.location == TensorDataLocation::External);
        if external {
            return Err(self.err(
                index,
                "tensor data lives in an external .ptd file, which etch cannot bind yet",
            ));
        }
        let data = match (&meta.allocation_info, meta.data_buffer_idx) {
            // The fold pass binds only constants.
            (Some(_), _) if self.planned.is_none() => None,
            (Some(alloc), idx) => {
                let span = self
                    .planned
                    .as_ref()
                    .ok_or_else(|| self.err(index, "planned tensor without planned memory"))?
                    .span(alloc.memory_id, alloc.offset, nbytes)
                    .map_err(|source| RuntimeError::Plan {
                        method: self.plan.name.clone(),
                        source,
                    })?;
                if idx > 0 {
                    let range = self.file.mutable_data(idx, nbytes)?;
                    let init = self
                        .file
                        .slice(range)
                        .ok_or_else(|| self.err(index, "mutable data outside the file"))?;
                    let method = &self.plan.name;
                    self.storage
                        .bytes_mut(span)
                        .map_err(|e| RuntimeError::InvalidValue {
                            method: method.clone(),
                            value: index,
                            what: e.to_string(),
                        })?
                        .copy_from_slice(init);
                    let region = self.program_region();
                    self.mutable_inits.push(MutableInit {
                        planned: span,
                        initial: Span {
                            region,
                            offset: range.offset,
                            len: range.len,
                        },
                    });
                }
                Some(span)
            }
            (None, idx) if idx > 0 => {
                let range = self.file.check_constant(idx, nbytes)?;
                let region = self.program_region();
                Some(Span {
                    region,
                    offset: range.offset,
                    len: range.len,
                })
            }
            (None, _) if is_input => {
                let buf = AlignedBuffer::zeroed(nbytes, INPUT_ALIGNMENT).map_err(|source| {
                    RuntimeError::Alloc {
                        method: self.plan.name.clone(),
                        source,
                    }
                })?;
                let region = self.storage.add_buffer(buf);
                Some(Span {
                    region,
                    offset: 0,
                    len: nbytes,
                })
            }
            // Bound at run time (views re-point it; FreeCall clears it).
            (None, _) => None,
        };
        Tensor::with_layout(
            meta.scalar_type,
            &meta.sizes,
            &meta.dim_order,
            meta.shape_dynamism,
            data,
        )
        .map_err(|e| self.err(index, e.to_string()))
    }

    /// Binds the plan's folded constants into this session's values (zero-copy: each
    /// folded buffer becomes one read-only region).
    fn bind_folded(&mut self, folded: &Folded, values: &mut Vec<EValue>) {
        values.resize(values.len() + folded.added_values, EValue::None);
        for &(v, at) in &folded.moved {
            if let (Some(planned), Some(EValue::Tensor(t))) = (&self.planned, values.get_mut(v)) {
                let span = planned.span(at.memory_id, at.start, t.nbytes()).ok();
                t.set_data(span);
            }
        }
        let regions: Vec<RegionId> = folded
            .buffers
            .iter()
            .map(|b| self.storage.add_shared(b.clone()))
            .collect();
        for v in &folded.values {
            let Some(span) = v.place.span(|| self.program_region(), &regions) else {
                continue;
            };
            let mut t = v.tensor;
            t.set_data(Some(span));
            if let Some(slot) = values.get_mut(v.index) {
                *slot = EValue::Tensor(t);
            }
        }
    }

    pub(super) fn value(
        &mut self,
        index: usize,
        v: &FileValue,
        is_input: bool,
    ) -> Result<EValue, RuntimeError> {
        Ok(match v {
            FileValue::Null => EValue::None,
            FileValue::Int(i) => EValue::Int(*i),
            FileValue::Double(d) => EValue::Double(*d),
            FileValue::Bool(b) => EValue::Bool(*b),
            FileValue::String(s) => EValue::String(Arc::from(s.as_str())),
            FileValue::Tensor(t) => EValue::Tensor(self.tensor(index, t, is_input)?),
            FileValue::IntList(items) => EValue::IntList(Arc::from(items.as_slice())),
            FileValue::DoubleList(items) => EValue::DoubleList(Arc::from(items.as_slice())),
            FileValue::BoolList(items) => EValue::BoolList(Arc::from(items.as_slice())),
            FileValue::TensorList(items) => EValue::TensorList(Arc::from(items.as_slice())),
            FileValue::OptionalTensorList(items) => {
                EValue::OptionalTensorList(Arc::from(items.as_slice()))
            }
        })
    }
}

/// The validated execution plan of method `name` (validated on its first load):
/// [`RuntimeError::MethodNotFound`] when the program has none,
/// [`RuntimeError::InvalidMethod`] when it fails validation.
pub(crate) fn file_plan<'f>(
    file: &'f ProgramFile,
    name: &str,
) -> Result<&'f ExecutionPlan, RuntimeError> {
    if !file.has_method(name) {
        return Err(RuntimeError::MethodNotFound {
            name: name.to_string(),
            available: file.method_names().collect::<Vec<_>>().join(", "),
        });
    }
    file.load_plan(name)
        .map_err(|source| RuntimeError::InvalidMethod {
            method: name.to_string(),
            source,
        })
}

impl MethodPlan {
    /// Resolves method `name` of `file`: every operator against `registry` (all missing
    /// ones reported together) and every delegate against `backends`, whose `init` runs
    /// here, once; then folds constant work (unless `options` turn it off). Allocates no
    /// planned memory.
    pub fn load(
        file: &ProgramFile,
        name: &str,
        registry: &Registry,
        backends: &BackendRegistry,
        data_files: &[DataFile],
        options: &PlanOptions,
    ) -> Result<MethodPlan, RuntimeError> {
        let budget = &options.budget;
        let plan = file_plan(file, name)?;

        // Resolve operators first: a program etch cannot run fails before any allocation.
        let operator_names: Vec<String> =
            plan.operators.iter().map(|o| o.qualified_name()).collect();
        let mut used = vec![false; operator_names.len()];
        for chain in &plan.chains {
            for ins in &chain.instructions {
                if let Instruction::KernelCall { op_index, .. } = ins
                    && let Some(u) = used.get_mut(*op_index)
                {
                    *u = true;
                }
            }
        }
        let mut missing: Vec<String> = operator_names
            .iter()
            .zip(&used)
            .filter(|(n, u)| **u && registry.get(n).is_none())
            .map(|(n, _)| n.clone())
            .collect();
        missing.dedup();
        if !missing.is_empty() {
            return Err(RuntimeError::MissingOperators {
                method: name.to_string(),
                missing,
            });
        }

        let delegates = init_delegates(
            file,
            plan,
            backends,
            data_files,
            budget,
            options.release_pages,
        )?;

        let mut steps = Vec::new();
        for chain in &plan.chains {
            // Jump destinations are chain-relative; steps of all chains are flattened.
            let chain_start = steps.len();
            for ins in &chain.instructions {
                steps.push(match ins {
                    Instruction::KernelCall { op_index, args } => {
                        let op_name = &operator_names[*op_index];
                        let kernel = registry.get(op_name).ok_or_else(|| {
                            RuntimeError::MissingOperators {
                                method: name.to_string(),
                                missing: vec![op_name.clone()],
                            }
                        })?;
                        Step::Kernel {
                            kernel,
                            batched: registry.get_batched(op_name),
                            op: *op_index,
                            args: args.clone().into_boxed_slice(),
                            epilogue: Epilogue::default(),
                        }
                    }
                    Instruction::DelegateCall {
                        delegate_index,
                        args,
                    } => Step::Delegate {
                        delegate: *delegate_index,
                        args: args.clone().into_boxed_slice(),
                    },
                    Instruction::MoveCall { move_from, move_to } => Step::Move {
                        from: *move_from,
                        to: *move_to,
                    },
                    Instruction::JumpFalseCall {
                        cond_value_index,
                        destination_instruction,
                    } => Step::JumpFalse {
                        cond: *cond_value_index,
                        destination: chain_start + *destination_instruction,
                    },
                    Instruction::FreeCall { value_index } => Step::Free {
                        value: *value_index,
                    },
                });
            }
        }
        let folded = if options.fold_constants {
            fold::fold(file, plan, &mut steps, &operator_names, budget)?
        } else {
            fold::Folded::default()
        };
        if options.release_pages && folded.bytes > 0 {
            // As after a delegate packs its weights: the file pages folding read (the
            // convolution weights it scaled) go back to the page cache; only the pages
            // the remaining steps read are faulted in again.
            file.bytes().release_pages();
        }
        let planned_bytes = plan
            .non_const_buffer_sizes
            .iter()
            .skip(1)
            .map(|&s| s as usize)
            .sum();
        let has_jumps = steps.iter().any(|s| matches!(s, Step::JumpFalse { .. }));
        Ok(MethodPlan {
            name: name.to_string(),
            meta: MethodMeta::from_plan(plan),
            has_jumps,
            steps,
            operator_names,
            delegates,
            inputs: plan.inputs.clone(),
            outputs: plan.outputs.clone(),
            planned_bytes,
            folded,
        })
    }
}

/// Initialises every delegate of `plan` with its backend. A delegate whose backend is
/// not registered fails here, naming the first instruction that calls it.
fn init_delegates(
    file: &ProgramFile,
    plan: &ExecutionPlan,
    backends: &BackendRegistry,
    data_files: &[DataFile],
    budget: &MemoryBudget,
    release_pages: bool,
) -> Result<Vec<LoadedDelegate>, RuntimeError> {
    let first_call = |index: usize| {
        plan.chains
            .iter()
            .flat_map(|c| &c.instructions)
            .position(|i| {
                matches!(i, Instruction::DelegateCall { delegate_index, .. } if *delegate_index == index)
            })
            .unwrap_or(0)
    };
    let named_data = ProgramNamedData { file, data_files };
    let mut loaded = Vec::with_capacity(plan.delegates.len());
    for (index, delegate) in plan.delegates.iter().enumerate() {
        let Some(backend) = backends.get(&delegate.id) else {
            return Err(RuntimeError::DelegateUnavailable {
                method: plan.name.clone(),
                instruction: first_call(index),
                backend: delegate.id.clone(),
            });
        };
        let range = file.delegate_data(&delegate.processed)?;
        let payload = file
            .slice(range)
            .ok_or_else(|| RuntimeError::DelegateInit {
                method: plan.name.clone(),
                delegate: index,
                backend: delegate.id.clone(),
                source: BackendError::InvalidPayload {
                    field: "processed".into(),
                    reason: "payload range lies outside the file".into(),
                },
            })?;
        let specs: Vec<CompileSpecRef<'_>> = delegate
            .compile_specs
            .iter()
            .map(|c| CompileSpecRef {
                key: &c.key,
                value: &c.value,
            })
            .collect();
        let ctx = BackendInitContext {
            method: &plan.name,
            delegate_index: index,
            compile_specs: &specs,
            named_data: &named_data,
            memory_budget: budget,
        };
        let handle = backend
            .init(payload, &ctx)
            .map_err(|source| RuntimeError::DelegateInit {
                method: plan.name.clone(),
                delegate: index,
                backend: delegate.id.clone(),
                source,
            })?;
        let packed_bytes = handle.summary().packed_bytes;
        let packed = budget.reserve(
            || {
                format!(
                    "the packed weights of delegate {index} ({}) of method {:?}",
                    delegate.id, plan.name
                )
            },
            packed_bytes as u64,
        )?;
        if release_pages && packed_bytes > 0 {
            // The delegate copied the weights it read into its own memory: give the
            // file pages it faulted in back now, so that at no point are both copies
            // resident (peak memory = packed weights + one delegate's file pages).
            file.bytes().release_pages();
            for d in data_files {
                d.bytes().release_pages();
            }
        }
        loaded.push(LoadedDelegate {
            backend: delegate.id.clone(),
            payload_bytes: payload.len(),
            handle,
            _packed: packed,
        });
    }
    Ok(loaded)
}

impl Method {
    /// A new session of `plan`: values initialised, constants bound zero-copy from
    /// `file`, planned buffers allocated from `memory_allocator`, kernel scratch from
    /// `temp`.
    pub fn new(
        plan: Arc<MethodPlan>,
        file: &ProgramFile,
        memory_allocator: &Arc<dyn MemoryAllocator>,
        pool: Arc<ThreadPool>,
        temp: Option<Box<dyn MemoryAllocator>>,
        budget: &MemoryBudget,
    ) -> Result<Method, RuntimeError> {
        let name = plan.name.as_str();
        let file_plan = file_plan(file, name)?;
        let planned_bytes = file_plan
            .non_const_buffer_sizes
            .iter()
            .fold(0u64, |sum, &b| sum.saturating_add(b));
        let planned_reservation = budget.reserve(
            || format!("the planned memory of method {name:?}"),
            planned_bytes,
        )?;
        let mut storage = Storage::new();
        let planned = PlannedMemory::allocate(
            &mut storage,
            &file_plan.non_const_buffer_sizes,
            memory_allocator,
        )
        .map_err(|source| RuntimeError::Plan {
            method: name.to_string(),
            source,
        })?;
        let mut loader = Loader {
            file,
            plan: file_plan,
            storage,
            planned: Some(planned),
            program_region: None,
            mutable_inits: Vec::new(),
        };

        let mut is_input = vec![false; file_plan.values.len()];
        for &i in &file_plan.inputs {
            if let Some(f) = is_input.get_mut(i) {
                *f = true;
            }
        }
        let mut values = Vec::with_capacity(file_plan.values.len());
        for (i, v) in file_plan.values.iter().enumerate() {
            values.push(loader.value(i, v, is_input[i])?);
        }
        loader.bind_folded(&plan.folded, &mut values);

        let input_spans = file_plan
            .inputs
            .iter()
            .map(|&i| {
                values
                    .get(i)
                    .and_then(|v| v.as_tensor())
                    .and_then(|t| t.data())
            })
            .collect();
        let planned_spans = loader
            .planned
            .as_ref()
            .map(|p| p.whole_buffers())
            .unwrap_or_default();
        Ok(Method {
            planned_spans,
            mutable_inits: loader.mutable_inits,
            input_set: vec![false; file_plan.inputs.len()],
            plan,
            storage: loader.storage,
            input_spans,
            values,
            pool,
            temp,
            stats: MethodStats::default(),
            profile: None,
            node_times: None,
            _planned_reservation: planned_reservation,
            planned_allocator: Arc::clone(memory_allocator),
        })
    }
}
