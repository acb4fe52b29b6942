//! One instruction run for several sessions of the same method at once (the runtime's
//! batched step): each session has its own context (its storage, scratch) and its own
//! arguments (its values); kernels and delegates whose cost is a product with constant
//! weights run once over all sessions' rows, so the weights stream from memory once.
//!
//! A batched kernel must give every session the numbers it gets alone: only kernels
//! whose result for one row does not depend on the rows beside it take part (see
//! `etch_linalg::gemm_f32_rows_alone`), and a kernel that cannot promise that for the
//! arguments it gets returns [`Batched::PerSession`] and runs session by session.

use crate::{Args, KernelContext, KernelError};

/// Most sessions one batched step runs together.
pub const MAX_BATCH: usize = 16;

/// At most [`MAX_BATCH`] items, held inline: a batched step builds one per instruction
/// and must not allocate.
pub struct Batch<T> {
    items: [Option<T>; MAX_BATCH],
    len: usize,
}

impl<T> Batch<T> {
    /// An empty batch.
    pub fn new() -> Self {
        Batch {
            items: [const { None }; MAX_BATCH],
            len: 0,
        }
    }

    /// Appends `item`; gives it back when the batch is full.
    pub fn push(&mut self, item: T) -> Result<(), T> {
        match self.items.get_mut(self.len) {
            Some(slot) => {
                *slot = Some(item);
                self.len += 1;
                Ok(())
            }
            None => Err(item),
        }
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Item `i`.
    pub fn get(&self, i: usize) -> Option<&T> {
        self.items.get(i).and_then(Option::as_ref)
    }

    /// Item `i`, mutably.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.items.get_mut(i).and_then(Option::as_mut)
    }

    /// The items in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items[..self.len].iter().flatten()
    }

    /// The items in order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.items[..self.len].iter_mut().flatten()
    }
}

impl<T> Default for Batch<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// What a batched kernel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batched {
    /// Ran once for every session.
    Done,
    /// Did nothing: these arguments cannot share one pass (weights that differ
    /// between sessions, rows whose numbers would change); run the kernel per session.
    PerSession,
}

/// A kernel's batched form: the same instruction for each session in `args`, session
/// `i` with context `ctxs[i]`. Scratch for the shared pass comes from the first
/// session's context.
pub type BatchKernelFn =
    fn(&Batch<KernelContext<'_>>, &mut Batch<Args<'_>>) -> Result<Batched, KernelError>;

/// The error of a batch whose contexts and arguments do not pair up.
pub fn unpaired() -> KernelError {
    KernelError::invalid("batched step: a session without its context or arguments")
}
