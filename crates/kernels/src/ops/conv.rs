//! `convolution.out`: 1-d and 2-d convolutions of NCHW (or NCL) f32 tensors, contiguous
//! or channels-last (see [`super::layout`]), with stride, padding, dilation and groups,
//! plain or transposed (with `output_padding`), bias or none. A channels-last weight is
//! transposed into scratch on every call, as the image is.
//!
//! * A group of a plain convolution is one GEMM, `filter[group_out, group_in * kh * kw]`
//!   times its im2col matrix `[group_in * kh * kw, out_pixels]` (never built: the
//!   GEMM packs its panels straight from the input; for a 1x1 stride-1 unpadded
//!   kernel the "im2col" is the input itself), whose row-major result is the NCHW
//!   output; the bias is the GEMM's addend.
//! * A depthwise convolution (one input channel per group) runs a direct plane kernel,
//!   one output channel per task, or, on large planes, one band of rows of every channel
//!   per task, so that each thread reads the pixels the GEMM before it wrote on that
//!   thread (the GEMM splits a plane's pixels) and writes those the next GEMM reads.
//! * A transposed convolution is the GEMM `filter_gᵀ x input_g` into scratch, scattered
//!   onto the bias-filled output (col2im), one output channel per task.
//!
//! An [`Epilogue`](crate::Epilogue) folded into the step at load (an activation that
//! followed the convolution) clamps each output as it is written: in the GEMM's finish,
//! after each depthwise plane, or in one pass after a transposed convolution.
//!
//! The kernels live in `etch_linalg::conv_nchw`, described by its `ConvGeometry`.

use std::sync::atomic::{AtomicBool, Ordering};

use etch_linalg::conv::ConvGeometry;
use etch_linalg::conv_nchw::{
    CHANNELS_IN_LANES_MAX_TAPS, Im2col, LANES_DEPTHWISE_PLANES, LanesDepthwise, PlaneConv,
    channels_in_lanes_scratch_len, col2im_add_nchw, conv_channels_in_lanes, conv_from_phases,
    has_channels_in_lanes, plane_scratch_len,
};
use etch_linalg::gemm::{self, Elems, Gemm};
use etch_memory::ColumnBlocks;

use super::matmul::{product, view};

use super::f32_only;
use super::layout::{NchwOut, read_nchw, require_nchw_or_channels_last};
use super::window::spatial_list;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::convolution.out", convolution);
}

/// A checked convolution call: geometry of one image, batch, and which form it takes.
#[derive(Debug, Clone, Copy)]
struct Conv {
    g: ConvGeometry,
    batch: usize,
    transposed: bool,
    /// Rank of the tensors (3 for 1-d, 4 for 2-d).
    rank: usize,
}

impl Conv {
    fn out_sizes(&self) -> [usize; 4] {
        let (n, c, h, w) = (
            self.batch,
            self.g.out_channels(),
            self.g.out_h,
            self.g.out_w,
        );
        if self.rank == 3 {
            [n, c, w, 0]
        } else {
            [n, c, h, w]
        }
    }
}

op_args! {
    /// `convolution.out(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride,
    /// SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding,
    /// SymInt groups, *, Tensor(a!) out)`.
    struct ConvolutionArgs<'a> = "aten::convolution.out" {
        input: Tensor,
        weight: Tensor,
        bias: Option<Tensor>,
        stride: IntList<'a>,
        padding: IntList<'a>,
        dilation: IntList<'a>,
        transposed: bool,
        output_padding: IntList<'a>,
        groups: i64,
        out: OutArg,
    } returns 1
}

