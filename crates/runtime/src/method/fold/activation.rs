//! Activations folded into the convolution before them.
//!
//! `hardtanh(conv(x, W, b), lo, hi)` is the convolution with its outputs clamped into
//! `[lo, hi]` as they are written, and `relu(conv(..))` the clamp into `[0, +inf)`
//! (the portable `relu` keeps NaN and -0.0, as a clamp does): the convolution step gets
//! that [`Epilogue`], writes the activation's out, and the activation step goes. Saves
//! one pass over the activation's bytes per convolution (MobileNetV2's `hardtanh`s,
//! ResNet's `relu`s after a convolution). Exact: the clamp sees the very values the
//! activation would have read.

use etch_format::Value as FileValue;
use etch_kernels::Epilogue;

use super::super::{FoldCounts, Step};
use super::Folder;
use super::batch_norm::{CONVOLUTION, conv_arg, kernel_args, static_f32};
use super::lifetimes::{Lifetimes, Placement, is_fresh_out_like, place_out_earlier};
use super::uses::Uses;

const HARDTANH: &str = "aten::hardtanh.out";
const RELU: &str = "aten::relu.out";

/// An activation step that can fold into the step writing its input.
pub(super) struct Activation {
    /// The step.
    pub step: usize,
    /// Its out, which the earlier step will write.
    pub out: usize,
    /// Its bounds, as an epilogue.
    pub epilogue: Epilogue,
}

/// Folds each `hardtanh` or `relu` that directly follows (among the kept steps) the
/// convolution feeding it, giving the convolution the clamp and clearing the
/// activation's `keep` flag.
pub(super) fn fold_activations(
    folder: &mut Folder<'_>,
    steps: &mut [Step],
    keep: &mut [bool],
    (uses, lifetimes): (&Uses, &mut Lifetimes),
    (operator_names, counts): (&[String], &mut FoldCounts),
) {
    debug_assert!(Epilogue::FUSABLE_OPS.contains(&CONVOLUTION));
    for c in 0..steps.len() {
        if !keep[c] {
            continue;
        }
        let Some(conv) = kernel_args(&steps[c], CONVOLUTION, operator_names) else {
            continue;
        };
        let Step::Kernel { epilogue, .. } = &steps[c] else {
            continue;
        };
        if conv.len() != conv_arg::COUNT || *epilogue != Epilogue::default() {
            continue;
        }
        let out = conv[conv_arg::OUT];
        if conv[conv_arg::RETURN] != out {
            continue;
        }
        let Some(act) = activation_after(folder, uses, (steps, keep), c, out, operator_names)
        else {
            continue;
        };
        if !uses.only_in_kept(out, &[c, act.step], keep) || uses.writers[out] != 1 {
            continue;
        }
        let Some(out_at) = place_out_earlier(folder, lifetimes, c, out, act.out) else {
            continue;
        };
        retarget(folder, lifetimes, (&mut steps[c], c), &act, out_at);
        keep[act.step] = false;
        counts.activations += 1;
    }
}

/// The activation step right after step `after` (among the kept steps), when it reads
/// `input` (a static f32 tensor) and writes a fresh value of the same layout.
pub(super) fn activation_after(
    folder: &Folder<'_>,
    uses: &Uses,
    (steps, keep): (&[Step], &[bool]),
    after: usize,
    input: usize,
    operator_names: &[String],
) -> Option<Activation> {
    let h = (after + 1..steps.len()).find(|&j| keep[j])?;
    let (reads, out, clamp) = activation(folder, uses, &steps[h], operator_names)?;
    let input_t = static_f32(folder, input)?;
    (reads == input && is_fresh_out_like(folder, uses, out, h, &input_t)).then_some(Activation {
        step: h,
        out,
        epilogue: Epilogue {
            clamp: Some(clamp),
            ..Epilogue::default()
        },
    })
}

/// Makes convolution step `c` write the activation's out (placed at `at`) with its
/// epilogue.
pub(super) fn retarget(
    folder: &mut Folder<'_>,
    lifetimes: &mut Lifetimes,
    (step, c): (&mut Step, usize),
    act: &Activation,
    at: Placement,
) {
    if Some(at) != Placement::of(folder.plan(), act.out) {
        folder.relocate(act.out, at);
    }
    lifetimes.occupy(act.out, at, c);
    if let Step::Kernel { args, epilogue, .. } = step {
        args[conv_arg::OUT] = act.out;
        args[conv_arg::RETURN] = act.out;
        *epilogue = act.epilogue;
    }
}

/// Step `step` as `(input, out, clamp)`: a `hardtanh` with fixed bounds, or a `relu`.
fn activation(
    folder: &Folder<'_>,
    uses: &Uses,
    step: &Step,
    operator_names: &[String],
) -> Option<(usize, usize, (f32, f32))> {
    if let Some(args) = kernel_args(step, HARDTANH, operator_names) {
        // hardtanh.out(self, min_val, max_val, out) and its return slot.
        let [input, lo, hi, out, ret] = args[..] else {
            return None;
        };
        let (lo, hi) = (
            fixed_bound(folder, uses, lo)?,
            fixed_bound(folder, uses, hi)?,
        );
        // An empty or NaN range fills the out with a bound: left to the kernel.
        return (lo <= hi && ret == out).then_some((input, out, (lo, hi)));
    }
    // relu.out(self, out) and its return slot.
    let [input, out, ret] = kernel_args(step, RELU, operator_names)?[..] else {
        return None;
    };
    (ret == out).then_some((input, out, (0.0, f32::INFINITY)))
}

/// A bound of `hardtanh` that no step writes, as the kernel casts it for an f32 input.
fn fixed_bound(folder: &Folder<'_>, uses: &Uses, v: usize) -> Option<f32> {
    if !uses.is_fixed(v) {
        return None;
    }
    match folder.plan().values.get(v)? {
        FileValue::Double(d) => Some(*d as f32),
        FileValue::Int(i) => Some(*i as f32),
        _ => None,
    }
}
