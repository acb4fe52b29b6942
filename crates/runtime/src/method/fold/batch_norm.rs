//! Inference batch norm folded into the convolution before it.
//!
//! `_native_batch_norm_legit_no_training(conv(x, W, b), gamma, beta, mean, var, _, eps)`
//! is, per output channel `co`, `conv(x, W, b) * s[co] + (beta[co] - mean[co] * s[co])`
//! with `s = gamma / sqrt(var + eps)`: the convolution with weight `W[co, ..] * s[co]`
//! and bias `(b[co] - mean[co]) * s[co] + beta[co]` (`gamma` absent is 1, `beta` and `b`
//! absent are 0). Computed in f64, rounded once to f32.

use etch_format::{ScalarType, ShapeDynamism, Value as FileValue};
use etch_kernels::Tensor;

use super::super::{FoldCounts, Step};
use super::Folder;
use super::activation::{Activation, activation_after, retarget};
use super::input_major::{input_major, input_major_order};
use super::lifetimes::{Lifetimes, Placement, is_fresh_out_like, place_out_earlier};
use super::uses::Uses;
use crate::RuntimeError;

pub(super) const CONVOLUTION: &str = "aten::convolution.out";
const BATCH_NORM: &str = "aten::_native_batch_norm_legit_no_training.out";

/// `convolution.out(input, weight, bias, stride, padding, dilation, transposed,
/// output_padding, groups, out)` and its return slot.
pub(super) mod conv_arg {
    pub const WEIGHT: usize = 1;
    pub const BIAS: usize = 2;
    pub const TRANSPOSED: usize = 6;
    pub const GROUPS: usize = 8;
    pub const OUT: usize = 9;
    pub const RETURN: usize = 10;
    pub const COUNT: usize = 11;
}

/// `_native_batch_norm_legit_no_training.out(input, weight, bias, running_mean,
/// running_var, momentum, eps, out0, out1, out2)` and its return list.
mod bn_arg {
    pub const INPUT: usize = 0;
    pub const WEIGHT: usize = 1;
    pub const BIAS: usize = 2;
    pub const MEAN: usize = 3;
    pub const VAR: usize = 4;
    pub const EPS: usize = 6;
    pub const OUT0: usize = 7;
    pub const OUT1: usize = 8;
    pub const OUT2: usize = 9;
    pub const RETURN: usize = 10;
    pub const COUNT: usize = 11;
}

/// A convolution and the batch norm folded into it, as value indices.
struct Pair {
    weight: usize,
    bias: Option<usize>,
    gamma: Option<usize>,
    beta: Option<usize>,
    mean: usize,
    var: usize,
    eps: f64,
    /// The convolution's out, which the batch norm reads.
    conv_out: usize,
    out0: usize,
    channels: usize,
}

/// Folds each batch norm that directly follows (among the kept steps) the convolution
/// feeding it, rewriting the convolution and clearing the batch norm's `keep` flag.
///
/// When the convolution cannot write the batch norm's out (no free bytes for it one step
/// early: the memory plan put it over the convolution's input) but an activation reads
/// it next, the convolution writes the activation's out instead, which the plan put in
/// bytes free at the convolution (its own out's), with the activation as its epilogue.
pub(super) fn fold_batch_norms(
    folder: &mut Folder<'_>,
    steps: &mut [Step],
    keep: &mut [bool],
    (uses, lifetimes): (&Uses, &mut Lifetimes),
    (operator_names, counts): (&[String], &mut FoldCounts),
) -> Result<(), RuntimeError> {
    for c in 0..steps.len() {
        if !keep[c] {
            continue;
        }
        let Some(b) = (c + 1..steps.len()).find(|&j| keep[j]) else {
            break;
        };
        let (Some(conv), Some(bn)) = (
            kernel_args(&steps[c], CONVOLUTION, operator_names),
            kernel_args(&steps[b], BATCH_NORM, operator_names),
        ) else {
            continue;
        };
        let Some(pair) = match_pair(folder, uses, (c, conv), (b, bn)) else {
            continue;
        };
        let order = input_major_order(folder, uses, conv);
        let target = match place_out_earlier(folder, lifetimes, c, pair.conv_out, pair.out0) {
            Some(at) => Target::BatchNormOut(at),
            None => {
                let kept = (&*steps, &*keep);
                let Some(act) = activation_after(folder, uses, kept, b, pair.out0, operator_names)
                else {
                    continue;
                };
                if !uses.only_in_kept(pair.out0, &[b, act.step], keep) {
                    continue;
                }
                match place_out_earlier(folder, lifetimes, c, pair.conv_out, act.out) {
                    Some(at) => Target::ActivationOut(act, at),
                    None => continue,
                }
            }
        };
        let Some((weight, bias)) = fold_pair(folder, &pair, order)? else {
            continue;
        };
        if order.is_some() {
            counts.input_major_filters += 1;
        }
        match target {
            Target::BatchNormOut(out0_at) => {
                if Some(out0_at) != Placement::of(folder.plan(), pair.out0) {
                    folder.relocate(pair.out0, out0_at);
                }
                lifetimes.occupy(pair.out0, out0_at, c);
                if let Step::Kernel { args, .. } = &mut steps[c] {
                    args[conv_arg::OUT] = pair.out0;
                    args[conv_arg::RETURN] = pair.out0;
                }
            }
            Target::ActivationOut(act, at) => {
                retarget(folder, lifetimes, (&mut steps[c], c), &act, at);
                keep[act.step] = false;
                counts.activations += 1;
            }
        }
        if let Step::Kernel { args, .. } = &mut steps[c] {
            args[conv_arg::WEIGHT] = weight;
            args[conv_arg::BIAS] = bias;
        }
        keep[b] = false;
        counts.batch_norms += 1;
    }
    Ok(())
}