/// Checks the arguments of a convolution and derives its geometry.
fn plan(args: &ConvolutionArgs<'_>) -> Result<Conv, KernelError> {
    let (x, w, bias) = (&args.input, &args.weight, args.bias.as_ref());
    let rank = x.rank();
    if !(rank == 3 || rank == 4) || w.rank() != rank {
        return Err(KernelError::invalid(format!(
            "convolution: input {:?} and weight {:?} must both be 3-d or 4-d",
            x.sizes(),
            w.sizes()
        )));
    }
    let dims = rank - 2;
    let stride = spatial_list::<2>(&args.stride, dims, None, 1, "convolution stride")?;
    let padding = spatial_list::<2>(&args.padding, dims, Some([0, 0]), 0, "convolution padding")?;
    let dilation = spatial_list::<2>(
        &args.dilation,
        dims,
        Some([1, 1]),
        1,
        "convolution dilation",
    )?;
    let transposed = args.transposed;
    let out_pad = spatial_list::<2>(
        &args.output_padding,
        dims,
        Some([0, 0]),
        0,
        "convolution output_padding",
    )?;
    let groups = args.groups;
    let groups = usize::try_from(groups)
        .ok()
        .filter(|&g| g >= 1)
        .ok_or_else(|| KernelError::invalid(format!("convolution: groups {groups}")))?;
    // Spatial values as (h, w); a 1-d convolution has h = 1.
    let hw = |v: [usize; 2], one: usize| if dims == 1 { (one, v[0]) } else { (v[0], v[1]) };
    let (sh, sw) = hw(stride, 1);
    let (ph, pw) = hw(padding, 0);
    let (dh, dw) = hw(dilation, 1);
    let (oph, opw) = hw(out_pad, 0);
    let s = x.sizes();
    let ws = w.sizes();
    let (batch, c_in) = (s[0], s[1]);
    let (ih, iw) = if dims == 1 { (1, s[2]) } else { (s[2], s[3]) };
    let (kh, kw) = if dims == 1 {
        (1, ws[2])
    } else {
        (ws[2], ws[3])
    };
    let bad = |msg: String| Err(KernelError::invalid(format!("convolution: {msg}")));
    if kh == 0 || kw == 0 {
        return bad(format!("empty kernel {ws:?}"));
    }
    let (group_in, group_out) = if transposed {
        if ws[0] != c_in || c_in % groups != 0 {
            return bad(format!(
                "transposed weight {ws:?} does not fit {c_in} input channels in {groups} groups"
            ));
        }
        (c_in / groups, ws[1])
    } else {
        if ws[1].checked_mul(groups) != Some(c_in) || ws[0] % groups != 0 {
            return bad(format!(
                "weight {ws:?} does not fit {c_in} input channels in {groups} groups"
            ));
        }
        (ws[1], ws[0] / groups)
    };
    let (out_h, out_w) = if transposed {
        if oph >= sh.max(dh) || opw >= sw.max(dw) {
            return bad("output_padding must be below stride or dilation".into());
        }
        let len = |i: usize, k: usize, st: usize, p: usize, d: usize, op: usize| {
            let full = i.checked_sub(1)?.checked_mul(st)? + d * (k - 1) + op + 1;
            full.checked_sub(2 * p).filter(|&n| n > 0)
        };
        match (len(ih, kh, sh, ph, dh, oph), len(iw, kw, sw, pw, dw, opw)) {
            (Some(h), Some(w)) => (h, w),
            _ => return bad(format!("no output for input {s:?}")),
        }
    } else {
        let len = |i: usize, k: usize, st: usize, p: usize, d: usize| {
            (i + 2 * p).checked_sub(d * (k - 1) + 1).map(|r| r / st + 1)
        };
        match (len(ih, kh, sh, ph, dh), len(iw, kw, sw, pw, dw)) {
            (Some(h), Some(w)) => (h, w),
            _ => {
                return bad(format!(
                    "kernel {ws:?} is larger than the padded input {s:?}"
                ));
            }
        }
    };
    let g = ConvGeometry {
        in_h: ih,
        in_w: iw,
        out_h,
        out_w,
        kernel_h: kh,
        kernel_w: kw,
        stride_h: sh,
        stride_w: sw,
        dilation_h: dh,
        dilation_w: dw,
        pad_top: ph,
        pad_left: pw,
        groups,
        group_in,
        group_out,
    };
    if let Some(b) = bias
        && b.sizes() != [g.out_channels()]
    {
        return bad(format!(
            "bias {:?} for {} output channels",
            b.sizes(),
            g.out_channels()
        ));
    }
    Ok(Conv {
        g,
        batch,
        transposed,
        rank,
    })
}

