//! 2-D convolutions over NCHW (channel-planar) images, the layout of ExecuTorch's
//! portable `convolution` operator, described by the same [`ConvGeometry`] as the NHWC
//! kernels: im2col rows `[group_in * kh * kw, out_pixels]` (so a group's convolution is
//! the GEMM `filter[group_out, patch] x col[patch, out_pixels]`, whose row-major result
//! is already the NCHW output), a direct single-plane kernel for depthwise
//! convolutions, the col2im scatter of a transposed convolution, and direct scalar
//! references the others are tested against.
//!
//! A 1-d convolution is the 2-d one with `in_h = out_h = kernel_h = 1`.

/// `$sweep::<V>(args)` with `V` the 16-lane vectors of a row of `$w` pixels, 2 to 8 (8
/// for wider rows): the dispatch of the AVX-512 depthwise kernels that hold a whole
/// row's sums in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! by_row_vectors {
    ($w:expr, $sweep:ident($($arg:expr),* $(,)?)) => {
        match $w.div_ceil(16) {
            2 => $sweep::<2>($($arg),*),
            3 => $sweep::<3>($($arg),*),
            4 => $sweep::<4>($($arg),*),
            5 => $sweep::<5>($($arg),*),
            6 => $sweep::<6>($($arg),*),
            7 => $sweep::<7>($($arg),*),
            _ => $sweep::<8>($($arg),*),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod channels_in_lanes;
#[cfg(target_arch = "x86_64")]
mod depthwise_avx512;
#[cfg(target_arch = "x86_64")]
mod depthwise_flat;
#[cfg(target_arch = "x86_64")]
mod depthwise_lanes;
#[cfg(target_arch = "x86_64")]
mod depthwise_narrow_rows;
#[cfg(target_arch = "x86_64")]
mod depthwise_phase_rows;
#[cfg(target_arch = "x86_64")]
mod depthwise_phases;
#[cfg(target_arch = "x86_64")]
mod depthwise_square;
#[cfg(target_arch = "x86_64")]
mod depthwise_wide_rows;
#[cfg(target_arch = "x86_64")]
mod max_pool_avx512;
#[cfg(target_arch = "x86_64")]
mod phase_tiles;

/// Lanes `l` of a `lanes`-lane load (at most 16) at column `base` whose column
/// `base + l` lies in `0..width`, bit `l` for lane `l`: the load mask of the direct
/// kernels.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn lanes_inside(base: isize, width: isize, lanes: usize) -> u16 {
    let lo = (-base).clamp(0, lanes as isize) as u32;
    let hi = (width - base).clamp(lo as isize, lanes as isize) as u32;
    (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16
}
mod phase_panels;
mod polyphase;

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{AtomicBool, Ordering};

use etch_memory::ColumnBlocks;

use crate::conv::ConvGeometry;
use crate::{Isa, ThreadPool};

/// First and one-past-last output coordinate whose tap `tap` reads inside `0..size`:
/// `o * stride + tap * dilation - pad` in range.
fn valid_outputs(
    tap: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    size: usize,
    out: usize,
) -> Range<usize> {
    let off = tap * dilation;
    // o * stride >= pad - off, and o * stride + off < size + pad (no division for the
    // common stride 1).
    let (lo, hi) = match stride {
        0 | 1 => (pad.saturating_sub(off), (size + pad).saturating_sub(off)),
        s => (
            pad.saturating_sub(off).div_ceil(s),
            (size + pad).saturating_sub(off).div_ceil(s),
        ),
    };
    lo.min(out)..hi.min(out).max(lo.min(out))
}

/// The output rows whose kernel row `ky` reads inside the input.
fn valid_rows(g: &ConvGeometry, ky: usize) -> Range<usize> {
    valid_outputs(ky, g.stride_h, g.dilation_h, g.pad_top, g.in_h, g.out_h)
}

/// The output columns whose kernel column `kx` reads inside the input.
fn valid_cols(g: &ConvGeometry, kx: usize) -> Range<usize> {
    valid_outputs(kx, g.stride_w, g.dilation_w, g.pad_left, g.in_w, g.out_w)
}

/// Writes im2col rows `rows` of one group: row `r = (ci * kernel_h + ky) * kernel_w + kx`
/// holds, for every output pixel, the input value that tap reads (0 in the padding).
/// `input` is the group's `[group_in, in_h, in_w]` planes, `col` the rows `rows` only
/// (`rows.len() * out_pixels` elements). Returns `false` when a slice is too short.
pub fn im2col_nchw(g: &ConvGeometry, input: &[f32], rows: Range<usize>, col: &mut [f32]) -> bool {
    let pixels = g.out_h * g.out_w;
    if input.len() < g.group_in * g.in_h * g.in_w
        || rows.end > g.group_in * g.kernel_h * g.kernel_w
        || col.len() < rows.len() * pixels
    {
        return false;
    }
    if pixels == 0 {
        return true;
    }
    for (row, r) in col.chunks_exact_mut(pixels).zip(rows) {
        im2col_segment(g, input, r, 0, row);
    }
    true
}

/// Columns `p0 .. p0 + dst.len()` of im2col row `r` (see [`im2col_nchw`]) into `dst`.
/// The caller checked that `input` holds the group's planes, `r` is a row and the
/// columns are pixels.
fn im2col_segment(g: &ConvGeometry, input: &[f32], r: usize, p0: usize, dst: &mut [f32]) {
    ImTap::new(g, input, TapIndex::of(g, r)).segment(g, p0, dst);
}

/// Input channel and kernel tap of one im2col row.
#[derive(Clone, Copy)]
struct TapIndex {
    ci: usize,
    ky: usize,
    kx: usize,
}

impl TapIndex {
    /// Of row `r`.
    fn of(g: &ConvGeometry, r: usize) -> TapIndex {
        let taps = g.kernel_h * g.kernel_w;
        let tap = r % taps;
        TapIndex {
            ci: r / taps,
            ky: tap / g.kernel_w,
            kx: tap % g.kernel_w,
        }
    }

    /// Of the next row.
    fn next(self, g: &ConvGeometry) -> TapIndex {
        let TapIndex { ci, ky, kx } = self;
        match (kx + 1 < g.kernel_w, ky + 1 < g.kernel_h) {
            (true, _) => TapIndex { kx: kx + 1, ..self },
            (false, true) => TapIndex {
                ky: ky + 1,
                kx: 0,
                ci,
            },
            (false, false) => TapIndex {
                ci: ci + 1,
                ky: 0,
                kx: 0,
            },
        }
    }
}

/// What one im2col row reads: its input plane and the output rows and columns whose
/// tap lands inside it.
struct ImTap<'a> {
    plane: &'a [f32],
    /// Input row of output row 0 (plus `pad_top`).
    ky_off: usize,
    /// Input column of output column 0 (plus `pad_left`).
    kx_off: usize,
    ys: Range<usize>,
    xs: Range<usize>,
}

impl<'a> ImTap<'a> {
    fn new(g: &ConvGeometry, input: &'a [f32], TapIndex { ci, ky, kx }: TapIndex) -> ImTap<'a> {
        let (ih, iw) = (g.in_h, g.in_w);
        ImTap {
            plane: &input[ci * ih * iw..(ci + 1) * ih * iw],
            ky_off: ky * g.dilation_h,
            kx_off: kx * g.dilation_w,
            ys: valid_rows(g, ky),
            xs: valid_cols(g, kx),
        }
    }

    /// Columns `p0 .. p0 + dst.len()` of the row into `dst`, one run of an output row
    /// at a time.
    fn segment(&self, g: &ConvGeometry, p0: usize, dst: &mut [f32]) {
        let (iw, ow) = (g.in_w, g.out_w);
        let (mut oy, mut ox0) = (p0 / ow, p0 % ow);
        let mut done = 0;
        while done < dst.len() {
            let len = (ow - ox0).min(dst.len() - done);
            let run = &mut dst[done..done + len];
            done += len;
            let (y, x0) = (oy, ox0);
            (oy, ox0) = (oy + 1, 0);
            if !self.ys.contains(&y) {
                run.fill(0.0);
                continue;
            }
            let iy = y * g.stride_h + self.ky_off - g.pad_top;
            let src = &self.plane[iy * iw..(iy + 1) * iw];
            // The valid outputs of this run: xs clipped to x0..x0 + len.
            let lo = self.xs.start.clamp(x0, x0 + len);
            let hi = self.xs.end.clamp(lo, x0 + len);
            // Guarded: most runs have no padding, and an empty fill is still a call.
            if lo > x0 {
                run[..lo - x0].fill(0.0);
            }
            if hi < x0 + len {
                run[hi - x0..].fill(0.0);
            }
            if lo == hi {
                continue;
            }
            let ix0 = lo * g.stride_w + self.kx_off - g.pad_left;
            let valid = &mut run[lo - x0..hi - x0];
            if g.stride_w == 1 {
                valid.copy_from_slice(&src[ix0..ix0 + valid.len()]);
            } else {
                for (j, d) in valid.iter_mut().enumerate() {
                    *d = src[ix0 + j * g.stride_w];
                }
            }
        }
    }
}

/// One group's image read as the GEMM operand `B = im2col(image)`
/// (`[group_in * kernel_h * kernel_w, out_pixels]`) without building that matrix: the
/// product packs B's panels straight from the image ([`gemm::gemm_im2col`]).
///
/// [`gemm::gemm_im2col`]: crate::gemm::gemm_im2col
#[derive(Clone, Copy)]
pub struct Im2col<'a> {
    /// The convolution (its `group_in`, kernel, stride, dilation and padding).
    geometry: ConvGeometry,
    /// The group's `[group_in, in_h, in_w]` input planes, or their phase planes.
    planes: &'a [f32],
    /// How `planes` holds phase planes, when it does (see [`Im2col::phase_split`]).
    layout: Option<phase_panels::PhaseLayout>,
}

impl<'a> Im2col<'a> {
    /// The group's `[group_in, in_h, in_w]` input planes read as they are (see
    /// [`Im2col::phase_split`] for the faster form of a padded or strided
    /// convolution).
    pub fn new(geometry: ConvGeometry, planes: &'a [f32]) -> Im2col<'a> {
        Im2col {
            geometry,
            planes,
            layout: phase_panels::PhaseLayout::in_place(&geometry),
        }
    }

    /// The convolution.
    pub fn geometry(&self) -> &ConvGeometry {
        &self.geometry
    }

    /// Length of the planes read.
    pub fn planes_len(&self) -> usize {
        self.planes.len()
    }

    /// True when the planes hold the whole group.
    pub fn fits(&self) -> bool {
        let g = &self.geometry;
        match &self.layout {
            Some(layout) => layout.fits(g, self.planes.len()),
            None => g
                .group_in
                .checked_mul(g.in_h)
                .and_then(|v| v.checked_mul(g.in_w))
                .is_some_and(|need| need <= self.planes.len()),
        }
    }

    /// Rows of the im2col matrix (the patch length).
    pub fn rows(&self) -> usize {
        self.geometry.group_in * self.geometry.kernel_h * self.geometry.kernel_w
    }

    /// Columns of the im2col matrix (the output pixels).
    pub fn cols(&self) -> usize {
        self.geometry.out_h * self.geometry.out_w
    }

    /// Writes rows `k0..k0 + kc`, columns `c0..c0 + nb` of the matrix as GEMM B panels
    /// of `nr` columns: panel `q`, step `kk`, column `c` at `q*kc*nr + kk*nr + c`;
    /// columns past `nb` are zero. The caller checked [`Im2col::fits`] and that the
    /// rows and columns lie inside the matrix, and `dst` holds the panels.
    pub(crate) fn pack_panels(
        &self,
        isa: Isa,
        nr: usize,
        (k0, kc): (usize, usize),
        (c0, nb): (usize, usize),
        dst: &mut [f32],
    ) {
        /// Columns gathered at once: one contiguous segment of a row, then cut into
        /// panels.
        const SEGMENT: usize = 256;
        if let Some(layout) = &self.layout {
            phase_panels::pack_from_phases(isa, (self, layout, nr, (k0, kc), (c0, nb), dst));
            return;
        }
        let mut segment = [0f32; SEGMENT];
        let panel_len = kc * nr;
        let mut index = TapIndex::of(&self.geometry, k0);
        for kk in 0..kc {
            let tap = ImTap::new(&self.geometry, self.planes, index);
            index = index.next(&self.geometry);
            let mut done = 0;
            while done < nb {
                // Whole panels per segment (nr divides SEGMENT for every tile).
                let len = (nb - done).min(SEGMENT / nr * nr);
                let seg = &mut segment[..len];
                tap.segment(&self.geometry, c0 + done, seg);
                for (i, cols) in seg.chunks(nr).enumerate() {
                    let q = (done / nr) + i;
                    let step = &mut dst[q * panel_len + kk * nr..][..nr];
                    step[..cols.len()].copy_from_slice(cols);
                    if cols.len() < nr {
                        step[cols.len()..].fill(0.0);
                    }
                }
                done += len;
            }
        }
    }
}

/// True when `isa` has the kernel of [`conv_channels_in_lanes`] (AVX2 or AVX-512 on
/// x86-64).
pub fn has_channels_in_lanes(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa.avx2().is_some();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Most taps (`kernel_h * kernel_w`) of a convolution [`conv_channels_in_lanes`] runs.
pub const CHANNELS_IN_LANES_MAX_TAPS: usize = 64;

/// Scratch of one task of [`conv_channels_in_lanes`] (the sums of its tiles between
/// blocks of the depth).
#[cfg(target_arch = "x86_64")]
const LANES_TASK_SCRATCH: usize = channels_in_lanes::TASK_SCRATCH;
#[cfg(not(target_arch = "x86_64"))]
const LANES_TASK_SCRATCH: usize = 0;

/// The input window of [`conv_channels_in_lanes`]: `None` when the convolution reads
/// its input planes in place (no padding, every tap inside the planes), or the rows and
/// columns of the zero-padded planes it reads otherwise (as many as its taps reach).
fn lanes_padded_planes(g: &ConvGeometry) -> Option<(usize, usize)> {
    let reach = |out: usize, stride: usize, kernel: usize, dilation: usize| {
        out.saturating_sub(1) * stride + kernel.saturating_sub(1) * dilation + 1
    };
    let rows = reach(g.out_h, g.stride_h, g.kernel_h, g.dilation_h);
    let cols = reach(g.out_w, g.stride_w, g.kernel_w, g.dilation_w);
    let in_place = g.pad_top == 0 && g.pad_left == 0 && rows <= g.in_h && cols <= g.in_w;
    (!in_place).then_some((rows, cols))
}

/// Scratch elements [`conv_channels_in_lanes`] needs for `g` on `threads` threads: the
/// zero-padded input planes, if it reads any, and each task's sums.
pub fn channels_in_lanes_scratch_len(g: &ConvGeometry, threads: usize) -> usize {
    let padded = lanes_padded_planes(g).map_or(0, |(h, w)| {
        g.in_channels().saturating_mul(h).saturating_mul(w)
    });
    padded.saturating_add(threads.clamp(1, ColumnBlocks::<f32>::MAX_BLOCKS) * LANES_TASK_SCRATCH)
}

/// Fewest output pixels per task for which [`conv_channels_in_lanes`] splits a plane's
/// pixels over the threads rather than its output channels: then each thread reads the
/// rows its previous layer wrote (on that thread, where that layer split pixels too)
/// rather than every input channel.
#[cfg(target_arch = "x86_64")]
const LANES_MIN_TASK_PIXELS: usize = 256;

/// A convolution of one image and one group (`g.groups == 1`, not transposed) of
/// `input`'s `c_in` planes with a filter stored input-channel major (`filter[(ci * kh *
/// kw + ky * kw + kx) * c_out + co]`, dim order `(1, 2, 3, 0)` of `[c_out, c_in, kh,
/// kw]`), plus `bias` (one per output channel), clamped into `clamp` as
/// [`output_clamp`](crate::output_clamp) does, into `output`'s `c_out` planes, with
/// the output channels in the vector lanes. The input is read in place, or from a
/// zero-padded copy of its planes in `scratch` (at least
/// [`channels_in_lanes_scratch_len`] elements). Large planes split their pixels over
/// `pool`'s threads, small ones their output channels. Each output is the sum of its
/// products in filter-row order, fused multiply-adds from 0, then the bias, then the
/// clamp. Returns `false`, writing nothing, when `isa` has no such kernel
/// ([`has_channels_in_lanes`]), the geometry is not one group or has more than
/// [`CHANNELS_IN_LANES_MAX_TAPS`] taps, or a slice is shorter than `g` says.
pub fn conv_channels_in_lanes(
    pool: &ThreadPool,
    isa: Isa,
    g: &ConvGeometry,
    (input, filter): (&[f32], &[f32]),
    (bias, clamp): (Option<&[f32]>, Option<(f32, f32)>),
    output: &mut [f32],
    scratch: &mut [f32],
) -> bool {
    let (c_in, c_out, pixels) = (g.in_channels(), g.out_channels(), g.out_pixels());
    let taps = g.kernel_h * g.kernel_w;
    let fits = |len: usize, a: usize, b: usize| a.checked_mul(b).is_some_and(|n| n <= len);
    if g.groups != 1
        || !(1..=CHANNELS_IN_LANES_MAX_TAPS).contains(&taps)
        || !fits(input.len(), c_in, g.in_h * g.in_w)
        || !fits(filter.len(), c_in * taps, c_out)
        || !fits(output.len(), c_out, pixels)
        || bias.is_some_and(|b| b.len() < c_out)
        || scratch.len() < channels_in_lanes_scratch_len(g, pool.threads())
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = isa.avx2() {
        if c_out == 0 || pixels == 0 {
            return true;
        }
        let padded = lanes_padded_planes(g);
        let (plane_h, plane_w) = padded.unwrap_or((g.in_h, g.in_w));
        let (copy, sums) = match padded {
            Some((h, w)) => scratch.split_at_mut(c_in * h * w),
            None => scratch.split_at_mut(0),
        };
        let x: &[f32] = match padded {
            Some(_) => {
                pad_planes(pool, g, (plane_h, plane_w), input, copy);
                copy
            }
            None => &input[..c_in * g.in_h * g.in_w],
        };
        let mut window = channels_in_lanes::Window {
            plane: plane_h * plane_w,
            taps: [0; channels_in_lanes::MAX_TAPS],
            taps_len: taps,
            out_w: g.out_w.max(1),
            row_pitch: g.stride_h * plane_w,
            col_step: g.stride_w,
        };
        for (t, at) in window.taps.iter_mut().take(taps).enumerate() {
            *at = (t / g.kernel_w) * g.dilation_h * plane_w + (t % g.kernel_w) * g.dilation_w;
        }
        // The last pixel's last tap of the last channel must be inside the input.
        let last = (g.out_h - 1) * window.row_pitch
            + (g.out_w - 1) * window.col_step
            + (c_in.max(1) - 1) * window.plane
            + window.taps[taps - 1];
        if c_in > 0 && last >= x.len() {
            return false;
        }
        let op = channels_in_lanes::Operands {
            input: x,
            window,
            c_in,
            filter,
            bias,
            clamp,
            c_out,
            pixels,
        };
        let threads = pool.threads().clamp(1, ColumnBlocks::<f32>::MAX_BLOCKS);
        let step = channels_in_lanes::channel_step(isa.avx512().is_some());
        let block = if threads > 1 && pixels >= threads * LANES_MIN_TASK_PIXELS {
            // Whole cache lines per task where the plane is.
            (c_out, pixels.div_ceil(threads).next_multiple_of(16))
        } else {
            (c_out.div_ceil(threads).div_ceil(step) * step, pixels)
        };
        let output = &mut output[..c_out * pixels];
        let Some(blocks) = ColumnBlocks::grid(output, (c_out, pixels), pixels, block) else {
            return false;
        };
        let sums = &mut sums[..blocks.blocks() * LANES_TASK_SCRATCH];
        let ok = AtomicBool::new(true);
        let wide = isa.avx512().is_some();
        pool.for_each_chunk_mut(sums, LANES_TASK_SCRATCH, 1, |t, sums| {
            let done = blocks.take(t).is_some_and(|mut out| {
                let ranges = (blocks.rows(t), blocks.columns(t));
                channels_in_lanes::run(cpu, wide, &op, ranges, &mut out, sums)
            });
            if !done {
                ok.store(false, Ordering::Relaxed);
            }
        });
        return ok.load(Ordering::Relaxed);
    }
    let _ = (pool, isa, clamp);
    false
}

/// `input`'s planes copied into `padded` as planes of `rows x cols`, input pixel
/// `(y, x)` at `(y + pad_top, x + pad_left)`, zeros elsewhere; in parallel, a range of
/// planes per task. `padded` holds exactly `in_channels` such planes.
#[cfg(target_arch = "x86_64")]
fn pad_planes(
    pool: &ThreadPool,
    g: &ConvGeometry,
    (rows, cols): (usize, usize),
    input: &[f32],
    padded: &mut [f32],
) {
    let in_plane = g.in_h * g.in_w;
    let (x0, x1) = (g.pad_left.min(cols), (g.pad_left + g.in_w).min(cols));
    let min_planes = (crate::GRAIN_SIZE / (rows * cols).max(1)).max(1);
    pool.for_each_chunk_mut(padded, rows * cols, min_planes, |c, plane| {
        let src = &input[c * in_plane..(c + 1) * in_plane];
        for (y, row) in plane.chunks_exact_mut(cols).enumerate() {
            match (y.checked_sub(g.pad_top), x1 > x0) {
                (Some(sy), true) if sy < g.in_h => {
                    row[..x0].fill(0.0);
                    row[x0..x1].copy_from_slice(&src[sy * g.in_w..][..x1 - x0]);
                    row[x1..].fill(0.0);
                }
                _ => row.fill(0.0),
            }
        }
    });
}

/// One group's convolution `out = filter x im2col(image) + bias`, clamped, with tiles
/// that read the image's phase planes in place (`phase_tiles.rs`, AVX-512) rather than
/// packing im2col panels from them: for a short depth (a stem's 3 input channels) the
/// packing costs a third of the products. `filter` is `[group_out, patch]` row major,
/// `bias` one value per output channel, `out` `[group_out, out_pixels]`; the result is
/// the same, bit for bit, as [`crate::gemm::gemm_im2col`]'s with the bias as a per-row
/// addend. Returns `false`, writing nothing, where it does not apply: no AVX-512, a
/// depth over 256 or output channels not a multiple of 8, or operands shorter than
/// the geometry; the caller then runs the GEMM (which also rewrites all of `out` in the
/// one case found only while running: a task missing its block of the output).
pub fn conv_from_phases(
    pool: &ThreadPool,
    isa: Isa,
    image: &Im2col<'_>,
    (filter, bias): (&[f32], Option<&[f32]>),
    clamp: Option<(f32, f32)>,
    out: &mut [f32],
) -> bool {
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (pool, isa, image, filter, bias, clamp, out);
        false
    }
    #[cfg(target_arch = "x86_64")]
    {
        let g = &image.geometry;
        let (depth, px, rows) = (g.patch_len(), g.out_pixels(), g.group_out);
        let (Some(_), Some(layout)) = (isa.avx512(), image.layout) else {
            return false;
        };
        let fits = (1..=phase_tiles::MAX_DEPTH).contains(&depth)
            && rows % phase_tiles::TILE_ROWS == 0
            && px > 0
            && filter.len() >= rows * depth
            && bias.is_none_or(|b| b.len() >= rows)
            && out.len() >= rows * px;
        if !fits {
            return false;
        }
        let mut offsets = [0usize; phase_tiles::MAX_DEPTH];
        let mut index = TapIndex::of(g, 0);
        for offset in offsets.iter_mut().take(depth) {
            *offset = layout.tap_offset(g, index);
            index = index.next(g);
        }
        let offsets = &offsets[..depth];
        // Every tile reads at most up to its row's end: the last row's end past the largest
        // offset must lie inside the planes.
        let reach = offsets.iter().max().and_then(|&most| {
            most.checked_add((g.out_h - 1).checked_mul(layout.pitch())?)?
                .checked_add(g.out_w)
        });
        if reach.is_none_or(|end| end > image.planes.len()) || layout.pitch() < g.out_w {
            return false;
        }
        let bands = pool
            .threads()
            .clamp(1, ColumnBlocks::<f32>::MAX_BLOCKS)
            .min(g.out_h);
        let band_rows = g.out_h.div_ceil(bands);
        let bands = g.out_h.div_ceil(band_rows);
        let Some(blocks) = ColumnBlocks::grid(
            &mut out[..rows * px],
            (rows, px),
            px,
            (rows, band_rows * g.out_w),
        ) else {
            return false;
        };
        let band = phase_tiles::Band {
            filter: &filter[..rows * depth],
            bias: bias.map(|b| &b[..rows]),
            bounds: clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY)),
            planes: image.planes,
            offsets,
            pitch: layout.pitch(),
        };
        let ok = AtomicBool::new(true);
        pool.parallel_for(0..bands, 1, |_, tasks| {
            for t in tasks {
                let out_rows = t * band_rows..((t + 1) * band_rows).min(g.out_h);
                let window = blocks.take(t).and_then(|mut block| {
                    let cols = block.cols();
                    (cols == out_rows.len() * g.out_w)
                        .then(|| block.window_ptr((0, 0), (rows, cols)))
                        .flatten()
                });
                let Some(ptr) = window else {
                    ok.store(false, Ordering::Relaxed);
                    continue;
                };
                // SAFETY: AVX-512 F was detected (`isa.avx512()`); the filter, bias and
                // offsets hold what `band` reads (checked above: depth, rows a multiple of
                // the tile's, every offset plus the last row's end inside the planes); the
                // window is this task's block: `rows` rows of the band's pixels, `px` apart.
                unsafe { phase_tiles::band(g, &band, out_rows, (ptr, px)) };
            }
        });
        ok.load(Ordering::Relaxed)
    }
}

