//! Constant steps: kernel steps whose result is the same on every call, run once.

use etch_format::{ShapeDynamism, Value as FileValue};

use super::super::Step;
use super::Folder;
use super::lifetimes::Lifetimes;
use super::uses::{Uses, outs};
use crate::RuntimeError;

/// Evaluates every step whose inputs are constants, in order (so that a chain of them
/// folds whole), clearing its `keep` flag; returns how many folded.
pub(super) fn fold_constant_steps(
    folder: &mut Folder<'_>,
    steps: &[Step],
    keep: &mut [bool],
    (uses, lifetimes): (&Uses, &mut Lifetimes),
) -> Result<usize, RuntimeError> {
    let mut folded = 0;
    for (i, step) in steps.iter().enumerate() {
        let Step::Kernel { kernel, args, .. } = step else {
            continue;
        };
        let outs = outs(folder.plan(), args);
        if foldable(folder, uses, i, args, &outs)
            // The outs' planned bytes stop being written: no other tensor may share them.
            && outs
                .iter()
                .all(|&o| lifetimes.unshared(folder.plan(), o, |v| folder.is_constant(v)))
            && folder.evaluate(*kernel, args, &outs)?
        {
            keep[i] = false;
            folded += 1;
        }
    }
    Ok(folded)
}

/// True when step `step` writes only `outs`, tensors nothing else writes or reads
/// before it, and reads only constants and fixed values.
fn foldable(folder: &Folder<'_>, uses: &Uses, step: usize, args: &[usize], outs: &[usize]) -> bool {
    let plan = folder.plan();
    let outs_ok = !outs.is_empty()
        && outs.iter().all(|&o| match plan.values.get(o) {
            Some(FileValue::Tensor(meta)) => {
                meta.data_buffer_idx == 0
                    && meta.shape_dynamism == ShapeDynamism::Static
                    && uses.writers[o] == 1
                    && !uses.pinned[o]
                    && uses.steps[o].first() == Some(&step)
            }
            _ => false,
        });
    outs_ok
        && args
            .iter()
            .all(|&a| outs.contains(&a) || fixed_input(folder, uses, a, outs))
}

/// True when argument `v` is the same on every call: a constant tensor, a list of
/// them (or of the step's own outs: its return list), or a value no step writes.
fn fixed_input(folder: &Folder<'_>, uses: &Uses, v: usize, outs: &[usize]) -> bool {
    match folder.plan().values.get(v) {
        Some(FileValue::Tensor(_)) => folder.is_constant(v),
        Some(FileValue::TensorList(items)) => {
            uses.is_fixed(v)
                && (items.iter().all(|&i| folder.is_constant(i))
                    || items.iter().all(|i| outs.contains(i)))
        }
        Some(FileValue::OptionalTensorList(items)) => {
            uses.is_fixed(v) && items.iter().flatten().all(|&i| folder.is_constant(i))
        }
        Some(FileValue::IntList(items)) => {
            uses.is_fixed(v) && items.iter().all(|&i| uses.is_fixed(i))
        }
        Some(_) => uses.is_fixed(v),
        None => false,
    }
}