fn convolution(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let args = ConvolutionArgs::unpack(a)?;
    let conv = plan(&args)?;
    let ConvolutionArgs {
        input: x,
        weight: w,
        bias,
        out,
        ..
    } = args;
    let sizes = conv.out_sizes();
    let out = out.resize(a, &sizes[..conv.rank])?;
    let input_major = is_input_major(&conv, &w);
    // An input-major filter is the one other layout a filter may have.
    for (t, what, nchw_or_channels_last) in [
        (&x, "convolution input", true),
        (&w, "convolution weight", !input_major),
        (&out, "convolution out", true),
    ] {
        f32_only(t, "convolution (f32 only)")?;
        if nchw_or_channels_last {
            require_nchw_or_channels_last(t, what)?;
        }
    }
    if let Some(b) = &bias {
        f32_only(b, "convolution bias (f32 only)")?;
    }
    if out.numel() == 0 {
        return Ok(());
    }
    let xs = read_nchw::<f32>(ctx, &x, "convolution input")?;
    let ws = match input_major {
        true => ctx.read::<f32>(&w)?,
        false => read_nchw::<f32>(ctx, &w, "convolution weight")?,
    };
    let bs = bias.as_ref().map(|b| ctx.read::<f32>(b)).transpose()?;
    let mut staged = NchwOut::<f32>::new(ctx, &out, "convolution out")?;
    let os = staged.data();
    let io = Operands { xs, ws, bs, os };
    if conv.transposed {
        transposed(ctx, &conv, io)?;
        let epilogue = ctx.epilogue();
        if epilogue.clamp.is_some() {
            let os = staged.data();
            os.iter_mut().for_each(|v| *v = epilogue.apply(*v));
        }
    } else if conv.g.group_in == 1 && conv.g.groups > 1 {
        depthwise(ctx, &conv, io)?;
    } else if input_major && runs_channels_in_lanes(&conv.g) {
        channels_in_lanes(ctx, &conv, io)?;
    } else {
        im2col_gemm(ctx, &conv, io, input_major)?;
    }
    staged.finish("convolution out")
}

/// The f32 NCHW data of one convolution: input, weight, bias and output.
struct Operands<'a> {
    xs: &'a [f32],
    ws: &'a [f32],
    bs: Option<&'a [f32]>,
    os: &'a mut [f32],
}

fn geometry_error() -> KernelError {
    KernelError::invalid("convolution: a slice is shorter than its geometry")
}

/// `Ok` unless a parallel worker cleared `ok` (a slice shorter than its geometry).
fn geometry_checked(ok: &AtomicBool) -> Result<(), KernelError> {
    if ok.load(Ordering::Relaxed) {
        Ok(())
    } else {
        Err(geometry_error())
    }
}

/// Runs `product` into `dst`, taking the GEMM's scratch on first use (every product
/// of one convolution needs the same amount).
fn run_gemm<'s>(
    ctx: &'s KernelContext<'_>,
    isa: etch_linalg::Isa,
    product: &Gemm<'_>,
    dst: &mut [f32],
    scratch: &mut Option<&'s mut [f32]>,
) -> Result<(), KernelError> {
    let pool = ctx.pool();
    if scratch.is_none() {
        let need = gemm::scratch_len(isa, product, pool.threads());
        *scratch = Some(ctx.scratch_dirty::<f32>(need)?);
    }
    let s = scratch.as_deref_mut().unwrap_or(&mut []);
    gemm::gemm(pool, isa, product, dst, s)?;
    Ok(())
}