/// [`LanesDepthwise::run`] takes planes in multiples of this.
pub const LANES_DEPTHWISE_PLANES: usize = 16;

/// Most output pixels of a plane [`LanesDepthwise::preferred`] takes: on an AMD EPYC,
/// one thread, 7x7 outputs ran in 16 us where [`PlaneConv`] took 22 (960 planes of 7x7;
/// 576 of 14x14 -> 7x7 15 against 20), 14x14 outputs in 28 against 22 (576 planes).
pub const LANES_DEPTHWISE_MAX_PREFERRED_PIXELS: usize = 64;

/// A depthwise convolution (one input plane per output plane) of
/// [`LANES_DEPTHWISE_PLANES`] planes at once, with the planes in the AVX-512 lanes: for
/// small planes (at most 256 output pixels: 14x14, 7x7), where [`PlaneConv`]'s kernels
/// spend more time per plane than per pixel. Each output is the bias plus its taps in
/// `(ky, kx)` order with fused multiply-adds, as [`PlaneConv`] sums them.
pub struct LanesDepthwise {
    #[cfg(target_arch = "x86_64")]
    kernel: depthwise_lanes::LanesDepthwise,
}

impl LanesDepthwise {
    /// The kernel for `g` on `isa`, or `None` where it has none (no AVX-512, more than
    /// one plane per group, planes too large, filters of more than 25 taps).
    pub fn new(isa: Isa, g: &ConvGeometry) -> Option<LanesDepthwise> {
        #[cfg(target_arch = "x86_64")]
        {
            let kernel = depthwise_lanes::LanesDepthwise::new(isa.avx512()?, g)?;
            Some(LanesDepthwise { kernel })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, g);
            None
        }
    }

    /// [`LanesDepthwise::new`] where it beats [`PlaneConv`]: output planes of at most
    /// [`LANES_DEPTHWISE_MAX_PREFERRED_PIXELS`] pixels.
    pub fn preferred(isa: Isa, g: &ConvGeometry) -> Option<LanesDepthwise> {
        if g.out_pixels() > LANES_DEPTHWISE_MAX_PREFERRED_PIXELS {
            return None;
        }
        LanesDepthwise::new(isa, g)
    }

    /// Scratch elements one call needs.
    pub fn scratch_len(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        return self.kernel.scratch_len();
        #[cfg(not(target_arch = "x86_64"))]
        0
    }

    /// Convolves consecutive planes, as many as `output` holds whole output planes (a
    /// multiple of [`LANES_DEPTHWISE_PLANES`]): `input` their input planes one after
    /// another, `filters` their filters, `bias` their biases (none: zeros), then the
    /// clamp when given (as [`PlaneConv::run`]). `scratch` holds
    /// [`LanesDepthwise::scratch_len`] elements. Returns `false`, writing nothing, when
    /// a slice is too short or the planes are not a multiple of sixteen.
    pub fn run(
        &self,
        (input, filters, bias): (&[f32], &[f32], Option<&[f32]>),
        clamp: Option<(f32, f32)>,
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let bounds = clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
            self.kernel
                .run((input, filters, bias), bounds, output, scratch)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (input, filters, bias, clamp, output, scratch);
            false
        }
    }
}

