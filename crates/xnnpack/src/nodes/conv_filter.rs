//! What the convolution kinds (`Conv2d`, `DepthwiseConv2d`, `ConvTranspose2d`) share:
//! their fields (`_XNNNodeConv`), the filter checked against the node's geometry, the
//! fp32 bias, the int8 input quantization, and the output dims of a call.

use etch_kernels::BackendError;
use etch_linalg::quant::qs8::Qs8Requant;

use crate::dims::Dims;
use crate::graph::{NodeDef, Params, Quantization, Window, invalid};
use crate::node_reader::NodeReader;
use crate::nodes::quantized::{int32_bias, requant, tensor_quant};
use crate::nodes::shapes::{ShapeResult, get, set};
use crate::nodes::window::{output_height, output_width};
use crate::plan_builder::{Bias, Builder};
use crate::schema::Datatype;
use crate::schema::NodeKind;

/// Reads a convolution node.
pub fn read(r: &NodeReader<'_, '_>, node: &mut NodeDef) -> Result<(), BackendError> {
    node.params = Params::Window(r.window(true)?);
    node.inputs = vec![
        Some(r.value(15, "input1_id")?),
        Some(r.value(16, "filter_id")?),
        r.opt_value(17, "bias_id")?,
    ];
    node.outputs = vec![r.value(18, "output_id")?];
    node.flags = r.flags(19, 0)?;
    Ok(())
}

/// A convolution's filter, checked against its geometry.
pub struct ConvFilter<'g> {
    /// The geometry; for a depthwise convolution the channels are in `groups` and the
    /// depth multiplier in `group_out` (`group_in` 1).
    pub window: Window,
    /// The constant filter bytes: `[groups * group_out, kh, kw, group_in]` (OHWI), or
    /// `[1, kh, kw, channels * multiplier]` for a depthwise convolution.
    pub bytes: &'g [u8],
    /// Output channels.
    pub out_channels: usize,
}

/// The filter of convolution node `i`: its dims must be those of the node's geometry,
/// its data constant, and a bias must have one element per output channel.
pub fn filter<'g>(
    b: &Builder<'g>,
    i: usize,
    node: &NodeDef,
) -> Result<ConvFilter<'g>, BackendError> {
    let Params::Window(window) = node.params else {
        return Err(invalid(b.field(i, node, "kernel_height"), "missing"));
    };
    let depthwise = node.kind == NodeKind::DepthwiseConv2d;
    let w = &window;
    let fv = node.inputs.get(1).copied().flatten().unwrap_or(0);
    let fd = b.graph.values[fv].dims;
    let (expect, out_c): (Vec<usize>, usize) = if depthwise {
        if w.group_out % w.group_in != 0 {
            return Err(invalid(
                b.field(i, node, "group_output_channels"),
                format!(
                    "{} is not a multiple of group_input_channels {}",
                    w.group_out, w.group_in
                ),
            ));
        }
        let c = w.groups * (w.group_out / w.group_in);
        (vec![1, w.kernel_h, w.kernel_w, c], c)
    } else {
        let oc = w.groups * w.group_out;
        (vec![oc, w.kernel_h, w.kernel_w, w.group_in], oc)
    };
    if fd.as_slice() != expect.as_slice() {
        return Err(invalid(
            b.field(i, node, "filter_id"),
            format!("filter dims {fd:?}, the node's geometry needs {expect:?}"),
        ));
    }
    let Some(bytes) = b.constant(fv) else {
        return Err(BackendError::Unsupported(format!(
            "xnodes[{i}].{}: a filter that is not constant",
            node.kind.name()
        )));
    };
    if let Some(v) = node.inputs.get(2).copied().flatten() {
        let numel = b.graph.values[v].dims.numel().unwrap_or(0);
        if numel != out_c {
            return Err(invalid(
                b.field(i, node, "bias_id"),
                format!("bias of {numel} elements for {out_c} output channels"),
            ));
        }
    }
    let mut window = window;
    if depthwise {
        // Depth multiplier (group_out / group_in) in group_out, channels in groups.
        window.group_out = w.group_out / w.group_in;
        window.group_in = 1;
    }
    Ok(ConvFilter {
        window,
        bytes,
        out_channels: out_c,
    })
}

/// The fp32 bias of a convolution with `n` output channels (zeros without one); it must
/// be constant.
pub fn f32_bias(
    b: &mut Builder<'_>,
    i: usize,
    node: &NodeDef,
    n: usize,
) -> Result<Vec<f32>, BackendError> {
    match b.bias(i, node, n)? {
        Bias::None => Ok(vec![0f32; n]),
        Bias::Packed(bias) => Ok(bias),
        Bias::Value(_) => Err(BackendError::Unsupported(format!(
            "xnodes[{i}].{}: a bias that is not constant",
            node.kind.name()
        ))),
    }
}