/// One GEMM per image and group; B is the group's input itself for a 1x1 stride-1
/// unpadded kernel, and its im2col matrix, packed straight from the input, otherwise.
///
/// With `input_major` (a filter of one group stored `[c_in * kh * kw, c_out]`, see
/// [`is_input_major`]) the filter is read as the transposed view it is.
fn im2col_gemm(
    ctx: &KernelContext<'_>,
    conv: &Conv,
    io: Operands<'_>,
    input_major: bool,
) -> Result<(), KernelError> {
    let Operands { xs, ws, bs, os } = io;
    let g = &conv.g;
    let (patch, px) = (g.patch_len(), g.out_pixels());
    let (in_plane, out_img) = (g.in_h * g.in_w, g.out_channels() * px);
    let pointwise = g.kernel_h == 1
        && g.kernel_w == 1
        && g.stride_h == 1
        && g.stride_w == 1
        && g.pad_top == 0
        && g.pad_left == 0;
    let (isa, pool) = (isa(), ctx.pool());
    let split_depth = splits_depth(g, pool.threads());
    // Every product of the call has one shape (the groups' offsets aside), so one
    // scratch serves them all.
    let weights = |grp: usize| match input_major {
        // One group: `[patch, c_out]`, element (co, k) at `k * c_out + co`.
        true => view(Elems::F32(ws), 0, g.group_out, patch, 1, g.group_out),
        false => view(
            Elems::F32(ws),
            grp * g.group_out * patch,
            g.group_out,
            patch,
            patch,
            1,
        ),
    };
    let shape = product(weights(0), view(Elems::F32(&[]), 0, patch, px, px, 1));
    let scratch = ctx.scratch_dirty::<f32>(match (split_depth, pointwise) {
        (true, _) => gemm::split_depth_scratch_len(isa, &shape, pool.threads()),
        (false, true) => gemm::scratch_len(isa, &shape, pool.threads()),
        (false, false) => gemm::im2col_scratch_len(isa, &shape, pool.threads()),
    })?;
    // A padded or strided convolution reads each group's planes split into zero-padded
    // phase planes, so that packing its panels is contiguous copies.
    let phases = if pointwise {
        &mut [][..]
    } else {
        ctx.scratch_dirty::<f32>(Im2col::phase_split_len(g))?
    };
    for n in 0..conv.batch {
        let x_img = &xs[n * g.in_channels() * in_plane..][..g.in_channels() * in_plane];
        let o_img = &mut os[n * out_img..(n + 1) * out_img];
        for grp in 0..g.groups {
            let x_grp = &x_img[grp * g.group_in * in_plane..][..g.group_in * in_plane];
            let b_data: &[f32] = if pointwise { x_grp } else { &[] };
            let columns = view(Elems::F32(b_data), 0, patch, px, px, 1);
            let mm = Gemm {
                addend: bs.map(|b| {
                    (
                        view(Elems::F32(b), grp * g.group_out, g.group_out, px, 1, 0),
                        1.0,
                    )
                }),
                clamp: ctx.epilogue().clamp,
                ..product(weights(grp), columns)
            };
            let dst = &mut o_img[grp * g.group_out * px..(grp + 1) * g.group_out * px];
            let image = match pointwise {
                true => None,
                false => {
                    Some(Im2col::phase_split(pool, g, x_grp, phases).ok_or_else(geometry_error)?)
                }
            };
            let group = group_operands(g, (ws, bs), grp).filter(|_| !input_major);
            match (&image, split_depth, group) {
                (Some(image), false, Some(group))
                    if conv_from_phases(pool, isa, image, group, mm.clamp, dst) => {}
                (None, false, _) => gemm::gemm(pool, isa, &mm, dst, scratch)?,
                (None, true, _) => {
                    gemm::gemm_split_depth(pool, isa, &mm, gemm::DepthSplitB::View, dst, scratch)?
                }
                (Some(image), false, _) => gemm::gemm_im2col(pool, isa, &mm, image, dst, scratch)?,
                (Some(image), true, _) => {
                    let b = gemm::DepthSplitB::Im2col(image);
                    gemm::gemm_split_depth(pool, isa, &mm, b, dst, scratch)?
                }
            }
        }
    }
    Ok(())
}

/// Group `grp`'s filter (`[group_out, patch]`, row major) and bias of a convolution
/// whose filter is stored output-channel major; `None` when a slice is too short (the
/// GEMM then reports it).
fn group_operands<'a>(
    g: &ConvGeometry,
    (ws, bs): (&'a [f32], Option<&'a [f32]>),
    grp: usize,
) -> Option<(&'a [f32], Option<&'a [f32]>)> {
    let len = g.group_out * g.patch_len();
    let filter = ws.get(grp * len..(grp + 1) * len)?;
    let bias = match bs {
        Some(b) => Some(b.get(grp * g.group_out..(grp + 1) * g.group_out)?),
        None => None,
    };
    Some((filter, bias))
}

/// The instruction set of the convolution kernels (the GEMM's).
fn isa() -> etch_linalg::Isa {
    etch_linalg::dispatch().gemm
}

/// Most pixels of an output plane on which a convolution prefers its filter stored
/// input-channel major ([`prefers_input_major_filter`]): 64, four AVX-512 vectors.
/// MobileNetV2's 7x7 layers (49 pixels: a GEMM with pixels in the lanes fills 77% of
/// them) ran 18-34% faster in a whole call with the output channels in the lanes, on
/// one thread. Its 14x14 layers were 0-23% faster in isolation (with the filter out of
/// the core's caches) but on two threads 6-60% slower in a whole call: each thread
/// reads every input channel, half of them written on the other core, where the GEMM
/// splits the depth.
pub const INPUT_MAJOR_MAX_PIXELS: usize = 64;

