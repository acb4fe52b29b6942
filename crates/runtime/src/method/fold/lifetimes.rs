//! When each planned tensor's bytes are in use, to tell whether a pass may stop writing
//! a tensor's bytes, or write a tensor at a step where the memory plan did not expect it.
//!
//! The file's memory plan lets tensors whose lifetimes do not overlap share bytes. A
//! value's bytes are in use from the first to the last step that names it, or names a
//! tensor that may alias it: an unplanned tensor with bytes (a view: `et_view` points
//! its out at its input's bytes) may alias every tensor of the steps that name it, and
//! a move's destination aliases its source, and a planned tensor that no step writes
//! (a static `view_copy` the exporter turned into a planned alias of its base) reads
//! the bytes of the tensor last written there, so such values are grouped and share one
//! lifetime. A method input is in use from the start of a call, an output until its
//! end, and a tensor with initial data (mutable state) always. The lifetimes are
//! over-estimates, which only makes the checks stricter.

use etch_format::{ExecutionPlan, Value as FileValue};
use etch_kernels::Tensor;

use super::super::Step;
use super::Folder;
use super::uses::{Uses, referenced};

/// Alignment of the bytes [`Lifetimes::find_free`] finds (a cache line).
const GAP_ALIGNMENT: u64 = 64;

/// Bytes `[start, end)` of planned buffer `memory_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub memory_id: usize,
    pub start: u64,
    pub end: u64,
}

impl Placement {
    /// Where planned tensor `v` lives, or `None` when `v` is not one.
    pub fn of(plan: &ExecutionPlan, v: usize) -> Option<Placement> {
        match plan.values.get(v) {
            Some(FileValue::Tensor(meta)) => {
                let alloc = meta.allocation_info?;
                Some(Placement {
                    memory_id: alloc.memory_id,
                    start: alloc.offset,
                    end: alloc.offset.checked_add(meta.nbytes() as u64)?,
                })
            }
            _ => None,
        }
    }

    fn overlaps(&self, other: &Placement) -> bool {
        self.memory_id == other.memory_id && self.start < other.end && other.start < self.end
    }
}

pub(super) struct Lifetimes {
    /// Per value: its group's representative (union-find parent).
    parent: Vec<usize>,
    /// Per group representative: the first and last step its bytes are in use.
    span: Vec<Option<(usize, usize)>>,
    /// Tensors a pass moved to other bytes than the file's plan gives them.
    moved: Vec<(usize, Placement)>,
}

impl Lifetimes {
    pub fn new(plan: &ExecutionPlan, steps: &[Step], uses: &Uses) -> Self {
        let n = plan.values.len();
        let mut l = Lifetimes {
            parent: (0..n).collect(),
            span: vec![None; n],
            moved: Vec::new(),
        };
        // Tensors without bytes (the `[0]` mean and invstd outs of a batch norm) alias
        // nothing.
        let has_bytes = |v: usize| match plan.values.get(v) {
            Some(FileValue::Tensor(m)) => m.nbytes() > 0,
            _ => false,
        };
        let unplanned = |v: usize| match plan.values.get(v) {
            Some(FileValue::Tensor(m)) => m.allocation_info.is_none() && m.data_buffer_idx == 0,
            _ => false,
        };
        for step in steps {
            match step {
                Step::Kernel { args, .. } | Step::Delegate { args, .. } => {
                    let tensors: Vec<usize> =
                        referenced(plan, args).filter(|&v| has_bytes(v)).collect();
                    if tensors.iter().any(|&v| unplanned(v)) {
                        for w in tensors.windows(2) {
                            l.union(w[0], w[1]);
                        }
                    }
                }
                Step::Move { from, to } => l.union(*from, *to),
                Step::JumpFalse { .. } | Step::Free { .. } => {}
            }
        }
        for v in 0..n {
            if let Some(bases) = planned_view_bases(plan, uses, v) {
                for base in bases {
                    l.union(v, base);
                }
            }
        }
        for v in 0..n {
            let state = match plan.values.get(v) {
                Some(FileValue::Tensor(m)) => m.allocation_info.is_some() && m.data_buffer_idx > 0,
                _ => false,
            };
            let named = match uses.steps.get(v).map(Vec::as_slice) {
                Some([first, .., last]) => Some((*first, *last)),
                Some([only]) => Some((*only, *only)),
                _ => None,
            };
            // An input is set before the call; an output is read after it; state lives
            // across calls.
            let input = plan.inputs.contains(&v);
            let output = plan.outputs.contains(&v);
            let own = match named {
                _ if state || (input && output) => Some((0, usize::MAX)),
                Some((_, last)) if input => Some((0, last)),
                Some((first, _)) if output => Some((first, usize::MAX)),
                None if input || output => Some((0, usize::MAX)),
                named => named,
            };
            if let Some((first, last)) = own {
                let root = l.find(v);
                l.span[root] = Some(match l.span[root] {
                    Some((f, e)) => (f.min(first), e.max(last)),
                    None => (first, last),
                });
            }
        }
        l
    }

