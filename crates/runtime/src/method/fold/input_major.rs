//! Small-plane convolution filters stored input-channel major.
//!
//! A convolution of one group over small planes and of modest depth (MobileNetV2's 7x7
//! pointwise layers, ResNet-18's 1x1 downsampling to 7x7) runs faster with the output
//! channels in the vector lanes, which reads one row of the filter per input channel
//! (per im2col row): the filter `[c_out, c_in, kh, kw]` stored as `[c_in, kh, kw,
//! c_out]`, i.e. with dim order `(1, 2, 3, 0)`, or `(1, 0, 2, 3)` for a 1x1 filter (see
//! [`etch_kernels::ops::conv::prefers_input_major_filter`], which decides where). Its
//! constant filter is stored so here, once; the kernel reads the layout from the
//! tensor's dim order. A filter the batch norm fold makes is stored so as it is made
//! ([`input_major_order`] in `batch_norm.rs`), so that no second copy is kept.

use etch_format::{ShapeDynamism, Value as FileValue};
use etch_kernels::Tensor;
use etch_kernels::ops::conv::prefers_input_major_filter;

use super::super::{FoldCounts, Step};
use super::Folder;
use super::batch_norm::{CONVOLUTION, conv_arg, kernel_args, static_f32};
use super::uses::Uses;
use crate::RuntimeError;

/// The dim order a convolution's filter should be stored in, when the step `conv` (its
/// arguments) is an f32 convolution of one group (fixed), not transposed, whose static
/// out has planes the kernel prefers an input-major filter for and whose filter is a
/// static contiguous f32 tensor: `(1, 0, 2, 3)` for a 1x1 filter, `(1, 2, 3, 0)`
/// otherwise (`[c_in, kh, kw, c_out]`, a row per im2col row).
pub(super) fn input_major_order(
    folder: &Folder<'_>,
    uses: &Uses,
    conv: &[usize],
) -> Option<&'static [u8]> {
    let plan = folder.plan();
    if conv.len() != conv_arg::COUNT {
        return None;
    }
    let fixed = |v: usize| uses.is_fixed(v).then(|| plan.values.get(v)).flatten();
    let plain = matches!(
        fixed(conv[conv_arg::TRANSPOSED]),
        Some(FileValue::Bool(false))
    ) && matches!(fixed(conv[conv_arg::GROUPS]), Some(FileValue::Int(1)));
    let weight = static_f32(folder, conv[conv_arg::WEIGHT])?;
    let out = static_f32(folder, conv[conv_arg::OUT])?;
    let one_by_one = weight.sizes().get(2..)?.iter().all(|&k| k == 1);
    let order: &'static [u8] = match (weight.rank(), one_by_one) {
        (3, true) => &[1, 0, 2],
        (3, false) => &[1, 2, 0],
        (4, true) => &[1, 0, 2, 3],
        (4, false) => &[1, 2, 3, 0],
        _ => return None,
    };
    let pixels: usize = out.sizes().get(2..)?.iter().product();
    let depth: usize = weight.sizes().get(1..)?.iter().product();
    let taps: usize = weight.sizes().get(2..)?.iter().product();
    (plain
        && weight.is_contiguous()
        && out.rank() == weight.rank()
        && prefers_input_major_filter(pixels, depth, taps))
    .then_some(order)
}

/// `weight` (`[c_out, ..]`, contiguous) stored as `[.., c_out]` (each output channel's
/// values a column), and its tensor with dim order `order`; `None` when the data does
/// not match the shape.
pub(super) fn input_major(
    folder: &Folder<'_>,
    (weight_t, weight): (&Tensor, &[f32]),
    order: &[u8],
    at: usize,
) -> Result<Option<(Tensor, Vec<f32>)>, RuntimeError> {
    let c_out = weight_t.sizes().first().copied().unwrap_or(0);
    if c_out == 0 || weight.len() != weight_t.numel() || weight.len() % c_out != 0 {
        return Ok(None);
    }
    let rows = weight.len() / c_out;
    let mut stored = vec![0f32; weight.len()];
    for (co, filter) in weight.chunks_exact(rows.max(1)).enumerate() {
        for (k, &w) in filter.iter().enumerate() {
            stored[k * c_out + co] = w;
        }
    }
    let t = Tensor::with_layout(
        weight_t.dtype(),
        weight_t.sizes(),
        order,
        ShapeDynamism::Static,
        None,
    )
    .map_err(|e| folder.err(at, e.to_string()))?;
    Ok(Some((t, stored)))
}

/// Stores the constant filter of each kept convolution step that prefers it input-channel
/// major (a new constant; the step reads it instead).
pub(super) fn store_input_major_filters(
    folder: &mut Folder<'_>,
    steps: &mut [Step],
    keep: &[bool],
    uses: &Uses,
    (operator_names, counts): (&[String], &mut FoldCounts),
) -> Result<(), RuntimeError> {
    for (c, step) in steps.iter_mut().enumerate() {
        if !keep[c] {
            continue;
        }
        let Some(conv) = kernel_args(step, CONVOLUTION, operator_names) else {
            continue;
        };
        let Some(order) = input_major_order(folder, uses, conv) else {
            continue;
        };
        let w = conv[conv_arg::WEIGHT];
        let (Some(weight_t), true) = (folder.tensor(w), folder.is_constant(w)) else {
            continue;
        };
        let Some(weight) = folder.f32_data(w)? else {
            continue;
        };
        let Some((t, stored)) = input_major(folder, (&weight_t, &weight), order, w)? else {
            continue;
        };
        let [added] = folder.add_f32_constants(&[(t, &stored)])?[..] else {
            continue;
        };
        if let Step::Kernel { args, .. } = step {
            args[conv_arg::WEIGHT] = added;
        }
        counts.input_major_filters += 1;
    }
    Ok(())
}