/// Most products per output (`c_in * kh * kw`) of a small-plane convolution that
/// prefers its filter stored input-channel major ([`prefers_input_major_filter`]). A
/// 1x1 filter's depth is one block in the channels-in-lanes kernel (blocks made
/// MobileNetV2's 7x7 pointwise layers 5-18% slower), so each tile streams the panel's
/// whole filter column: MobileNetV2's deepest 7x7 layer has depth 960, ResNet-18's 1x1
/// downsampling to 7x7 256 (0.75x the GEMM's time). Deeper filters with several taps
/// qualify by [`INPUT_MAJOR_MIN_DEPTH_WITH_TAPS`].
pub const INPUT_MAJOR_MAX_DEPTH: usize = 1024;

/// Fewest products per output (`c_in * kh * kw`) of a convolution with more than one
/// tap that prefers its filter stored input-channel major
/// ([`prefers_input_major_filter`]), on planes of any size. There the channels-in-lanes
/// kernel reads the input planes in place (or padded once) where the GEMM packs every
/// value into its panels once per tap: in a whole ResNet-18 call its 3x3 layers took
/// 0.89-0.94x the GEMM's time at 56x56 to 14x14 and 0.73-0.82x at 7x7 (depth 4608, the
/// depth blocked), one thread; the whole call 0.90x on one thread and 0.88-0.93x on two.
/// With few products the transposed stores of each tile weigh more: MobileNetV2's stem
/// (3x3 over 3 channels, depth 27) was 6% slower; ResNet-18's (7x7 over 3 channels,
/// depth 147) 7% faster.
pub const INPUT_MAJOR_MIN_DEPTH_WITH_TAPS: usize = 128;

/// Whether a convolution of one group (not transposed) with `taps` taps (`kh * kw`) and
/// `depth` products per output (`c_in * kh * kw`) whose output planes have `pixels`
/// pixels runs faster with its filter stored input-channel major (dim order `(1, 2, 3,
/// 0)`, `[c_in * kh * kw, c_out]` in memory; `(1, 0, 2, 3)` for a 1x1 filter), where
/// this CPU has the channels-in-lanes kernel (AVX2 or AVX-512) and the kernel has at
/// most [`CHANNELS_IN_LANES_MAX_TAPS`] taps: on planes of at most
/// [`INPUT_MAJOR_MAX_PIXELS`] pixels and at most [`INPUT_MAJOR_MAX_DEPTH`] products, or
/// with more than one tap and at least [`INPUT_MAJOR_MIN_DEPTH_WITH_TAPS`] products.
/// Load-time folding stores constant filters so when this holds.
pub fn prefers_input_major_filter(pixels: usize, depth: usize, taps: usize) -> bool {
    let small = (1..=INPUT_MAJOR_MAX_PIXELS).contains(&pixels)
        && (1..=INPUT_MAJOR_MAX_DEPTH).contains(&depth);
    let deep_with_taps = taps > 1 && depth >= INPUT_MAJOR_MIN_DEPTH_WITH_TAPS;
    (small || deep_with_taps)
        && (1..=CHANNELS_IN_LANES_MAX_TAPS).contains(&taps)
        && has_channels_in_lanes(isa())
}

/// True when `w` is the filter of a convolution of one group stored input-channel
/// major: `[c_out, c_in, kh, kw]` with dim order `(1, 2, 3, 0)` (or `(1, 2, 0)` for a
/// 1-d one), i.e. `[c_in * kh * kw, c_out]` in memory, one row per im2col row; a 1x1
/// filter may say so with `(1, 0, 2, 3)` as well (the same bytes). Load-time folding
/// stores small-plane filters so ([`prefers_input_major_filter`]); any other filter
/// must be contiguous or channels-last.
fn is_input_major(conv: &Conv, w: &Tensor) -> bool {
    let (general, pointwise): (&[u8], &[u8]) = if conv.rank == 3 {
        (&[1, 2, 0], &[1, 0, 2])
    } else {
        (&[1, 2, 3, 0], &[1, 0, 2, 3])
    };
    let one_by_one = conv.g.kernel_h == 1 && conv.g.kernel_w == 1;
    !conv.transposed
        && conv.g.groups == 1
        && (w.dim_order() == general || (one_by_one && w.dim_order() == pointwise))
}