    fn find(&mut self, mut v: usize) -> usize {
        while self.parent[v] != v {
            self.parent[v] = self.parent[self.parent[v]];
            v = self.parent[v];
        }
        v
    }

    fn union(&mut self, a: usize, b: usize) {
        if a >= self.parent.len() || b >= self.parent.len() {
            return;
        }
        let (ra, rb) = (self.find(a), self.find(b));
        self.parent[ra] = rb;
    }

    /// The steps value `v`'s bytes are in use (of its group).
    pub fn of(&mut self, v: usize) -> Option<(usize, usize)> {
        if v >= self.parent.len() {
            return None;
        }
        let root = self.find(v);
        self.span[root]
    }

    /// Where tensor `v`'s bytes are: the file's plan, unless a pass moved them.
    pub fn placement(&self, plan: &ExecutionPlan, v: usize) -> Option<Placement> {
        match self.moved.iter().rev().find(|(m, _)| *m == v) {
            Some((_, p)) => Some(*p),
            None => Placement::of(plan, v),
        }
    }

    /// Records that tensor `v` now lives at `at` and is in use from step `from` on.
    pub fn occupy(&mut self, v: usize, at: Placement, from: usize) {
        self.moved.push((v, at));
        if v < self.parent.len() {
            let root = self.find(v);
            self.span[root] = self.span[root].map(|(f, e)| (f.min(from), e));
        }
    }

    /// True when no other planned tensor uses planned tensor `v`'s bytes while `v` is in
    /// use: nothing in the plan aliases it on purpose, so a pass may stop writing
    /// those bytes (or write `v` elsewhere) without another tensor missing the data.
    pub fn unshared(
        &mut self,
        plan: &ExecutionPlan,
        v: usize,
        is_gone: impl Fn(usize) -> bool,
    ) -> bool {
        match (self.placement(plan, v), self.of(v)) {
            (Some(at), Some(life)) => self.free(plan, at, life, &[v], is_gone),
            _ => true,
        }
    }

    /// The lowest `len` bytes (at [`GAP_ALIGNMENT`]) of a planned buffer that no
    /// planned tensor but those of `except` (and those `is_gone` says no longer live in
    /// planned memory) uses during steps `from..=to`.
    pub fn find_free(
        &mut self,
        plan: &ExecutionPlan,
        len: u64,
        (from, to): (usize, usize),
        except: &[usize],
        is_gone: impl Fn(usize) -> bool,
    ) -> Option<Placement> {
        for (memory_id, &size) in plan.non_const_buffer_sizes.iter().enumerate().skip(1) {
            let mut busy: Vec<(u64, u64)> = Vec::new();
            for v in 0..plan.values.len() {
                let Some(p) = self.placement(plan, v).filter(|p| p.memory_id == memory_id) else {
                    continue;
                };
                if except.contains(&v) || is_gone(v) {
                    continue;
                }
                if self
                    .of(v)
                    .is_some_and(|(first, last)| first <= to && from <= last)
                {
                    busy.push((p.start, p.end));
                }
            }
            busy.sort_unstable();
            let mut at = 0u64;
            for (start, end) in busy {
                if at.checked_add(len)? <= start {
                    break;
                }
                at = at.max(end.checked_add(GAP_ALIGNMENT - 1)? & !(GAP_ALIGNMENT - 1));
            }
            if at.checked_add(len)? <= size {
                return Some(Placement {
                    memory_id,
                    start: at,
                    end: at + len,
                });
            }
        }
        None
    }

    /// True when no planned tensor but those of `except` (and those `is_gone` says no
    /// longer live in planned memory) uses bytes overlapping `at` during steps
    /// `from..=to`.
    pub fn free(
        &mut self,
        plan: &ExecutionPlan,
        at: Placement,
        (from, to): (usize, usize),
        except: &[usize],
        is_gone: impl Fn(usize) -> bool,
    ) -> bool {
        (0..plan.values.len()).all(|v| {
            let overlaps = self.placement(plan, v).is_some_and(|p| p.overlaps(&at));
            if !overlaps || except.contains(&v) || is_gone(v) {
                return true;
            }
            match self.of(v) {
                Some((first, last)) => last < from || to < first,
                None => true,
            }
        })
    }
}