/// Scratch elements a plane convolution or [`PlaneMaxPool`] runs best with for `g`
/// (the whole plane in one band, up to 128 KiB).
pub fn plane_scratch_len(g: &ConvGeometry) -> usize {
    polyphase::preferred_scratch_len(g)
}

/// A depthwise plane convolution prepared once for a geometry, a scratch size and an
/// instruction set: the polyphase kernel's band height and tap offsets
/// ([`plane_scratch_len`] elements of scratch run a whole plane in one band; less
/// runs in bands, and none a row kernel that needs no scratch).
pub struct PlaneConv {
    isa: Isa,
    g: ConvGeometry,
    /// `None`: the row kernel (too many taps, or not one row fits the scratch), or a
    /// direct kernel.
    plan: Option<polyphase::Plan>,
    /// A direct AVX-512 kernel, when the instruction set has it and one handles the
    /// geometry.
    #[cfg(target_arch = "x86_64")]
    direct: Option<DirectKernel>,
    scratch_len: usize,
}

impl PlaneConv {
    /// Prepared for `g` with `scratch_len` elements of scratch per plane, on this CPU's
    /// best instruction set.
    pub fn new(g: &ConvGeometry, scratch_len: usize) -> PlaneConv {
        PlaneConv::with_isa(crate::dispatch().gemm, g, scratch_len)
    }

    /// [`PlaneConv::new`] on `isa`: with AVX2 and FMA (or NEON) the loops are compiled
    /// with fused multiply-adds and vectorised; elsewhere `x * w + o` rounds twice.
    pub fn with_isa(isa: Isa, g: &ConvGeometry, scratch_len: usize) -> PlaneConv {
        #[cfg(target_arch = "x86_64")]
        let direct = DirectKernel::new(isa, g);
        #[cfg(target_arch = "x86_64")]
        let plan = match direct {
            Some(_) => None,
            None => polyphase::Plan::new(g, scratch_len),
        };
        #[cfg(not(target_arch = "x86_64"))]
        let plan = polyphase::Plan::new(g, scratch_len);
        PlaneConv {
            isa,
            g: *g,
            plan,
            #[cfg(target_arch = "x86_64")]
            direct,
            scratch_len,
        }
    }

    /// [`PlaneConv::with_isa`] without the direct kernels: the polyphase (or row)
    /// kernel, which the direct ones are tested against.
    #[cfg(all(test, target_arch = "x86_64"))]
    fn polyphase_only(isa: Isa, g: &ConvGeometry, scratch_len: usize) -> PlaneConv {
        PlaneConv {
            isa,
            g: *g,
            plan: polyphase::Plan::new(g, scratch_len),
            #[cfg(target_arch = "x86_64")]
            direct: None,
            scratch_len,
        }
    }

    /// Convolves one input plane (`in_h x in_w`) with one `kernel_h x kernel_w` filter
    /// into one output plane (`out_h x out_w`), adding `bias`, then clamping each output
    /// into `clamp` when given (below the minimum it is the minimum, above the maximum
    /// the maximum, NaN stays): the depthwise case, one output channel reading one
    /// input channel. `scratch` holds at least the elements the convolution was
    /// prepared with (the polyphase planes of a band of output rows). Returns `false`,
    /// writing nothing, when a slice is too short.
    pub fn run(
        &self,
        input: &[f32],
        filter: &[f32],
        (bias, clamp): (f32, Option<(f32, f32)>),
        output: &mut [f32],
        scratch: &mut [f32],
    ) -> bool {
        let g = &self.g;
        if input.len() < g.in_h * g.in_w
            || filter.len() < g.kernel_h * g.kernel_w
            || output.len() < g.out_h * g.out_w
            || (self.plan.is_some() && scratch.len() < self.scratch_len)
        {
            return false;
        }
        let plan = self.plan.as_ref();
        let output = &mut output[..g.out_h * g.out_w];
        #[cfg(target_arch = "x86_64")]
        if let Some(direct) = &self.direct {
            let plane = DirectPlane {
                input: &input[..g.in_h * g.in_w],
                filter: &filter[..g.kernel_h * g.kernel_w],
                bias,
                bounds: clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY)),
            };
            match direct {
                DirectKernel::Stride2(k) => k.plane(g, plane, output),
                DirectKernel::Square(k) => k.plane(g, plane, output),
                DirectKernel::Flat(k) => k.plane(g, plane, output),
                DirectKernel::NarrowRows(k) => k.plane(plane, output),
                DirectKernel::Phases(k) => k.plane(plane, output),
                DirectKernel::PhaseRows(k) => k.plane(plane, output),
                DirectKernel::WideRows(k) => k.plane(plane, output),
            }
            return true;
        }
        let bias = (bias, clamp);
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = self.isa.avx2() {
            let avx512 = self.isa.avx512().is_some();
            x86::plane_simd(t, avx512, (plan, g), (input, filter, bias), output, scratch);
            return true;
        }
        #[cfg(target_arch = "aarch64")]
        if self.isa.neon().is_some() {
            plane::<true>(plan, g, (input, filter, bias), output, scratch);
            return true;
        }
        plane::<false>(plan, g, (input, filter, bias), output, scratch);
        true
    }
}

/// The operands of one plane of a direct depthwise kernel ([`DirectKernel`]), cut to
/// the lengths of the geometry the kernel was prepared for: the input plane (`in_h x
/// in_w`), the filter (`kernel_h x kernel_w`), the bias, and the clamp's (lower, upper)
/// bounds (infinite for none). The kernel writes the `out_h x out_w` output plane.
#[cfg(target_arch = "x86_64")]
struct DirectPlane<'a> {
    input: &'a [f32],
    filter: &'a [f32],
    bias: f32,
    bounds: (f32, f32),
}