/// Whether this CPU runs a convolution of `g` with an input-major filter in the
/// channels-in-lanes kernel: it has one, and the kernel has at most
/// [`CHANNELS_IN_LANES_MAX_TAPS`] taps.
fn runs_channels_in_lanes(g: &ConvGeometry) -> bool {
    has_channels_in_lanes(isa()) && g.kernel_h * g.kernel_w <= CHANNELS_IN_LANES_MAX_TAPS
}

/// A convolution of one group with an input-channel-major filter, the output channels
/// in the vector lanes, one image at a time, reading the input planes in place or
/// through a zero-padded copy in scratch.
fn channels_in_lanes(
    ctx: &KernelContext<'_>,
    conv: &Conv,
    io: Operands<'_>,
) -> Result<(), KernelError> {
    let Operands { xs, ws, bs, os } = io;
    let g = &conv.g;
    let pool = ctx.pool();
    let (in_img, out_img) = (
        g.in_channels() * g.in_h * g.in_w,
        g.out_channels() * g.out_pixels(),
    );
    let scratch = ctx.scratch_dirty::<f32>(channels_in_lanes_scratch_len(g, pool.threads()))?;
    let clamp = ctx.epilogue().clamp;
    for n in 0..conv.batch {
        let x = xs.get(n * in_img..(n + 1) * in_img);
        let o = os.get_mut(n * out_img..(n + 1) * out_img);
        let (Some(x), Some(o)) = (x, o) else {
            return Err(geometry_error());
        };
        if !conv_channels_in_lanes(pool, isa(), g, (x, ws), (bs, clamp), o, scratch) {
            return Err(geometry_error());
        }
    }
    Ok(())
}

/// One direct plane convolution per output channel (group_in == 1), each task with its
/// own plane scratch: whole planes per task, or, where the pointwise GEMMs beside it
/// split pixels ([`splits_pixels`]), a band of rows of every plane per task.
fn depthwise(ctx: &KernelContext<'_>, conv: &Conv, io: Operands<'_>) -> Result<(), KernelError> {
    let threads = ctx.pool().threads();
    if splits_pixels(&conv.g, threads) {
        return depthwise_bands(ctx, conv, io, threads);
    }
    if conv.g.out_channels().is_multiple_of(LANES_DEPTHWISE_PLANES)
        && let Some(kernel) = LanesDepthwise::preferred(isa(), &conv.g)
    {
        return depthwise_lanes(ctx, conv, io, &kernel);
    }
    let Operands { xs, ws, bs, os } = io;
    let g = &conv.g;
    let (px, taps, co) = (g.out_pixels(), g.kernel_h * g.kernel_w, g.out_channels());
    let per_task = plane_scratch_len(g);
    let kernel = PlaneConv::new(g, per_task);
    let epilogue = ctx.epilogue();
    let scratch = ctx.scratch_dirty::<f32>(per_task * ctx.pool().threads())?;
    let ok = AtomicBool::new(true);
    let plane = |idx: usize, out: &mut [f32], scratch: &mut [f32]| {
        let (x, w, b) = plane_operands(g, (xs, ws, bs), idx);
        if !kernel.run(x, w, (b, epilogue.clamp), out, scratch) {
            ok.store(false, Ordering::Relaxed);
        }
    };
    let min_planes = (crate::GRAIN_SIZE / (px * taps).max(1)).max(1);
    ctx.pool().for_each_chunk_mut_with_scratch(
        &mut os[..conv.batch * co * px],
        px,
        min_planes,
        scratch,
        per_task,
        plane,
    );
    geometry_checked(&ok)
}