/// The int8 arithmetic of a convolution on qint8 values with `n` output channels.
pub struct Int8Conv {
    /// The input's zero point.
    pub input_zero_point: i32,
    /// Per-channel requantization to the output.
    pub rq: Qs8Requant,
    /// The int32 bias, one per output channel (zeros without one).
    pub bias: Vec<i32>,
}

/// The int8 arithmetic of convolution node `i` with `n` output channels.
pub fn int8_conv(
    b: &Builder<'_>,
    i: usize,
    node: &NodeDef,
    n: usize,
) -> Result<Int8Conv, BackendError> {
    let x = node.inputs.first().copied().flatten().unwrap_or(0);
    let qx = tensor_quant(b, i, node, x, "input1_id")?;
    let qy = tensor_quant(b, i, node, b.output(node), "output_id")?;
    let rq = requant(b, i, node, qx, qy, n)?;
    let bias = int32_bias(b, i, node, n)?;
    Ok(Int8Conv {
        input_zero_point: qx.zero_point,
        rq,
        bias,
    })
}

/// Sets the NHWC output dims of a convolution (`transposed`: a deconvolution) with
/// window `w` (depthwise: as [`filter`] returns it) from input `x` to output `y`.
pub fn infer_shape(
    w: &Window,
    depthwise: bool,
    transposed: bool,
    (x, y): (usize, usize),
    shapes: &mut [Dims],
) -> ShapeResult {
    let xd = get(shapes, x);
    if xd.rank() != 4 {
        return Err("convolution input must be NHWC (rank 4)");
    }
    let in_c = if depthwise {
        w.groups
    } else {
        w.groups * w.group_in
    };
    if xd.get(3) != in_c {
        return Err("input channels differ from the filter's");
    }
    let (oh, ow) = if transposed {
        let f = |i: usize, s: usize, adj: usize, k: usize, dil: usize, pad: usize| {
            let full = s
                .checked_mul(i.checked_sub(1)?)?
                .checked_add(adj)?
                .checked_add(dil.checked_mul(k - 1)?)?
                .checked_add(1)?;
            full.checked_sub(pad)
        };
        (
            f(
                xd.get(1),
                w.stride_h,
                w.adjust_h,
                w.kernel_h,
                w.dilation_h,
                w.pad_top + w.pad_bottom,
            )
            .ok_or("output height underflows")?,
            f(
                xd.get(2),
                w.stride_w,
                w.adjust_w,
                w.kernel_w,
                w.dilation_w,
                w.pad_left + w.pad_right,
            )
            .ok_or("output width underflows")?,
        )
    } else {
        (
            output_height(w, xd.get(1)).ok_or("kernel taller than the padded input")?,
            output_width(w, xd.get(2)).ok_or("kernel wider than the padded input")?,
        )
    };
    let out_c = w.groups * w.group_out;
    let d = [xd.get(0), oh, ow, out_c];
    set(shapes, y, Dims::new(&d).unwrap_or_default());
    Ok(())
}

/// The per-output-channel scales of a qcint8 filter (channel dim 0), or `None` for an
/// fp32 one.
pub fn per_channel_int8_scales<'g>(b: &Builder<'g>, node: &NodeDef) -> Option<&'g [f32]> {
    let fv = node.inputs.get(1).copied().flatten()?;
    let value = &b.graph.values[fv];
    match (&value.datatype, &value.quant) {
        (
            Datatype::QcInt8,
            Some(Quantization::PerChannel {
                channel_dim: 0,
                scales,
            }),
        ) => Some(scales),
        _ => None,
    }
}

/// An OHWI int8 filter as fp32: each output channel's values times its scale (a
/// channel past the scales given gets 0).
pub fn dequantize_per_output_channel(bytes: &[u8], scales: &[f32]) -> Vec<f32> {
    let per_channel = bytes.len() / scales.len().max(1);
    let mut out = vec![0.0f32; bytes.len()];
    if per_channel == 0 {
        return out;
    }
    for ((ys, qs), &s) in out
        .chunks_exact_mut(per_channel)
        .zip(bytes.chunks_exact(per_channel))
        .zip(scales)
    {
        for (y, &q) in ys.iter_mut().zip(qs) {
            *y = f32::from(q as i8) * s;
        }
    }
    out
}