/// What a folded convolution writes, and where.
enum Target {
    /// The batch norm's out.
    BatchNormOut(Placement),
    /// The out of the activation after the batch norm, folded in as well.
    ActivationOut(Activation, Placement),
}

/// The arguments of a kernel step calling `op`, if `step` is one.
pub(super) fn kernel_args<'s>(
    step: &'s Step,
    op: &str,
    operator_names: &[String],
) -> Option<&'s [usize]> {
    match step {
        Step::Kernel { op: o, args, .. } if operator_names.get(*o).is_some_and(|n| n == op) => {
            Some(args)
        }
        _ => None,
    }
}

/// The pair, when batch norm step `b` can be folded into convolution step `c`: the
/// convolution is f32, not transposed, with constant weight (and bias); its out is read
/// by the batch norm alone; the batch norm's statistics are constants, its other outs
/// read by nothing, and its out0 has the convolution out's shape and layout.
fn match_pair(
    folder: &Folder<'_>,
    uses: &Uses,
    (c, conv): (usize, &[usize]),
    (b, bn): (usize, &[usize]),
) -> Option<Pair> {
    let plan = folder.plan();
    if conv.len() != conv_arg::COUNT || bn.len() != bn_arg::COUNT {
        return None;
    }
    let out = conv[conv_arg::OUT];
    if conv[conv_arg::RETURN] != out || bn[bn_arg::INPUT] != out {
        return None;
    }
    // The convolution's out: read by the batch norm only.
    let out_t = static_f32(folder, out)?;
    if !uses.only_in(out, &[c, b]) || uses.writers[out] != 1 || out_t.rank() < 2 {
        return None;
    }
    let channels = out_t.sizes()[1];
    // The batch norm's outs: out1, out2 and the return list read by nothing else.
    for v in [bn[bn_arg::OUT1], bn[bn_arg::OUT2], bn[bn_arg::RETURN]] {
        if !uses.only_in(v, &[b]) {
            return None;
        }
    }
    // out0, which the convolution will write: a fresh value of the same layout.
    let out0 = bn[bn_arg::OUT0];
    if !is_fresh_out_like(folder, uses, out0, b, &out_t) {
        return None;
    }
    // A plain (not transposed) convolution of constant f32 weights [C_out, ..].
    let transposed = conv[conv_arg::TRANSPOSED];
    if plan.values.get(transposed) != Some(&FileValue::Bool(false)) || !uses.is_fixed(transposed) {
        return None;
    }
    let weight = conv[conv_arg::WEIGHT];
    let weight_t = constant_f32(folder, weight)?;
    if !(3..=4).contains(&weight_t.rank()) || weight_t.sizes()[0] != channels {
        return None;
    }
    let eps_index = bn[bn_arg::EPS];
    let eps = match plan.values.get(eps_index) {
        Some(FileValue::Double(e)) if uses.is_fixed(eps_index) => *e,
        _ => return None,
    };
    Some(Pair {
        weight,
        bias: per_channel(folder, uses, conv[conv_arg::BIAS], channels, true)?,
        gamma: per_channel(folder, uses, bn[bn_arg::WEIGHT], channels, true)?,
        beta: per_channel(folder, uses, bn[bn_arg::BIAS], channels, true)?,
        mean: per_channel(folder, uses, bn[bn_arg::MEAN], channels, false)??,
        var: per_channel(folder, uses, bn[bn_arg::VAR], channels, false)??,
        eps,
        conv_out: out,
        out0,
        channels,
    })
}