/// [`depthwise`] over small planes, [`LANES_DEPTHWISE_PLANES`] at a time with the planes
/// in the vector lanes: each task takes whole groups of planes of one image (the output
/// channels a multiple of the group, one input plane per output plane).
fn depthwise_lanes(
    ctx: &KernelContext<'_>,
    conv: &Conv,
    io: Operands<'_>,
    kernel: &LanesDepthwise,
) -> Result<(), KernelError> {
    let Operands { xs, ws, bs, os } = io;
    let g = &conv.g;
    let (in_px, out_px, taps, co) = (
        g.in_h * g.in_w,
        g.out_pixels(),
        g.kernel_h * g.kernel_w,
        g.out_channels(),
    );
    let per_task = kernel.scratch_len();
    let scratch = ctx.scratch_dirty::<f32>(per_task * ctx.pool().threads())?;
    let clamp = ctx.epilogue().clamp;
    let group = LANES_DEPTHWISE_PLANES;
    let ok = AtomicBool::new(true);
    let planes = |i: usize, out: &mut [f32], scratch: &mut [f32]| {
        // Planes i * group.. of the batch: image n, output channels oc..oc + group,
        // which read input channels oc..oc + group.
        let (n, oc) = (i * group / co, i * group % co);
        let x = xs.get((n * co + oc) * in_px..(n * co + oc + group) * in_px);
        let w = ws.get(oc * taps..(oc + group) * taps);
        let b = bs.map(|b| b.get(oc..oc + group));
        let done = match (x, w, b) {
            (Some(x), Some(w), None) => kernel.run((x, w, None), clamp, out, scratch),
            (Some(x), Some(w), Some(Some(b))) => kernel.run((x, w, Some(b)), clamp, out, scratch),
            _ => false,
        };
        if !done {
            ok.store(false, Ordering::Relaxed);
        }
    };
    let min_groups = (crate::GRAIN_SIZE / (group * out_px * taps).max(1)).max(1);
    ctx.pool().for_each_chunk_mut_with_scratch(
        &mut os[..conv.batch * co * out_px],
        group * out_px,
        min_groups,
        scratch,
        per_task,
        planes,
    );
    geometry_checked(&ok)
}

/// The whole input plane, the filter and the bias of a depthwise convolution's output
/// plane `p` (image `p / out_channels`, channel `p % out_channels`, which reads input
/// channel `channel / group_out`).
fn plane_operands<'a>(
    g: &ConvGeometry,
    (xs, ws, bs): (&'a [f32], &'a [f32], Option<&'a [f32]>),
    p: usize,
) -> (&'a [f32], &'a [f32], f32) {
    let (in_plane, taps, co) = (g.in_h * g.in_w, g.kernel_h * g.kernel_w, g.out_channels());
    let (n, oc) = (p / co, p % co);
    let x = &xs[(n * g.in_channels() + oc / g.group_out) * in_plane..][..in_plane];
    let w = &ws[oc * taps..(oc + 1) * taps];
    (x, w, bs.map_or(0.0, |b| b[oc]))
}

/// Whether a depthwise convolution on `threads` threads splits its planes' rows rather
/// than its channels: as the GEMM of a pointwise convolution over the same pixels splits
/// its columns (pixels), when each band of a plane holds at least [`MIN_BAND_OUTPUTS`]
/// outputs and a plane is a whole number of cache lines. Then each thread reads the
/// pixels its previous layer wrote and writes those the next one reads. Smaller bands
/// cost more than they save (per-plane calls, short runs).
fn splits_pixels(g: &ConvGeometry, threads: usize) -> bool {
    threads > 1
        && g.out_h >= 4 * threads
        && g.out_pixels() >= MIN_BAND_OUTPUTS * threads
        && g.out_pixels().is_multiple_of(16)
}

/// Whether a convolution's GEMM on `threads` threads splits its depth (input channels
/// and taps) rather than its output channels or pixels ([`gemm::gemm_split_depth`]):
/// one with at least twice as many products per output as output channels (a
/// projecting pointwise convolution, most 3x3 ones) over planes of fewer than
/// [`MIN_BAND_OUTPUTS`] pixels per thread. The layer before it split its channels over the threads (a
/// depthwise convolution, a GEMM split by output channels), so each thread then reads,
/// and for an im2col matrix packs, only the channels it wrote, rather than all of them.
fn splits_depth(g: &ConvGeometry, threads: usize) -> bool {
    threads > 1 && g.patch_len() >= 2 * g.group_out && g.out_pixels() < MIN_BAND_OUTPUTS * threads
}

/// Fewest outputs of one plane in one band of [`depthwise_bands`]: a 4 KiB page.
const MIN_BAND_OUTPUTS: usize = 1024;