/// Whether `g` is a 3x3 filter of stride `stride` and dilation 1 both ways, with one
/// pixel of padding left and one or none above (a "same" plane, or a band of its rows,
/// `ConvGeometry::row_band`), and output rows of `widths` pixels: the layers the
/// AVX-512 row depthwise kernels take (each with conditions of its own besides).
#[cfg(target_arch = "x86_64")]
fn is_3x3_rows(g: &ConvGeometry, stride: usize, widths: std::ops::RangeInclusive<usize>) -> bool {
    (g.kernel_h, g.kernel_w) == (3, 3)
        && (g.stride_h, g.stride_w, g.dilation_h, g.dilation_w) == (stride, stride, 1, 1)
        && g.pad_top <= 1
        && g.pad_left == 1
        && g.out_h > 0
        && widths.contains(&g.out_w)
}

/// A 3x3 plane's taps, bias and clamp bounds, each broadcast to a 16-lane vector: what
/// the AVX-512 3x3 kernels multiply and add.
#[cfg(target_arch = "x86_64")]
struct WideTaps3x3 {
    weights: [std::arch::x86_64::__m512; 9],
    bias: std::arch::x86_64::__m512,
    /// The clamp's (lower, upper) bounds.
    bounds: (std::arch::x86_64::__m512, std::arch::x86_64::__m512),
}