/// Value `v`'s tensor, when it is a static f32 tensor.
pub(super) fn static_f32(folder: &Folder<'_>, v: usize) -> Option<Tensor> {
    folder
        .tensor(v)
        .filter(|t| t.dtype() == ScalarType::Float && t.dynamism() == ShapeDynamism::Static)
}

/// Value `v`'s tensor, when it is a constant f32 tensor.
fn constant_f32(folder: &Folder<'_>, v: usize) -> Option<Tensor> {
    folder
        .tensor(v)
        .filter(|t| t.dtype() == ScalarType::Float && folder.is_constant(v))
}

/// An optional per-channel argument: `Some(None)` for a fixed None (when `optional`),
/// `Some(Some(v))` for a constant f32 `[channels]`, `None` otherwise.
fn per_channel(
    folder: &Folder<'_>,
    uses: &Uses,
    v: usize,
    channels: usize,
    optional: bool,
) -> Option<Option<usize>> {
    match folder.plan().values.get(v) {
        Some(FileValue::Null) if optional && uses.is_fixed(v) => Some(None),
        _ => constant_f32(folder, v)
            .filter(|t| t.sizes() == [channels])
            .map(|_| Some(v)),
    }
}

/// Computes the folded weight and bias and appends them as constants, the weight
/// stored input-channel major with dim order `order` when given
/// ([`input_major_order`]); `None` when a constant's data does not match its shape.
fn fold_pair(
    folder: &mut Folder<'_>,
    p: &Pair,
    order: Option<&[u8]>,
) -> Result<Option<(usize, usize)>, RuntimeError> {
    let Some(weight_t) = folder.tensor(p.weight) else {
        return Ok(None);
    };
    let c = p.channels;
    let mut read = |v: Option<usize>| -> Result<Option<Option<Vec<f32>>>, RuntimeError> {
        match v {
            None => Ok(Some(None)),
            Some(v) => Ok(folder.f32_data(v)?.filter(|d| d.len() == c).map(Some)),
        }
    };
    let (Some(bias), Some(gamma), Some(beta), Some(Some(mean)), Some(Some(var))) = (
        read(p.bias)?,
        read(p.gamma)?,
        read(p.beta)?,
        read(Some(p.mean))?,
        read(Some(p.var))?,
    ) else {
        return Ok(None);
    };
    let Some(weight) = folder.f32_data(p.weight)? else {
        return Ok(None);
    };
    let numel = weight_t.numel();
    if c == 0 || weight.len() != numel || numel % c != 0 {
        return Ok(None);
    }
    let at = |d: &Option<Vec<f32>>, co: usize, absent: f64| {
        d.as_ref().map_or(absent, |d| f64::from(d[co]))
    };
    let scale: Vec<f64> = (0..c)
        .map(|co| at(&gamma, co, 1.0) / (f64::from(var[co]) + p.eps).sqrt())
        .collect();
    let new_bias: Vec<f32> = (0..c)
        .map(|co| {
            ((at(&bias, co, 0.0) - f64::from(mean[co])) * scale[co] + at(&beta, co, 0.0)) as f32
        })
        .collect();
    let per_channel = numel / c;
    let mut new_weight = vec![0f32; numel];
    if weight_t.dim_order().first() == Some(&0) {
        // Output channels outermost (contiguous or channels-last): one block each.
        let blocks = new_weight
            .chunks_mut(per_channel)
            .zip(weight.chunks(per_channel));
        for ((dst, src), s) in blocks.zip(&scale) {
            for (d, w) in dst.iter_mut().zip(src) {
                *d = (f64::from(*w) * s) as f32;
            }
        }
    } else {
        // Element `l` in logical order belongs to channel `l / per_channel` and sits at
        // `storage_index(l)` in the weight's storage.
        for l in 0..numel {
            let s = weight_t.storage_index(l);
            if let (Some(w), Some(dst)) = (weight.get(s), new_weight.get_mut(s)) {
                *dst = (f64::from(*w) * scale[l / per_channel]) as f32;
            }
        }
    }
    let bias_t = Tensor::new(ScalarType::Float, &[c], None)
        .map_err(|e| folder.err(p.out0, e.to_string()))?;
    let (weight_t, new_weight) = match order {
        Some(order) => match input_major(folder, (&weight_t, &new_weight), order, p.weight)? {
            Some(stored) => stored,
            None => return Ok(None),
        },
        None => (weight_t, new_weight),
    };
    let added = folder.add_f32_constants(&[(weight_t, &new_weight), (bias_t, &new_bias)])?;
    match added[..] {
        [w, b] => Ok(Some((w, b))),
        _ => Ok(None),
    }
}
