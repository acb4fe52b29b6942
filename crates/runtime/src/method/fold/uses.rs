//! Who references, writes and pins each value of a method: what the fold passes check
//! before turning a value into a constant or dropping the step that writes it.

use etch_format::{ExecutionPlan, Value as FileValue};

use super::super::Step;

/// References to values by the steps of one method (before any folding).
pub(super) struct Uses {
    /// Per value: the steps that name it (as an argument or a list item), in order,
    /// each once.
    pub steps: Vec<Vec<usize>>,
    /// Per value: how many steps write it (a kernel through its return slot, every
    /// tensor of a kernel that mutates its arguments, a move's destination).
    pub writers: Vec<u32>,
    /// Per value: the steps that write it, in order (a step once per value).
    pub write_steps: Vec<Vec<usize>>,
    /// Per value: a method input or output, or named by a move, jump, free or delegate
    /// call, whose effect the passes do not model.
    pub pinned: Vec<bool>,
    /// True when the method has a `JumpFalse`.
    pub has_jumps: bool,
}

impl Uses {
    pub fn new(plan: &ExecutionPlan, steps: &[Step], operator_names: &[String]) -> Self {
        let n = plan.values.len();
        let mut uses = Uses {
            steps: vec![Vec::new(); n],
            writers: vec![0; n],
            write_steps: vec![Vec::new(); n],
            pinned: vec![false; n],
            has_jumps: false,
        };
        for &v in plan.inputs.iter().chain(&plan.outputs) {
            uses.pin(v);
        }
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Kernel { op, args, .. } => {
                    for v in referenced(plan, args) {
                        uses.reference(v, i);
                    }
                    let name = operator_names.get(*op).map(String::as_str).unwrap_or("");
                    if mutates_arguments(name) {
                        for v in referenced(plan, args) {
                            if let Some(FileValue::Tensor(_)) = plan.values.get(v) {
                                uses.write(v, i);
                            }
                        }
                    } else {
                        for v in outs(plan, args) {
                            uses.write(v, i);
                        }
                        // A prim op's scalar result slot.
                        if let Some(&last) = args.last()
                            && !matches!(plan.values.get(last), Some(FileValue::Tensor(_)))
                        {
                            uses.write(last, i);
                        }
                    }
                }
                Step::Delegate { args, .. } => {
                    for v in referenced(plan, args) {
                        uses.pin(v);
                        uses.reference(v, i);
                    }
                }
                Step::Move { from, to } => {
                    uses.pin(*from);
                    uses.pin(*to);
                    uses.write(*to, i);
                }
                Step::JumpFalse { cond, .. } => {
                    uses.pin(*cond);
                    uses.has_jumps = true;
                }
                Step::Free { value } => uses.pin(*value),
            }
        }
        uses
    }

    fn pin(&mut self, v: usize) {
        if let Some(p) = self.pinned.get_mut(v) {
            *p = true;
        }
    }

    fn write(&mut self, v: usize, step: usize) {
        if let Some(w) = self.writers.get_mut(v) {
            *w += 1;
        }
        if let Some(s) = self.write_steps.get_mut(v)
            && s.last() != Some(&step)
        {
            s.push(step);
        }
    }

    fn reference(&mut self, v: usize, step: usize) {
        if let Some(s) = self.steps.get_mut(v)
            && s.last() != Some(&step)
        {
            s.push(step);
        }
    }

    /// True when `v` is a value of the file that no step writes and nothing pins: a
    /// fixed argument (an Int, a Double, a list of them) on every call.
    pub fn is_fixed(&self, v: usize) -> bool {
        self.writers.get(v) == Some(&0) && self.pinned.get(v) == Some(&false)
    }

    /// True when nothing pins `v` and every step still kept (`keep`) that names it is
    /// one of `steps`: what [`Uses::only_in`] says once earlier passes folded steps away
    /// (their references stay in `self`).
    pub fn only_in_kept(&self, v: usize, steps: &[usize], keep: &[bool]) -> bool {
        self.pinned.get(v) == Some(&false)
            && self.steps.get(v).is_some_and(|named| {
                named
                    .iter()
                    .all(|s| steps.contains(s) || keep.get(*s) == Some(&false))
            })
    }

    /// True when the steps naming `v` are exactly `steps` and nothing pins it.
    pub fn only_in(&self, v: usize, steps: &[usize]) -> bool {
        self.pinned.get(v) == Some(&false) && self.steps.get(v).is_some_and(|s| s == steps)
    }
}

/// The values a kernel step writes, by ExecuTorch's calling convention: its last
/// argument is the return slot, which aliases the `out` tensor or lists the outs (each
/// once here). Empty when the return is not a tensor (a prim op's scalar result slot).
pub(super) fn outs(plan: &ExecutionPlan, args: &[usize]) -> Vec<usize> {
    match args.last().map(|&v| (v, plan.values.get(v))) {
        Some((v, Some(FileValue::Tensor(_)))) => vec![v],
        Some((_, Some(FileValue::TensorList(items)))) => {
            let mut outs: Vec<usize> = Vec::with_capacity(items.len());
            for &i in items {
                if !outs.contains(&i) {
                    outs.push(i);
                }
            }
            outs
        }
        _ => Vec::new(),
    }
}

/// Every value an argument list names: the arguments and the items of their lists.
pub(super) fn referenced<'a>(
    plan: &'a ExecutionPlan,
    args: &'a [usize],
) -> impl Iterator<Item = usize> + 'a {
    args.iter().flat_map(move |&a| {
        let items: Vec<usize> = match plan.values.get(a) {
            Some(FileValue::IntList(items) | FileValue::TensorList(items)) => items.clone(),
            Some(FileValue::OptionalTensorList(items)) => items.iter().flatten().copied().collect(),
            _ => Vec::new(),
        };
        std::iter::once(a).chain(items)
    })
}

/// Ops that write tensors other than their outs: in-place ops (`aten::copy_`,
/// `index_put_`) and the KV-cache updates (`llama::update_cache.out`,
/// `sdpa_with_kv_cache`).
fn mutates_arguments(op: &str) -> bool {
    let name = op.split('.').next().unwrap_or(op);
    name.ends_with('_') || name.contains("cache")
}

#[cfg(test)]
mod tests {
    use super::mutates_arguments;

    #[test]
    fn in_place_and_cache_ops_mutate_their_arguments() {
        for op in [
            "aten::copy_",
            "aten::index_put_",
            "llama::update_cache.out",
            "llama::sdpa_with_kv_cache.out",
        ] {
            assert!(mutates_arguments(op), "{op}");
        }
        for op in [
            "aten::permute_copy.out",
            "aten::add.Scalar_out",
            "aten::_to_copy.out",
        ] {
            assert!(!mutates_arguments(op), "{op}");
        }
    }
}