#[cfg(target_arch = "x86_64")]
impl WideTaps3x3 {
    /// The sums of one output row of `w` pixels, `V` vectors (the last one's lanes past
    /// `w` not stored), clamped into the bounds as `Vector::clamp` does (a NaN, or a zero
    /// equal to a bound, kept) and stored from `row`.
    ///
    /// # Safety
    /// AVX-512 F; `row` points at `w` writable values, `w` in `16 * (V - 1) + 1 ..= 16 * V`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn store_row<const V: usize>(
        &self,
        sums: &[std::arch::x86_64::__m512; V],
        row: *mut f32,
        w: usize,
    ) {
        use std::arch::x86_64::*;
        let (lo, hi) = self.bounds;
        for (v, &sum) in sums.iter().enumerate() {
            let o = _mm512_min_ps(hi, _mm512_max_ps(lo, sum));
            // SAFETY: vector v's lanes inside the row are inside `row`'s `w` values (the
            // caller's promise); the last vector's are masked to them.
            unsafe {
                if v + 1 < V {
                    _mm512_storeu_ps(row.add(16 * v), o);
                } else {
                    _mm512_mask_storeu_ps(
                        row.add(16 * v),
                        lanes_inside(0, (w - 16 * v) as isize, 16),
                        o,
                    );
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl DirectPlane<'_> {
    /// The plane's [`WideTaps3x3`].
    ///
    /// # Safety
    /// AVX-512 F; the filter holds at least 9 taps (else this panics). (Compiled with
    /// AVX-512 F so that it inlines into the kernels: without it the broadcasts would be
    /// calls.)
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn wide_taps_3x3(&self) -> WideTaps3x3 {
        use std::arch::x86_64::_mm512_set1_ps;
        let f = &self.filter[..9];
        WideTaps3x3 {
            weights: [
                _mm512_set1_ps(f[0]),
                _mm512_set1_ps(f[1]),
                _mm512_set1_ps(f[2]),
                _mm512_set1_ps(f[3]),
                _mm512_set1_ps(f[4]),
                _mm512_set1_ps(f[5]),
                _mm512_set1_ps(f[6]),
                _mm512_set1_ps(f[7]),
                _mm512_set1_ps(f[8]),
            ],
            bias: _mm512_set1_ps(self.bias),
            bounds: (_mm512_set1_ps(self.bounds.0), _mm512_set1_ps(self.bounds.1)),
        }
    }
}

/// The direct depthwise kernels (AVX2 or AVX-512), which read the input plane in place.
// Built on the stack once per convolution call: boxing the larger variant would
// allocate on every call.
#[allow(clippy::large_enum_variant)]
#[cfg(target_arch = "x86_64")]
enum DirectKernel {
    /// A small plane of rows at most half a vector wide, stride 1 and the output as
    /// wide as the input, swept as one flat row (AVX2 or AVX-512).
    Flat(depthwise_flat::Flat),
    /// A 3x3 filter, stride 1, "same" padding, over planes of rows at most 14 wide (and,
    /// the flat kernel taking the narrower, more than 8), the input vectors in registers
    /// (AVX-512).
    NarrowRows(depthwise_narrow_rows::NarrowRows),
    /// A 3x3 filter, stride 2, padding one above and left, over an even-sized plane
    /// whose output rows are 2-14 or 17-30 wide, through the plane's four phases
    /// (AVX-512).
    Phases(depthwise_phases::Phases),
    /// The same layer with output rows of 31 to 128 pixels, the phases split a row at
    /// a time (AVX-512).
    PhaseRows(depthwise_phase_rows::PhaseRows),
    /// A 3x3 filter, stride 1, "same" padding, over planes of rows 31 to 128 wide, an
    /// output row's vectors summed at once (AVX-512).
    WideRows(depthwise_wide_rows::WideRows),
    /// A 3x3 or 5x5 filter, stride 1 or 2 both ways (AVX2 or AVX-512).
    Square(depthwise_square::Square),
    /// Other column-stride-2 geometries (AVX-512).
    Stride2(depthwise_avx512::Direct),
}

#[cfg(target_arch = "x86_64")]
impl DirectKernel {
    /// The kernel of `isa` that handles `g`, if any.
    fn new(isa: Isa, g: &ConvGeometry) -> Option<DirectKernel> {
        let (avx2, avx512) = (isa.avx2(), isa.avx512());
        let wide = avx512.is_some();
        // The flat kernel first: on rows of at most half a vector (7x7 planes) it is as
        // fast as the narrow-rows one. Then the AVX-512 3x3 kernels, each for its own
        // geometries, then the square one, then the other column-stride-2 geometries.
        let flat = || avx2.and_then(|cpu| depthwise_flat::Flat::new(cpu, wide, g));
        let wide_3x3 = || {
            let cpu = avx512?;
            depthwise_narrow_rows::NarrowRows::new(cpu, g)
                .map(DirectKernel::NarrowRows)
                .or_else(|| depthwise_phases::Phases::new(cpu, g).map(DirectKernel::Phases))
                .or_else(|| {
                    depthwise_phase_rows::PhaseRows::new(cpu, g).map(DirectKernel::PhaseRows)
                })
                .or_else(|| depthwise_wide_rows::WideRows::new(cpu, g).map(DirectKernel::WideRows))
        };
        let square = || avx2.and_then(|cpu| depthwise_square::Square::new(cpu, wide, g));
        let stride_2 = || avx512.and_then(|cpu| depthwise_avx512::Direct::new(cpu, g));
        flat()
            .map(DirectKernel::Flat)
            .or_else(wide_3x3)
            .or_else(|| square().map(DirectKernel::Square))
            .or_else(|| stride_2().map(DirectKernel::Stride2))
    }
}

/// Max pooling of NCHW planes over the windows of a [`ConvGeometry`] (a 1-in, 1-out
/// channel geometry: kernel, stride, dilation and padding), prepared once per geometry
/// and scratch size: on AVX-512 a direct kernel for square windows of 2 to 5 taps with
/// stride 1 or 2 (`max_pool_avx512.rs`), otherwise the polyphase walk of [`PlaneConv`]
/// with a maximum in place of the weighted sum.
pub struct PlaneMaxPool {
    g: ConvGeometry,
    plan: Option<polyphase::Plan>,
    scratch_len: usize,
    #[cfg(target_arch = "x86_64")]
    direct: Option<max_pool_avx512::MaxPoolArgmax>,
}

impl PlaneMaxPool {
    /// Prepared for `g` with `scratch_len` elements of scratch per plane.
    pub fn new(g: &ConvGeometry, scratch_len: usize) -> PlaneMaxPool {
        PlaneMaxPool {
            g: *g,
            plan: polyphase::Plan::new(g, scratch_len),
            scratch_len,
            #[cfg(target_arch = "x86_64")]
            direct: crate::dispatch()
                .gemm
                .avx512()
                .and_then(|cpu| max_pool_avx512::MaxPoolArgmax::new(cpu, g)),
        }
    }

    /// Writes, for each window, the flat input index `iy * in_w + ix` of its maximum
    /// (the first of equal maxima, taps row by row). Returns `false` when it cannot
    /// decide the plane: a slice too short, a geometry without a plan, a NaN in the
    /// plane or a window with nothing above `-inf`; the caller's general kernel then
    /// runs.
    pub fn run(&self, input: &[f32], indices: &mut [i64], scratch: &mut [f32]) -> bool {
        let g = &self.g;
        let planes_fit = input.len() >= g.in_h * g.in_w && indices.len() >= g.out_h * g.out_w;
        #[cfg(target_arch = "x86_64")]
        if let Some(direct) = self.direct.as_ref().filter(|_| planes_fit) {
            return direct.plane(input, indices);
        }
        let fits = planes_fit && scratch.len() >= self.scratch_len;
        let Some(plan) = self.plan.as_ref().filter(|_| fits) else {
            return false;
        };
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = crate::dispatch().gemm.avx2() {
            return x86::max_pool_avx2(t, plan, g, input, indices, scratch);
        }
        plan.run_max(g, input, indices, scratch)
    }

    /// Writes each window's maximum, the value at the index [`Self::run`] would write
    /// (`-inf` for a window with no tap inside the input), when nothing needs the
    /// indices. Returns `false` when it cannot decide the plane (no direct kernel for
    /// this geometry or CPU, a slice too short, a window that meets a NaN); the
    /// caller's general kernel then runs.
    pub fn run_values(&self, input: &[f32], values: &mut [f32]) -> bool {
        let g = &self.g;
        let planes_fit = input.len() >= g.in_h * g.in_w && values.len() >= g.out_h * g.out_w;
        #[cfg(target_arch = "x86_64")]
        if let Some(direct) = self.direct.as_ref().filter(|_| planes_fit) {
            return direct.values(input, values);
        }
        let _ = (planes_fit, values);
        false
    }
}

/// Input plane, filter, and (bias, output clamp) of one [`PlaneConv::run`].
type PlaneOperands<'a> = (&'a [f32], &'a [f32], (f32, Option<(f32, f32)>));

/// The body of [`PlaneConv::run`], lengths checked: the polyphase kernel, or the row
/// kernel without a plan, then the clamp. `FUSED` rounds `x * w + o` once.
#[inline(always)]
fn plane<const FUSED: bool>(
    plan: Option<&polyphase::Plan>,
    g: &ConvGeometry,
    (input, filter, (bias, clamp)): PlaneOperands<'_>,
    output: &mut [f32],
    scratch: &mut [f32],
) {
    match plan {
        Some(p) => p.run::<FUSED>(g, input, filter, bias, output, scratch),
        None => rows::<FUSED>(g, input, filter, bias, output),
    }
    if let Some(bounds) = clamp {
        for o in output.iter_mut() {
            *o = crate::output_clamp(*o, bounds);
        }
    }
}

/// The plane kernel without scratch: for each output row and valid tap, one
/// multiply-add pass over the row's valid columns.
#[inline(always)]
fn rows<const FUSED: bool>(
    g: &ConvGeometry,
    input: &[f32],
    filter: &[f32],
    bias: f32,
    output: &mut [f32],
) {
    let (iw, oh, ow) = (g.in_w, g.out_h, g.out_w);
    let output = &mut output[..oh * ow];
    output.fill(bias);
    let xs_of: [Range<usize>; 16] = std::array::from_fn(|kx| {
        if kx < g.kernel_w {
            valid_cols(g, kx)
        } else {
            0..0
        }
    });
    for ky in 0..g.kernel_h {
        let ys = valid_rows(g, ky);
        for oy in ys {
            let iy = oy * g.stride_h + ky * g.dilation_h - g.pad_top;
            let src = &input[iy * iw..(iy + 1) * iw];
            let dst = &mut output[oy * ow..(oy + 1) * ow];
            for kx in 0..g.kernel_w {
                let xs = if kx < 16 {
                    xs_of[kx].clone()
                } else {
                    valid_cols(g, kx)
                };
                if xs.is_empty() {
                    continue;
                }
                let w = filter[ky * g.kernel_w + kx];
                let ix0 = xs.start * g.stride_w + kx * g.dilation_w - g.pad_left;
                let d = &mut dst[xs.clone()];
                if g.stride_w == 1 {
                    for (o, &x) in d.iter_mut().zip(&src[ix0..ix0 + xs.len()]) {
                        *o = madd::<FUSED>(x, w, *o);
                    }
                } else {
                    for (j, o) in d.iter_mut().enumerate() {
                        *o = madd::<FUSED>(src[ix0 + j * g.stride_w], w, *o);
                    }
                }
            }
        }
    }
}

/// `x * w + o`, fused into one rounding when `FUSED`.
#[inline(always)]
fn madd<const FUSED: bool>(x: f32, w: f32, o: f32) -> f32 {
    if FUSED { x.mul_add(w, o) } else { x * w + o }
}

/// Each window's argmax by the scalar walk (taps row by row, the first of equal maxima
/// wins), -1 for a window with no tap inside the plane: what [`PlaneMaxPool`]'s kernels
/// are tested against.
#[cfg(test)]
fn max_pool_reference(g: &ConvGeometry, input: &[f32]) -> Vec<i64> {
    let mut want = vec![-1i64; g.out_h * g.out_w];
    for oy in 0..g.out_h {
        for ox in 0..g.out_w {
            let mut best: Option<(f32, usize)> = None;
            for ky in 0..g.kernel_h {
                for kx in 0..g.kernel_w {
                    let (Some(iy), Some(ix)) = (g.source_row(oy, ky), g.source_col(ox, kx)) else {
                        continue;
                    };
                    let v = input[iy * g.in_w + ix];
                    if best.is_none_or(|(b, _)| v > b) {
                        best = Some((v, iy * g.in_w + ix));
                    }
                }
            }
            want[oy * g.out_w + ox] = best.map_or(-1, |(_, i)| i as i64);
        }
    }
    want
}

/// The AVX2 + FMA entry point of the plane kernel.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::polyphase::Plan;
    use super::{ConvGeometry, PlaneOperands, plane};
    use crate::CpuSupport;

    /// [`plane`] compiled with AVX2 and FMA, or with AVX-512 F as well (16 outputs a
    /// vector) when `avx512` (which the caller's token must prove).
    pub(super) fn plane_simd(
        _: CpuSupport,
        avx512: bool,
        (plan, g): (Option<&Plan>, &ConvGeometry),
        operands: PlaneOperands<'_>,
        output: &mut [f32],
        scratch: &mut [f32],
    ) {
        type Call<'a, 'b> = (
            Option<&'a Plan>,
            &'a ConvGeometry,
            PlaneOperands<'a>,
            &'b mut [f32],
        );
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fma((plan, g, operands, output): Call<'_, '_>, scratch: &mut [f32]) {
            plane::<true>(plan, g, operands, output, scratch)
        }
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn wide((plan, g, operands, output): Call<'_, '_>, scratch: &mut [f32]) {
            plane::<true>(plan, g, operands, output, scratch)
        }
        let call = (plan, g, operands, output);
        // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU,
        // and with `avx512` it comes from an `Isa::Avx512*` variant, which proves AVX-512
        // F was too.
        unsafe {
            if avx512 {
                wide(call, scratch)
            } else {
                fma(call, scratch)
            }
        }
    }

    /// [`Plan::run_max`] compiled with AVX2.
    pub(super) fn max_pool_avx2(
        _: CpuSupport,
        plan: &Plan,
        g: &ConvGeometry,
        input: &[f32],
        indices: &mut [i64],
        scratch: &mut [f32],
    ) -> bool {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run(
            plan: &Plan,
            g: &ConvGeometry,
            input: &[f32],
            indices: &mut [i64],
            scratch: &mut [f32],
        ) -> bool {
            plan.run_max(g, input, indices, scratch)
        }
        // SAFETY: the `CpuSupport` token proves AVX2 and FMA were detected on this CPU.
        unsafe { run(plan, g, input, indices, scratch) }
    }
}

/// The col2im scatter of a transposed convolution: `col` holds, per row
/// `r = (o * kernel_h + ky) * kernel_w + kx` of one group, each input pixel's product
/// with that filter tap; the value of input pixel `(iy, ix)` lands on output
/// `(iy * stride_h + ky * dilation_h - pad_top, ix * stride_w + kx * dilation_w -
/// pad_left)` when inside, and is added there. Here `in_*` / `out_*` are the transposed
/// convolution's own input and output sizes; `output` is the group's `[group_out,
/// out_h, out_w]` planes. Returns `false` when a slice is too short.
pub fn col2im_add_nchw(g: &ConvGeometry, col: &[f32], output: &mut [f32]) -> bool {
    let (ih, iw, oh, ow) = (g.in_h, g.in_w, g.out_h, g.out_w);
    let taps = g.kernel_h * g.kernel_w;
    let in_pixels = ih * iw;
    if col.len() < g.group_out * taps * in_pixels || output.len() < g.group_out * oh * ow {
        return false;
    }
    if in_pixels == 0 {
        return true;
    }
    for (r, row) in col
        .chunks_exact(in_pixels)
        .take(g.group_out * taps)
        .enumerate()
    {
        let (o, tap) = (r / taps, r % taps);
        let (ky, kx) = (tap / g.kernel_w, tap % g.kernel_w);
        let plane = &mut output[o * oh * ow..(o + 1) * oh * ow];
        for iy in 0..ih {
            let Some(oy) = g.target_row(iy, ky) else {
                continue;
            };
            let src = &row[iy * iw..(iy + 1) * iw];
            let dst = &mut plane[oy * ow..(oy + 1) * ow];
            for (ix, &v) in src.iter().enumerate() {
                if let Some(ox) = g.target_col(ix, kx) {
                    dst[ox] += v;
                }
            }
        }
    }
    true
}

/// Direct reference convolution of one NCHW image (`[groups * group_in, in_h, in_w]`)
/// with an OIHW filter (`[groups * group_out, group_in, kh, kw]`), bias per output
/// channel, into `[groups * group_out, out_h, out_w]`. Returns `false` when a slice is
/// too short.
pub fn conv2d_nchw_reference(
    g: &ConvGeometry,
    input: &[f32],
    filter: &[f32],
    bias: &[f32],
    output: &mut [f32],
) -> bool {
    let co = g.out_channels();
    if !planar_operands_fit(g, input, (filter, co * g.patch_len()), bias, output) {
        return false;
    }
    let (plane, taps) = (g.in_h * g.in_w, g.kernel_h * g.kernel_w);
    for oc in 0..co {
        let grp = oc / g.group_out.max(1);
        for oy in 0..g.out_h {
            for ox in 0..g.out_w {
                let mut s = bias[oc];
                for i in 0..g.group_in {
                    let x = (grp * g.group_in + i) * plane;
                    let w = (oc * g.group_in + i) * taps;
                    g.for_each_tap(oy, ox, |pixel, tap| {
                        s += input[x + pixel] * filter[w + tap];
                    });
                }
                output[(oc * g.out_h + oy) * g.out_w + ox] = s;
            }
        }
    }
    true
}

/// Direct reference transposed convolution of one NCHW image: input channel
/// `grp * group_in + i` at `(iy, ix)` times filter `[grp * group_in + i, o, ky, kx]`
/// (filter `[groups * group_in, group_out, kh, kw]`, PyTorch's transposed layout) is
/// added to output channel `grp * group_out + o` at `(iy * stride_h + ky * dilation_h -
/// pad_top, ...)`; `in_*` / `out_*` are the transposed convolution's own sizes.
/// Returns `false` when a slice is too short.
pub fn conv_transpose2d_nchw_reference(
    g: &ConvGeometry,
    input: &[f32],
    filter: &[f32],
    bias: &[f32],
    output: &mut [f32],
) -> bool {
    let taps = g.kernel_h * g.kernel_w;
    let filter_len = g.in_channels() * g.group_out * taps;
    if !planar_operands_fit(g, input, (filter, filter_len), bias, output) {
        return false;
    }
    let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h * g.out_w);
    for oc in 0..g.out_channels() {
        output[oc * out_plane..(oc + 1) * out_plane].fill(bias[oc]);
    }
    for ci in 0..g.in_channels() {
        let grp = ci / g.group_in.max(1);
        for o in 0..g.group_out {
            let oc = grp * g.group_out + o;
            let w = (ci * g.group_out + o) * taps;
            for iy in 0..g.in_h {
                for ix in 0..g.in_w {
                    let x = input[ci * in_plane + iy * g.in_w + ix];
                    g.for_each_target(iy, ix, |pixel, tap| {
                        output[oc * out_plane + pixel] += x * filter[w + tap];
                    });
                }
            }
        }
    }
    true
}

/// Whether the slices hold one whole NCHW image, a filter of at least `filter_len`
/// values, a bias per output channel and the whole NCHW output: the checks of the
/// direct references.
fn planar_operands_fit(
    g: &ConvGeometry,
    input: &[f32],
    (filter, filter_len): (&[f32], usize),
    bias: &[f32],
    output: &[f32],
) -> bool {
    let co = g.out_channels();
    input.len() >= g.in_channels() * g.in_h * g.in_w
        && filter.len() >= filter_len
        && bias.len() >= co
        && output.len() >= co * g.out_h * g.out_w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::{Mat, matmul_nt};
    use crate::test_util::{conv_geometry, geometry, grid_values};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn im2col_gemm_matches_the_reference(g in conv_geometry(), seed in 0u32..100) {
            let (ci, co, px) = (g.in_channels(), g.out_channels(), g.out_pixels());
            let input = grid_values(ci * g.in_h * g.in_w, seed);
            let filter = grid_values(co * g.patch_len(), seed + 1);
            let bias = grid_values(co, seed + 2);
            let mut want = vec![0f32; co * px];
            prop_assert!(conv2d_nchw_reference(&g, &input, &filter, &bias, &mut want));
            let plane = g.in_h * g.in_w;
            let mut got = vec![0f32; want.len()];
            let patch = g.patch_len();
            for grp in 0..g.groups {
                let x = &input[grp * g.group_in * plane..];
                // im2col in two pieces, as a caller splitting rows over threads does.
                let mut col = vec![f32::NAN; patch * px];
                let half = patch / 2;
                let (a, b) = col.split_at_mut(half * px);
                prop_assert!(im2col_nchw(&g, x, 0..half, a));
                prop_assert!(im2col_nchw(&g, x, half..patch, b));
                // out[o, p] = sum_k W[o, k] col[k, p]: transpose col to use matmul_nt.
                let mut colt = vec![0f32; col.len()];
                for k in 0..patch {
                    for p in 0..px {
                        colt[p * patch + k] = col[k * px + p];
                    }
                }
                let mut tmp = vec![0f32; px * g.group_out];
                let zero = vec![0f32; g.group_out];
                let ok = matmul_nt(
                    px, g.group_out, patch,
                    Mat { data: &colt, ld: patch },
                    Mat { data: &filter[grp * g.group_out * patch..], ld: patch },
                    Some(&zero), &mut tmp, g.group_out, f32::NEG_INFINITY, f32::INFINITY,
                );
                prop_assert!(ok);
                for o in 0..g.group_out {
                    for p in 0..px {
                        let oc = grp * g.group_out + o;
                        got[oc * px + p] = tmp[p * g.group_out + o] + bias[oc];
                    }
                }
            }
            for (a, b) in got.iter().zip(&want) {
                prop_assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }

        /// The product over panels packed straight from the image gives the bits of the
        /// product over the built im2col matrix, on every instruction set and with
        /// several tasks (column blocks not aligned to output rows), split over the
        /// depth or not.
        #[test]
        fn gemm_im2col_matches_the_built_matrix(g in conv_geometry(), seed in 0u32..100, threads in 1usize..4) {
            let g = ConvGeometry { groups: 1, group_out: g.group_out.max(1), ..g };
            check_gemm_im2col(&g, seed, threads)?;
        }

        #[test]
        fn plane_kernel_matches_the_reference(g in conv_geometry(), seed in 0u32..100) {
            let g = ConvGeometry { groups: 1, group_in: 1, group_out: 1, ..g };
            let input = grid_values(g.in_h * g.in_w, seed);
            let filter = grid_values(g.kernel_h * g.kernel_w, seed + 3);
            let bias = [0.25f32];
            let mut want = vec![0f32; g.out_pixels()];
            prop_assert!(conv2d_nchw_reference(&g, &input, &filter, &bias, &mut want));
            // Every instruction set of this CPU, the scalar twin included; the whole
            // plane in one band, bands of a few rows, and the row kernel (no scratch).
            let whole = plane_scratch_len(&g);
            for &isa in Isa::available() {
                for scratch_len in [whole, whole / 3, 0] {
                    let mut scratch = vec![f32::NAN; scratch_len];
                    let mut got = vec![f32::NAN; want.len()];
                    let conv = PlaneConv::with_isa(isa, &g, scratch_len);
                    prop_assert!(conv.run(&input, &filter, (bias[0], None), &mut got, &mut scratch));
                    for (a, b) in got.iter().zip(&want) {
                        prop_assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                            "{} scratch {scratch_len}: {a} vs {b}", isa.name()
                        );
                    }
                    // With an output clamp: the same values, clamped.
                    let mut clamped = vec![f32::NAN; want.len()];
                    let bias = (bias[0], Some((-0.5, 0.75)));
                    prop_assert!(conv.run(&input, &filter, bias, &mut clamped, &mut scratch));
                    for (c, v) in clamped.iter().zip(&got) {
                        prop_assert_eq!(c.to_bits(), v.clamp(-0.5, 0.75).to_bits());
                    }
                }
            }
        }

        #[test]
        fn max_pool_indices_match_the_reference(g in conv_geometry(), seed in 0u32..100) {
            let g = ConvGeometry { groups: 1, group_in: 1, group_out: 1, ..g };
            // Coarse values, so that windows hold ties.
            let input: Vec<f32> =
                grid_values(g.in_h * g.in_w, seed).iter().map(|v| (v * 4.0).round()).collect();
            let want = max_pool_reference(&g, &input);
            let whole = plane_scratch_len(&g);
            for scratch_len in [whole, whole / 3] {
                let pool = PlaneMaxPool::new(&g, scratch_len);
                let mut scratch = vec![f32::NAN; scratch_len];
                let mut got = vec![-7i64; want.len()];
                if pool.run(&input, &mut got, &mut scratch) {
                    prop_assert_eq!(&got, &want, "scratch {}", scratch_len);
                } else {
                    // Declined: only for a window entirely outside the input, or when
                    // not one row fits the smaller scratch.
                    prop_assert!(scratch_len < whole || want.contains(&-1));
                }
            }
        }

        #[test]
        fn col2im_matches_the_transposed_reference(g in conv_geometry(), seed in 0u32..100) {
            // A transposed convolution with this geometry's kernel, stride, dilation and
            // padding, from an in_h x in_w input to its (unclipped) output size.
            let oh = (g.in_h - 1) * g.stride_h + g.dilation_h * (g.kernel_h - 1) + 1;
            let ow = (g.in_w - 1) * g.stride_w + g.dilation_w * (g.kernel_w - 1) + 1;
            let (Some(oh), Some(ow)) = (oh.checked_sub(2 * g.pad_top), ow.checked_sub(2 * g.pad_left)) else {
                return Ok(());
            };
            let t = ConvGeometry { out_h: oh, out_w: ow, ..g };
            let taps = t.kernel_h * t.kernel_w;
            let inp = t.in_h * t.in_w;
            let input = grid_values(t.in_channels() * inp, seed);
            let filter = grid_values(t.in_channels() * t.group_out * taps, seed + 4);
            let bias = grid_values(t.out_channels(), seed + 5);
            let mut want = vec![0f32; t.out_channels() * oh * ow];
            prop_assert!(conv_transpose2d_nchw_reference(&t, &input, &filter, &bias, &mut want));
            let mut got = vec![0f32; want.len()];
            for oc in 0..t.out_channels() {
                got[oc * oh * ow..(oc + 1) * oh * ow].fill(bias[oc]);
            }
            for grp in 0..t.groups {
                // col[(o, tap), p] = sum_i W[grp * gi + i, o, tap] * x[grp * gi + i, p].
                let rows = t.group_out * taps;
                let mut col = vec![0f32; rows * inp];
                for r in 0..rows {
                    for p in 0..inp {
                        let mut s = 0f32;
                        for i in 0..t.group_in {
                            let ci = grp * t.group_in + i;
                            s += filter[ci * rows + r] * input[ci * inp + p];
                        }
                        col[r * inp + p] = s;
                    }
                }
                let out = &mut got[grp * t.group_out * oh * ow..];
                prop_assert!(col2im_add_nchw(&t, &col, out));
            }
            for (a, b) in got.iter().zip(&want) {
                prop_assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn max_pool_declines_planes_with_nan_or_only_neg_infinity() {
        let g = ConvGeometry::same_on_both_axes((4, 4), (2, 2), (2, 0), (1, 1, 1));
        let pool = PlaneMaxPool::new(&g, plane_scratch_len(&g));
        let mut scratch = vec![0f32; plane_scratch_len(&g)];
        let mut idx = [0i64; 4];
        let mut input: Vec<f32> = (0..16).map(|v| v as f32).collect();
        assert!(pool.run(&input, &mut idx, &mut scratch));
        assert_eq!(idx, [5, 7, 13, 15]);
        input[6] = f32::NAN;
        assert!(!pool.run(&input, &mut idx, &mut scratch));
        let input = [f32::NEG_INFINITY; 16];
        assert!(!pool.run(&input, &mut idx, &mut scratch));
    }

    /// [`gemm_im2col_matches_the_built_matrix`] for one geometry (one group), with the
    /// planes read as they are and split into phase planes.
    fn check_gemm_im2col(g: &ConvGeometry, seed: u32, threads: usize) -> Result<(), TestCaseError> {
        use crate::gemm::{self, Gemm};
        use crate::test_util::mat as view;
        let (patch, px, co) = (g.patch_len(), g.out_pixels(), g.group_out);
        let input = grid_values(g.group_in * g.in_h * g.in_w, seed);
        let filter = grid_values(co * patch, seed + 1);
        let bias = grid_values(co, seed + 2);
        let mut col = vec![f32::NAN; patch * px];
        prop_assert!(im2col_nchw(g, &input, 0..patch, &mut col));
        let built = Gemm {
            a: view(&filter, co, patch, patch, 1),
            b: view(&col, patch, px, px, 1),
            alpha: 1.0,
            addend: Some((view(&bias, co, px, 1, 0), 1.0)),
            clamp: Some((-0.25, 0.5)),
        };
        let pool = crate::ThreadPool::new(threads).unwrap();
        let mut phase_planes = vec![f32::NAN; Im2col::phase_split_len(g)];
        let split = Im2col::phase_split(&pool, g, &input, &mut phase_planes);
        prop_assert!(split.is_some());
        let images = [Im2col::new(*g, &input), split.unwrap()];
        let from_image = Gemm {
            b: view(&[], patch, px, px, 1),
            ..built
        };
        for (&isa, split_depth) in Isa::available()
            .iter()
            .flat_map(|i| [(i, false), (i, true)])
        {
            let need = gemm::im2col_scratch_len(isa, &built, threads)
                .max(gemm::scratch_len(isa, &built, threads))
                .max(gemm::split_depth_scratch_len(isa, &built, threads));
            let mut scratch = vec![f32::NAN; need];
            let mut want = vec![f32::NAN; co * px];
            if split_depth {
                let b = gemm::DepthSplitB::View;
                gemm::gemm_split_depth(&pool, isa, &built, b, &mut want, &mut scratch).unwrap();
            } else {
                gemm::gemm(&pool, isa, &built, &mut want, &mut scratch).unwrap();
            }
            for image in &images {
                let mut got = vec![f32::NAN; co * px];
                if split_depth {
                    let b = gemm::DepthSplitB::Im2col(image);
                    gemm::gemm_split_depth(&pool, isa, &from_image, b, &mut got, &mut scratch)
                        .unwrap();
                } else {
                    gemm::gemm_im2col(&pool, isa, &from_image, image, &mut got, &mut scratch)
                        .unwrap();
                }
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                // A product of one row or one column takes the dot-product path over
                // the built matrix, which sums in another order.
                if co > 1 && px > 1 {
                    prop_assert!(same, "{isa:?}");
                } else {
                    for (a, b) in got.iter().zip(&want) {
                        prop_assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
                    }
                }
            }
        }
        Ok(())
    }

    /// Images whose output rows are short, so that packing plans a block of columns in
    /// several rounds, and whose panels start mid-row: stride 1 read in place, and
    /// padded, strided and dilated ones from phase planes.
    #[test]
    fn gemm_im2col_over_narrow_images_matches_the_built_matrix() {
        let base = ConvGeometry::same_on_both_axes((90, 3), (3, 3), (1, 0), (1, 2, 7));
        let strided = ConvGeometry {
            out_h: 45,
            out_w: 2,
            stride_h: 2,
            stride_w: 2,
            pad_top: 1,
            pad_left: 1,
            ..base
        };
        let dilated = ConvGeometry {
            out_h: 88,
            out_w: 3,
            dilation_h: 2,
            dilation_w: 2,
            pad_top: 1,
            pad_left: 2,
            ..base
        };
        for g in [base, strided, dilated] {
            for threads in [1, 3] {
                check_gemm_im2col(&g, 7, threads).unwrap();
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    proptest! {
        /// The direct AVX-512 depthwise kernels give the polyphase kernel's values
        /// (all sum the bias then every tap in order with fused multiply-adds; the
        /// square-filter kernel skips kernel rows outside the plane, which can change only
        /// the sign of a zero), clamp included, over geometries with strides 1 to 3 and
        /// padding, and rows longer than one vector.
        #[test]
        fn depthwise_direct_matches_polyphase_bits(g in conv_geometry(), wide in 1usize..40, seed in 0u32..100) {
            let g = ConvGeometry { groups: 1, group_in: 1, group_out: 1, ..g };
            // Widen the image (and the output with it) past one 16-lane vector.
            let in_w = g.in_w + wide;
            let eff_w = g.dilation_w * (g.kernel_w - 1) + 1;
            let g = ConvGeometry { in_w, out_w: (in_w + 2 * g.pad_left - eff_w) / g.stride_w + 1, ..g };
            direct_matches_polyphase(&g, seed)?;
        }

        /// The square-filter kernel (3x3 and 5x5, stride 1 or 2, any padding narrower
        /// than the filter on each side) gives the polyphase kernel's values, over
        /// planes from one vector wide to several, clamp included.
        #[test]
        fn depthwise_square_matches_polyphase(
            (k, stride) in (prop::sample::select(vec![3usize, 5]), 1usize..3),
            pads in (0usize..5, 0usize..5, 0usize..5, 0usize..5),
            // Up to 22 output rows at stride 1 and 11 at stride 2: blocks of 8 rows
            // (AVX-512), 4, 2 and single rows.
            extra in (0usize..20, 0usize..70),
            seed in 0u32..100,
        ) {
            let (pad_top, pad_left, pad_bottom, pad_right) =
                (pads.0 % k, pads.1 % k, pads.2 % k, pads.3 % k);
            let (h, w) = (k + extra.0, k + extra.1);
            let g = ConvGeometry {
                in_h: h,
                in_w: w,
                out_h: (h + pad_top + pad_bottom - k) / stride + 1,
                out_w: (w + pad_left + pad_right - k) / stride + 1,
                kernel_h: k,
                kernel_w: k,
                stride_h: stride,
                stride_w: stride,
                dilation_h: 1,
                dilation_w: 1,
                pad_top,
                pad_left,
                groups: 1,
                group_in: 1,
                group_out: 1,
            };
            direct_matches_polyphase(&g, seed)?;
        }

        /// The flat kernel (stride 1, output rows as wide as the input rows and at most
        /// half a vector wide, a small plane) gives the polyphase kernel's values, over
        /// filters from 1x1 to 5x5, square or not, any padding above and below, and
        /// planes from one row to past the kernel's size limit, clamp included.
        #[test]
        fn depthwise_flat_matches_polyphase(
            (kernel_h, kernel_w) in (1usize..6, 1usize..6),
            (top, bottom, left) in (0usize..5, 0usize..5, 0usize..5),
            (h, w) in (1usize..40, 1usize..16),
            seed in 0u32..100,
        ) {
            let out_h = (h + top + bottom + 1).saturating_sub(kernel_h);
            prop_assume!(out_h > 0);
            let g = ConvGeometry {
                in_h: h,
                in_w: w,
                out_h,
                out_w: w,
                kernel_h,
                kernel_w,
                stride_h: 1,
                stride_w: 1,
                dilation_h: 1,
                dilation_w: 1,
                pad_top: top,
                pad_left: left % kernel_w,
                groups: 1,
                group_in: 1,
                group_out: 1,
            };
            direct_matches_polyphase(&g, seed)?;
        }
    }

    #[cfg(target_arch = "x86_64")]
    proptest! {
        /// MobileNet's depthwise layer (3x3, stride 1, one pixel of padding all round)
        /// over planes of narrow rows (up to 30 pixels), where AVX-512 runs
        /// `depthwise_narrow_rows`.
        #[test]
        fn depthwise_narrow_rows_matches_polyphase(
            (h, w) in (1usize..40, 1usize..34),
            seed in 0u32..100,
        ) {
            let g = ConvGeometry::same_on_both_axes((h, w), (3, 3), (1, 1), (1, 1, 1));
            direct_matches_polyphase(&g, seed)?;
        }

        /// The same layer over wider rows (up to 140 pixels), where AVX-512 runs
        /// `depthwise_wide_rows` on rows of 31 to 128.
        #[test]
        fn depthwise_wide_rows_match_polyphase(
            (h, w) in (1usize..40, 28usize..140),
            band in (0usize..40, 1usize..40),
            seed in 0u32..100,
        ) {
            let g = ConvGeometry::same_on_both_axes((h, w), (3, 3), (1, 1), (1, 1, 1));
            plane_and_band_match_polyphase(&g, band, seed)?;
        }

        /// MobileNet's downsampling depthwise layer (3x3, stride 2, one pixel of
        /// padding), where AVX-512 runs `depthwise_phases` on even sizes.
        #[test]
        fn depthwise_phases_match_polyphase(
            (h, w) in (1usize..70, 1usize..64),
            seed in 0u32..100,
        ) {
            let g = ConvGeometry::same_on_both_axes((h, w), (3, 3), (2, 1), (1, 1, 1));
            direct_matches_polyphase(&g, seed)?;
        }

        /// The same layer on wider planes (output rows of 31 to 130 pixels), where
        /// AVX-512 runs `depthwise_phase_rows` on even sizes.
        #[test]
        fn depthwise_phase_rows_match_polyphase(
            (h, w) in (1usize..24, 60usize..262),
            band in (0usize..12, 1usize..12),
            seed in 0u32..100,
        ) {
            let g = ConvGeometry::same_on_both_axes((h, w), (3, 3), (2, 1), (1, 1, 1));
            plane_and_band_match_polyphase(&g, band, seed)?;
        }
    }

    proptest! {
        /// A convolution through tiles that read the phase planes in place (a stem:
        /// few input channels, a short depth) gives the packed GEMM's values to the bit,
        /// whether its rows are whole vectors (tiles across row ends) or not, on one
        /// thread or several; where AVX-512 is missing it declines.
        #[test]
        fn conv_from_phases_matches_the_gemm(
            (ih, iw, k, stride) in (1usize..40, 1usize..70, 1usize..8, 1usize..3),
            (pad, group_in, tiles) in (0usize..4, 1usize..4, 1usize..4),
            (clamp, bias, threads, seed) in (any::<bool>(), any::<bool>(), 1usize..4, 0u32..100),
        ) {
            let steps = (stride, stride, 1, 1);
            let channels = (1, group_in, 8 * tiles);
            let Some(g) = geometry((ih, iw, k, k), steps, (pad, pad), channels) else {
                return Ok(());
            };
            conv_from_phases_matches_gemm(&g, (clamp, bias), threads, seed)?;
        }
    }

    /// A stem (3x3, stride 2, one pixel of padding, 3 input channels) whose output
    /// rows are two vectors wide, tiled across row ends, and a 7x7 one whose are not.
    #[test]
    fn conv_from_phases_runs_stems_as_the_gemm() {
        for (size, k, pad, c_out) in [(64, 3, 1, 32), (46, 7, 3, 16)] {
            let g = ConvGeometry::same_on_both_axes((size, size), (k, k), (2, pad), (1, 3, c_out));
            for threads in [1, 2, 3] {
                conv_from_phases_matches_gemm(&g, (true, true), threads, 7).unwrap();
            }
        }
    }

    /// Runs [`conv_from_phases`] and the GEMM over the same image (phase planes, or the
    /// planes themselves for stride 1 without padding) and compares their bits.
    fn conv_from_phases_matches_gemm(
        g: &ConvGeometry,
        (clamp, bias): (bool, bool),
        threads: usize,
        seed: u32,
    ) -> Result<(), TestCaseError> {
        use crate::gemm::{self, Gemm};
        use crate::test_util::mat as view;
        let (patch, px, co) = (g.patch_len(), g.out_pixels(), g.group_out);
        let input = grid_values(g.group_in * g.in_h * g.in_w, seed);
        let filter = grid_values(co * patch, seed + 1);
        let biases = grid_values(co, seed + 2);
        let bias = bias.then_some(&biases[..]);
        let clamp = clamp.then_some((-0.25, 0.5));
        let product = Gemm {
            a: view(&filter, co, patch, patch, 1),
            b: view(&[], patch, px, px, 1),
            alpha: 1.0,
            addend: bias.map(|b| (view(b, co, px, 1, 0), 1.0)),
            clamp,
        };
        let pool = crate::ThreadPool::new(threads).unwrap();
        let mut planes = vec![f32::NAN; Im2col::phase_split_len(g)];
        let image = Im2col::phase_split(&pool, g, &input, &mut planes).unwrap();
        for &isa in Isa::available() {
            let mut scratch = vec![f32::NAN; gemm::im2col_scratch_len(isa, &product, threads)];
            let mut want = vec![f32::NAN; co * px];
            gemm::gemm_im2col(&pool, isa, &product, &image, &mut want, &mut scratch).unwrap();
            let mut got = vec![f32::NAN; co * px];
            let ran = conv_from_phases(&pool, isa, &image, (&filter, bias), clamp, &mut got);
            #[cfg(target_arch = "x86_64")]
            let wide = isa.avx512().is_some();
            #[cfg(not(target_arch = "x86_64"))]
            let wide = false;
            prop_assert_eq!(ran, wide && patch <= 256, "{:?}", isa);
            if !ran {
                continue;
            }
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                prop_assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{:?} output {}: {} vs {}",
                    isa,
                    i,
                    a,
                    b
                );
            }
        }
        Ok(())
    }

    proptest! {
        /// A plane convolved band by band (`ConvGeometry::row_band`, each band's
        /// kernel prepared for its own geometry and reading the input from the band's
        /// first row) gives the whole plane's values to the bit, on every instruction set
        /// of this CPU: the square-filter kernels, the others and the scalar loops.
        #[test]
        fn row_bands_match_the_whole_plane(
            g in conv_geometry(),
            tall in 0usize..24,
            wide in 0usize..24,
            band in 1usize..6,
            seed in 0u32..100,
        ) {
            let g = ConvGeometry { groups: 1, group_in: 1, group_out: 1, ..g };
            let (eff_h, eff_w) = (g.dilation_h * (g.kernel_h - 1) + 1, g.dilation_w * (g.kernel_w - 1) + 1);
            let (in_h, in_w) = (g.in_h + tall, g.in_w + wide);
            let g = ConvGeometry {
                in_h,
                in_w,
                out_h: (in_h + 2 * g.pad_top - eff_h) / g.stride_h + 1,
                out_w: (in_w + 2 * g.pad_left - eff_w) / g.stride_w + 1,
                ..g
            };
            let input = grid_values(g.in_h * g.in_w, seed);
            let filter = grid_values(g.kernel_h * g.kernel_w, seed + 3);
            let scratch_len = plane_scratch_len(&g);
            let mut scratch = vec![f32::NAN; scratch_len];
            for &isa in Isa::available() {
                let mut whole = vec![f32::NAN; g.out_pixels()];
                let conv = PlaneConv::with_isa(isa, &g, scratch_len);
                prop_assert!(conv.run(&input, &filter, (0.25, None), &mut whole, &mut scratch));
                let mut banded = vec![f32::NAN; g.out_pixels()];
                for (i, out) in banded.chunks_mut(band * g.out_w).enumerate() {
                    let rows = i * band..(i * band + band).min(g.out_h);
                    let (bg, first) = g.row_band(rows);
                    prop_assert!(plane_scratch_len(&bg) <= scratch_len);
                    let conv = PlaneConv::with_isa(isa, &bg, scratch_len);
                    let x = &input[first * g.in_w..];
                    prop_assert!(conv.run(x, &filter, (0.25, None), out, &mut scratch));
                }
                for (i, (a, b)) in banded.iter().zip(&whole).enumerate() {
                    prop_assert!(a.to_bits() == b.to_bits(), "{}, output {i}: {a} vs {b}", isa.name());
                }
            }
        }
    }

    /// [`direct_matches_polyphase`] on the plane of `g`, then on a band of its output
    /// rows (`band`: first row, modulo the plane's, and rows), as threads split large
    /// planes.
    #[cfg(target_arch = "x86_64")]
    fn plane_and_band_match_polyphase(
        g: &ConvGeometry,
        (first, rows): (usize, usize),
        seed: u32,
    ) -> Result<(), TestCaseError> {
        direct_matches_polyphase(g, seed)?;
        let start = first % g.out_h;
        direct_matches_polyphase(&g.row_band(start..(start + rows).min(g.out_h)).0, seed)
    }

    /// One plane of `g` (a 1-in, 1-out channel geometry) convolved with the polyphase
    /// kernel and, on every SIMD instruction set of this CPU, as `PlaneConv` runs it (a
    /// direct kernel where one handles `g`), with and without a clamp: the same values
    /// (equal bits, or both zero of either sign). All with fused multiply-adds.
    #[cfg(target_arch = "x86_64")]
    fn direct_matches_polyphase(g: &ConvGeometry, seed: u32) -> Result<(), TestCaseError> {
        let isas = Isa::available();
        let Some(&fma) = isas.iter().find(|i| i.avx2().is_some()) else {
            return Ok(());
        };
        let input = grid_values(g.in_h * g.in_w, seed << 20);
        // Every tap its own weight (up to 17 taps), so that a kernel using one tap's
        // weight for another's fails: `grid_values` repeats values at some indices.
        let filter: Vec<f32> = (0..g.kernel_h * g.kernel_w)
            .map(|t| ((t * 7 + seed as usize) % 17) as f32 / 8.0 - 1.0)
            .collect();
        for clamp in [None, Some((-0.5, 0.75))] {
            let scratch_len = plane_scratch_len(g);
            let mut scratch = vec![f32::NAN; scratch_len];
            let run = |conv: PlaneConv, scratch: &mut [f32]| {
                let mut out = vec![f32::NAN; g.out_pixels()];
                conv.run(&input, &filter, (0.25, clamp), &mut out, scratch)
                    .then_some(out)
            };
            let want = run(PlaneConv::polyphase_only(fma, g, scratch_len), &mut scratch);
            let Some(want) = want else {
                return Err(TestCaseError::fail(
                    "the polyphase kernel refused the plane",
                ));
            };
            for &isa in isas.iter().filter(|i| i.avx2().is_some()) {
                let got = run(PlaneConv::with_isa(isa, g, scratch_len), &mut scratch);
                prop_assert!(got.is_some(), "{} refused the plane", isa.name());
                for (i, (a, b)) in got.iter().flatten().zip(&want).enumerate() {
                    let same = a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0);
                    prop_assert!(same, "{}, output {i}: {a} vs {b}, {clamp:?}", isa.name());
                }
            }
        }
        Ok(())
    }

    #[cfg(target_arch = "x86_64")]
    proptest! {
        /// Sixteen planes at once in the lanes give the polyphase kernel's outputs
        /// plane by plane (up to the sign of a zero), with per-axis strides, dilations
        /// and padding.
        #[test]
        fn lanes_depthwise_matches_polyphase(
            size in (1usize..17, 1usize..17, 1usize..6, 1usize..6),
            steps in (1usize..3, 1usize..3, 1usize..3, 1usize..3),
            pad in (0usize..3, 0usize..3),
            seed in 0u32..1000,
        ) {
            if let Some(g) = geometry(size, steps, pad, (2 * LANES_DEPTHWISE_PLANES, 1, 1)) {
                lanes_match_polyphase(&g, seed)?;
            }
        }
    }

    /// [`lanes_depthwise_matches_polyphase`] on MobileNetV2's small 3x3 layers (the
    /// unrolled 3x3 taps of stride 1 and 2) and a 5x5 one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn lanes_depthwise_matches_polyphase_on_small_layers() {
        let planes = 3 * LANES_DEPTHWISE_PLANES;
        for (size, kernel, stride) in [(7, 3, 1), (14, 3, 2), (14, 3, 1), (7, 5, 1), (9, 3, 2)] {
            let g = ConvGeometry::same_on_both_axes(
                (size, size),
                (kernel, kernel),
                (stride, kernel / 2),
                (planes, 1, 1),
            );
            lanes_match_polyphase(&g, 7).unwrap();
        }
    }

    /// [`LanesDepthwise`] on every instruction set that has it, against the polyphase
    /// kernel (fused) plane by plane: the same bits up to the sign of a zero.
    #[cfg(target_arch = "x86_64")]
    fn lanes_match_polyphase(g: &ConvGeometry, seed: u32) -> Result<(), TestCaseError> {
        let Some(&fma) = Isa::available().iter().find(|i| i.avx2().is_some()) else {
            return Ok(());
        };
        let planes = g.out_channels();
        let (in_px, out_px, taps) = (g.in_h * g.in_w, g.out_pixels(), g.kernel_h * g.kernel_w);
        let input = grid_values(planes * in_px, seed << 20);
        let filters: Vec<f32> = (0..planes * taps)
            .map(|t| ((t * 7 + seed as usize) % 17) as f32 / 8.0 - 1.0)
            .collect();
        let bias: Vec<f32> = (0..planes).map(|p| p as f32 / 16.0 - 0.5).collect();
        let one = ConvGeometry { groups: 1, ..*g };
        let plane = PlaneConv::polyphase_only(fma, &one, plane_scratch_len(&one));
        for &isa in Isa::available() {
            let Some(lanes) = LanesDepthwise::new(isa, g) else {
                continue;
            };
            for clamp in [None, Some((-0.5, 0.75))] {
                let mut scratch = vec![f32::NAN; lanes.scratch_len()];
                let mut got = vec![f32::NAN; planes * out_px];
                let operands = (&input[..], &filters[..], Some(&bias[..]));
                prop_assert!(lanes.run(operands, clamp, &mut got, &mut scratch));
                let mut scratch = vec![f32::NAN; plane_scratch_len(&one)];
                for p in 0..planes {
                    let mut want = vec![f32::NAN; out_px];
                    let x = &input[p * in_px..(p + 1) * in_px];
                    let w = &filters[p * taps..(p + 1) * taps];
                    prop_assert!(plane.run(x, w, (bias[p], clamp), &mut want, &mut scratch));
                    let got = &got[p * out_px..][..out_px];
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        let same = a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0);
                        prop_assert!(same, "{g:?} plane {p} output {i}: {a} vs {b}, {clamp:?}");
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn short_slices_are_refused() {
        let g = ConvGeometry::same_on_both_axes((3, 3), (3, 3), (1, 1), (1, 1, 1));
        let mut col = vec![0f32; 81];
        assert!(!im2col_nchw(&g, &[0.0; 8], 0..9, &mut col));
        assert!(!im2col_nchw(&g, &[0.0; 9], 0..10, &mut col));
        let plane = PlaneConv::new(&g, 0);
        assert!(!plane.run(&[0.0; 9], &[0.0; 8], (0.0, None), &mut [0.0; 9], &mut []));
        assert!(!col2im_add_nchw(&g, &[0.0; 80], &mut [0.0; 9]));
    }

    /// `conv_channels_in_lanes`'s sums in its order: products in filter-row order
    /// (input channel, then tap row, then tap column; a tap in the padding reads 0),
    /// fused, from 0; then the bias; then the clamp. `filter` is input-channel major.
    fn lanes_reference(
        g: &ConvGeometry,
        (input, filter): (&[f32], &[f32]),
        (bias, clamp): (Option<&[f32]>, Option<(f32, f32)>),
    ) -> Vec<f32> {
        let (c_in, c_out, px) = (g.in_channels(), g.out_channels(), g.out_pixels());
        let (kh, kw) = (g.kernel_h, g.kernel_w);
        let mut out = vec![0f32; c_out * px];
        for co in 0..c_out {
            for p in 0..px {
                let (oy, ox) = (p / g.out_w, p % g.out_w);
                let mut acc = 0f32;
                for ci in 0..c_in {
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let x = match (g.source_row(oy, ky), g.source_col(ox, kx)) {
                                (Some(y), Some(x)) => input[(ci * g.in_h + y) * g.in_w + x],
                                _ => 0.0,
                            };
                            let w = filter[((ci * kh + ky) * kw + kx) * c_out + co];
                            acc = x.mul_add(w, acc);
                        }
                    }
                }
                let v = acc + bias.map_or(0.0, |b| b[co]);
                out[co * px + p] = clamp.map_or(v, |c| crate::output_clamp(v, c));
            }
        }
        out
    }

    /// Geometries of one group for the channels-in-lanes kernel: planes up to 23x23
    /// (more than one band of tiles, and enough pixels to split them over threads),
    /// kernels up to 3x3 with stride, dilation and padding, depths of one block and of
    /// several.
    fn lanes_geometry() -> impl Strategy<Value = ConvGeometry> {
        (
            (1usize..24, 1usize..24, 1usize..4, 1usize..4),
            (1usize..3, 1usize..3, 1usize..3, 1usize..3),
            (0usize..3, 0usize..3, 1usize..20, 1usize..40),
        )
            .prop_filter_map("kernel fits", |(size, steps, (ph, pw, ci, co))| {
                geometry(size, steps, (ph, pw), (1, ci, co))
            })
    }

    proptest! {
        /// The channels-in-lanes kernel gives the reference's bits on every instruction
        /// set of this CPU that has it, over planes and channel counts that are and are
        /// not whole tiles and vectors, padded or read in place, on 1 to 3 threads
        /// (split by channels or by pixels), with and without bias and clamp.
        #[test]
        fn channels_in_lanes_matches_the_reference(
            g in lanes_geometry(),
            threads in 1usize..4,
            (with_bias, with_clamp) in (any::<bool>(), any::<bool>()),
            seed in 0u32..100,
        ) {
            let (c_in, c_out, px) = (g.in_channels(), g.out_channels(), g.out_pixels());
            let input = grid_values(c_in * g.in_h * g.in_w, seed);
            let filter = grid_values(g.patch_len() * c_out, seed + 1);
            let bias = grid_values(c_out, seed + 2);
            let bias = with_bias.then_some(&bias[..]);
            let clamp = with_clamp.then_some((-0.5f32, 0.75f32));
            let want = lanes_reference(&g, (&input, &filter), (bias, clamp));
            let pool = ThreadPool::new(threads).expect("a pool");
            let mut scratch = vec![f32::NAN; channels_in_lanes_scratch_len(&g, threads)];
            for &isa in Isa::available() {
                let mut out = vec![f32::NAN; c_out * px];
                let ran = conv_channels_in_lanes(
                    &pool, isa, &g, (&input, &filter), (bias, clamp), &mut out, &mut scratch,
                );
                prop_assert_eq!(ran, has_channels_in_lanes(isa));
                if ran {
                    prop_assert_eq!(&out, &want, "{}", isa.name());
                }
            }
        }
    }

    /// Slices shorter than the geometry says, too little scratch, and more than one
    /// group are refused, nothing written.
    #[test]
    fn channels_in_lanes_refuses_what_does_not_fit() {
        // 2 input channels of 3x3, a 3x3 kernel padded by 1: 3 output channels of 3x3.
        let g = ConvGeometry::same_on_both_axes((3, 3), (3, 3), (1, 1), (1, 2, 3));
        let pool = ThreadPool::serial();
        let isa = crate::dispatch().gemm;
        let need = channels_in_lanes_scratch_len(&g, 1);
        let mut scratch = vec![0f32; need];
        let mut out = [7.0f32; 27];
        for (input, filter, bias) in [
            (&[0f32; 17][..], &[0f32; 54][..], None),
            (&[0f32; 18][..], &[0f32; 53][..], None),
            (&[0f32; 18][..], &[0f32; 54][..], Some(&[0f32; 2][..])),
        ] {
            let operands = (input, filter);
            let ran = conv_channels_in_lanes(
                &pool,
                isa,
                &g,
                operands,
                (bias, None),
                &mut out,
                &mut scratch,
            );
            assert!(!ran);
        }
        let operands = (&[0.0; 18][..], &[0.0; 54][..]);
        let mut full = vec![0f32; need];
        let mut short = vec![0f32; need - 1];
        for (len, scratch) in [(27, &mut short), (26, &mut full)] {
            let ran = conv_channels_in_lanes(
                &pool,
                isa,
                &g,
                operands,
                (None, None),
                &mut out[..len],
                scratch,
            );
            assert!(!ran);
        }
        let mut scratch = full;
        let grouped = ConvGeometry {
            groups: 2,
            group_in: 1,
            ..g
        };
        assert!(!conv_channels_in_lanes(
            &pool,
            isa,
            &grouped,
            operands,
            (None, None),
            &mut out,
            &mut scratch
        ));
        assert_eq!(out, [7.0; 27]);
    }
}