/// [`depthwise`] in `bands` bands of output rows, each task all planes' rows of one
/// band (`ConvGeometry::row_band`).
fn depthwise_bands(
    ctx: &KernelContext<'_>,
    conv: &Conv,
    io: Operands<'_>,
    bands: usize,
) -> Result<(), KernelError> {
    let Operands { xs, ws, bs, os } = io;
    let g = &conv.g;
    let px = g.out_pixels();
    let planes = conv.batch * g.out_channels();
    let bands = bands.min(ColumnBlocks::<f32>::MAX_BLOCKS);
    let band_rows = g.out_h.div_ceil(bands);
    let bands = g.out_h.div_ceil(band_rows);
    let blocks = ColumnBlocks::grid(
        &mut os[..planes * px],
        (planes, px),
        px,
        (planes, band_rows * g.out_w),
    )
    .ok_or_else(geometry_error)?;
    // At least one element per task, so that each band has a chunk of scratch.
    let per_task = plane_scratch_len(g).max(1);
    let scratch = ctx.scratch_dirty::<f32>(per_task * bands)?;
    let epilogue = ctx.epilogue();
    let ok = AtomicBool::new(true);
    let band = |t: usize, scratch: &mut [f32]| {
        let rows = t * band_rows..((t + 1) * band_rows).min(g.out_h);
        let (bg, first) = g.row_band(rows);
        let kernel = PlaneConv::new(&bg, per_task);
        let Some(mut block) = blocks.take(t) else {
            ok.store(false, Ordering::Relaxed);
            return;
        };
        // Each task starts at its own plane, so that two tasks do not write the line
        // their bands share in a plane at the same time.
        let start = t * planes / bands;
        for p in (start..planes).chain(0..start) {
            let (x, w, b) = plane_operands(g, (xs, ws, bs), p);
            let out = block.row_mut(p);
            if !kernel.run(&x[first * g.in_w..], w, (b, epilogue.clamp), out, scratch) {
                ok.store(false, Ordering::Relaxed);
            }
        }
    };
    ctx.pool()
        .for_each_chunk_mut(scratch, per_task, 1, |t, s| band(t, s));
    geometry_checked(&ok)
}

/// GEMM into columns, then col2im onto the bias-filled output.
fn transposed(ctx: &KernelContext<'_>, conv: &Conv, io: Operands<'_>) -> Result<(), KernelError> {
    let Operands { xs, ws, bs, os } = io;
    let g = &conv.g;
    let taps = g.kernel_h * g.kernel_w;
    let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_pixels());
    let rows = g.group_out * taps;
    let pool = ctx.pool();
    let isa = isa();
    let col = ctx.scratch_dirty::<f32>(rows * in_plane)?;
    let mut scratch: Option<&mut [f32]> = None;
    let out_img = g.out_channels() * out_plane;
    for n in 0..conv.batch {
        let x_img = &xs[n * g.in_channels() * in_plane..][..g.in_channels() * in_plane];
        let o_img = &mut os[n * out_img..(n + 1) * out_img];
        for (oc, p) in o_img.chunks_exact_mut(out_plane).enumerate() {
            p.fill(bs.map_or(0.0, |b| b[oc]));
        }
        for grp in 0..g.groups {
            // col[(o, tap), p] = sum_i W[grp * gi + i, (o, tap)] x[grp * gi + i, p].
            let mm = product(
                view(
                    Elems::F32(ws),
                    grp * g.group_in * rows,
                    rows,
                    g.group_in,
                    1,
                    rows,
                ),
                view(
                    Elems::F32(x_img),
                    grp * g.group_in * in_plane,
                    g.group_in,
                    in_plane,
                    in_plane,
                    1,
                ),
            );
            run_gemm(ctx, isa, &mm, col, &mut scratch)?;
            let col: &[f32] = col;
            let one = ConvGeometry {
                groups: 1,
                group_out: 1,
                ..*g
            };
            let ok = AtomicBool::new(true);
            let dst =
                &mut o_img[grp * g.group_out * out_plane..(grp + 1) * g.group_out * out_plane];
            pool.for_each_chunk_mut(dst, out_plane, 1, |o, plane| {
                let c = &col[o * taps * in_plane..(o + 1) * taps * in_plane];
                if !col2im_add_nchw(&one, c, plane) {
                    ok.store(false, Ordering::Relaxed);
                }
            });
            if !ok.load(Ordering::Relaxed) {
                return Err(geometry_error());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