/// The tensors whose bytes planned tensor `v` reads when `v` is a planned alias: a
/// tensor with planned bytes that no step writes and that is no method input and holds
/// no initial data, but that steps read. The exporter gives a static view the planned
/// bytes of its base (`memory.view`), and emits no step for it, so a view reads what
/// the last step that wrote those bytes before the view's first use wrote: that
/// tensor, of the same placement (or a method input of that placement when no step
/// wrote one). Without such a tensor, every planned tensor overlapping `v` that is
/// written or a method input (an over-estimate). `None` when `v` is no planned alias.
fn planned_view_bases(plan: &ExecutionPlan, uses: &Uses, v: usize) -> Option<Vec<usize>> {
    let FileValue::Tensor(meta) = plan.values.get(v)? else {
        return None;
    };
    let at = Placement::of(plan, v)?;
    let first_use = *uses.steps.get(v)?.first()?;
    let is_alias = meta.data_buffer_idx == 0
        && meta.nbytes() > 0
        && uses.writers.get(v) == Some(&0)
        && !plan.inputs.contains(&v);
    if !is_alias {
        return None;
    }
    let written_before = |u: usize| -> Option<Option<usize>> {
        let last_write = uses
            .write_steps
            .get(u)
            .and_then(|w| w.iter().copied().filter(|&s| s < first_use).max());
        match last_write {
            Some(step) => Some(Some(step)),
            None if plan.inputs.contains(&u) => Some(None),
            None => None,
        }
    };
    let mut best: Option<(Option<usize>, usize)> = None;
    for u in (0..plan.values.len()).filter(|&u| u != v) {
        if Placement::of(plan, u) != Some(at) {
            continue;
        }
        if let Some(when) = written_before(u)
            && best.is_none_or(|(b, _)| when >= b)
        {
            best = Some((when, u));
        }
    }
    if let Some((_, base)) = best {
        return Some(vec![base]);
    }
    Some(
        (0..plan.values.len())
            .filter(|&u| u != v)
            .filter(|&u| Placement::of(plan, u).is_some_and(|p| p.overlaps(&at)))
            .filter(|&u| {
                written_before(u).is_some()
                    || uses.write_steps.get(u).is_some_and(|w| !w.is_empty())
            })
            .collect(),
    )
}

/// Where step `step` can write `new_out`, a value a later step wrote, in place of its
/// own out `old_out` (which stops being written). The memory plan gave `new_out` bytes
/// free from its writer on, which may hold the step's input (its last use is the
/// step): they are kept if nothing else is in them at the step; otherwise `new_out`
/// moves to bytes of the planned buffers that nothing uses from the step to its last
/// use (`old_out` no longer needs any). `None` when there are none.
pub(super) fn place_out_earlier(
    folder: &Folder<'_>,
    lifetimes: &mut Lifetimes,
    step: usize,
    old_out: usize,
    new_out: usize,
) -> Option<Placement> {
    let plan = folder.plan();
    let own = lifetimes.placement(plan, new_out)?;
    let except = [new_out, old_out];
    let gone = |v: usize| folder.is_constant(v);
    if !lifetimes.unshared(plan, old_out, gone) || !lifetimes.unshared(plan, new_out, gone) {
        return None;
    }
    if lifetimes.free(plan, own, (step, step), &except, gone) {
        return Some(own);
    }
    let (_, last) = lifetimes.of(new_out)?;
    lifetimes.find_free(plan, own.end - own.start, (step, last), &except, gone)
}

/// True when `v` can become the out of an earlier step in place of a value shaped as
/// `like`: a planned (not constant) static f32 value of the same sizes and dim order,
/// no method input, written once, first by step `writer`.
pub(super) fn is_fresh_out_like(
    folder: &Folder<'_>,
    uses: &Uses,
    v: usize,
    writer: usize,
    like: &Tensor,
) -> bool {
    let plan = folder.plan();
    let Some(t) = super::batch_norm::static_f32(folder, v) else {
        return false;
    };
    let fresh = match plan.values.get(v) {
        Some(FileValue::Tensor(meta)) => meta.data_buffer_idx == 0,
        _ => false,
    };
    fresh
        && uses.writers[v] == 1
        && uses.steps[v].first() == Some(&writer)
        && !plan.inputs.contains(&v)
        && t.sizes() == like.sizes()
        && t.dim_order() == like.dim_order()
}
