//! Load-time folding: work that depends only on constants is done once per
//! [`MethodPlan`](super::MethodPlan), not on every call.
//!
//! * **Constant steps** ([`constant`]): a kernel step whose tensor inputs are all constants
//!   and whose other arguments are fixed values (not written at run time) yields the same
//!   outs on every call, e.g. `permute_copy` of a classifier weight. It runs once here;
//!   its outs become constants and the step is dropped. Steps are visited in order, so a
//!   chain of such steps folds whole.
//! * **Batch norm into convolution** ([`batch_norm`]): an inference batch norm whose
//!   statistics are constants, right after the f32 convolution that alone feeds it, is
//!   folded into that convolution's weight and bias (computed in f64, rounded once to
//!   f32); the convolution writes the batch norm's output and the batch norm step goes.
//! * **Activation into convolution** ([`activation`]): a `hardtanh` or `relu` right
//!   after the convolution that alone feeds it becomes the convolution's output clamp
//!   (an [`Epilogue`](etch_kernels::Epilogue)); the activation step goes.
//! * **Input-major pointwise filters** ([`input_major`]): the constant filter of a 1x1
//!   convolution over small planes is stored `[c_in, c_out]` (dim order `(1, 0, 2, 3)`),
//!   the layout its fastest kernel reads (output channels in the vector lanes).
//! * **Unread indices** ([`unread_indices`]): a `max_pool2d_with_indices` whose indices
//!   no other step reads and no method returns writes its values alone.
//!
//! Folding is exactly safe or not done: a value a pass turns into a constant (or stops
//! writing) is no method input or output, is read by no step other than those folded
//! away, is touched by no move, free or delegate call, and has a static shape. A method
//! with jumps is left alone (removing steps would move jump targets, and a loop breaks
//! the "written before read" order the passes rely on).
//!
//! The folded bytes live in [`Folded`]: buffers made once, shared (`Arc`) by every
//! session, bound into its storage zero-copy as the program's constants are, and held
//! against the program's memory budget.

mod activation;
mod batch_norm;
mod constant;
mod folder;
mod input_major;
mod lifetimes;
mod unread_indices;
mod uses;

use etch_format::{ExecutionPlan, ProgramFile};
use etch_kernels::Tensor;
use etch_memory::{MemoryBudget, RegionId, Reservation, SharedBytes, Span};

use super::{FoldCounts, Step};
use crate::RuntimeError;
use folder::Folder;
use lifetimes::Lifetimes;
pub(crate) use lifetimes::Placement;
use uses::Uses;

/// Where a folded value's bytes live in every session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// In the program's own bytes (a folded view of a file constant).
    Program { offset: usize, len: usize },
    /// In folded buffer `buffer`.
    Buffer {
        buffer: usize,
        offset: usize,
        len: usize,
    },
}

impl Place {
    /// The bytes in a session's storage whose program bytes are `program` and folded
    /// buffers `buffers`; `None` for a buffer the session lacks.
    pub(crate) fn span(
        self,
        program: impl FnOnce() -> RegionId,
        buffers: &[RegionId],
    ) -> Option<Span> {
        let (region, offset, len) = match self {
            Place::Program { offset, len } => (program(), offset, len),
            Place::Buffer {
                buffer,
                offset,
                len,
            } => (*buffers.get(buffer)?, offset, len),
        };
        Some(Span {
            region,
            offset,
            len,
        })
    }
}

/// A value that is a constant in every session of a folded plan: a folded step's out,
/// or a weight or bias made by folding a batch norm (appended after the file's values).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FoldedValue {
    /// Index in the value table.
    pub index: usize,
    /// Its metadata (unbound; each session binds it at `place`).
    pub tensor: Tensor,
    pub place: Place,
}

/// The constants folding made, shared by every session of a plan.
#[derive(Default)]
pub(crate) struct Folded {
    /// Immutable buffers, one region each in every session's storage.
    pub buffers: Vec<SharedBytes>,
    pub values: Vec<FoldedValue>,
    /// Planned tensors placed elsewhere in planned memory than the file says (a batch
    /// norm's out that its convolution now writes, one step earlier).
    pub moved: Vec<(usize, Placement)>,
    /// Values appended after the file's (new weights and biases).
    pub added_values: usize,
    /// The steps folded away, by kind.
    pub counts: FoldCounts,
    /// Bytes of `buffers`, reserved against the memory budget.
    pub bytes: usize,
    pub _reservations: Vec<Reservation>,
}

/// Runs the fold passes over `steps` (the flattened instructions of `plan`), removing
/// the steps folded away, and returns the constants they made.
pub(super) fn fold(
    file: &ProgramFile,
    plan: &ExecutionPlan,
    steps: &mut Vec<Step>,
    operator_names: &[String],
    budget: &MemoryBudget,
) -> Result<Folded, RuntimeError> {
    let uses = Uses::new(plan, steps, operator_names);
    if uses.has_jumps {
        return Ok(Folded::default());
    }
    // A value table the folder cannot build (external data) fails again, with its
    // error, when a session is made; folding just does not happen.
    let Some(mut folder) = Folder::new(file, plan, budget, &uses) else {
        return Ok(Folded::default());
    };
    let mut lifetimes = Lifetimes::new(plan, steps, &uses);
    let mut keep = vec![true; steps.len()];
    let mut counts = FoldCounts {
        constant_steps: constant::fold_constant_steps(
            &mut folder,
            steps,
            &mut keep,
            (&uses, &mut lifetimes),
        )?,
        ..FoldCounts::default()
    };
    let names = (operator_names, &mut counts);
    batch_norm::fold_batch_norms(
        &mut folder,
        steps,
        &mut keep,
        (&uses, &mut lifetimes),
        names,
    )?;
    let names = (operator_names, &mut counts);
    activation::fold_activations(
        &mut folder,
        steps,
        &mut keep,
        (&uses, &mut lifetimes),
        names,
    );
    let names = (operator_names, &mut counts);
    input_major::store_input_major_filters(&mut folder, steps, &keep, &uses, names)?;
    unread_indices::mark_unread_indices(steps, &keep, &uses, (operator_names, &mut counts));
    let mut folded = folder.finish();
    folded.counts = counts;
    let mut flags = keep.into_iter();
    steps.retain(|_| flags.next().unwrap_or(true));
    Ok(folded)
}
