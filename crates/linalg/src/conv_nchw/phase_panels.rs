//! The im2col panels of a convolution packed from *phase planes* (see
//! [`super::polyphase`]): with the zero-padded image split by stride phase, every tap
//! `(ky, kx)` of output `(oy, ox)` reads one phase plane at `oy * pitch + ox` plus a
//! fixed offset. So a block of im2col columns is a list of short contiguous copies
//! (split where output rows and panels end), planned once and replayed for every row
//! of K from that row's tap; no padding or stride is tested per value.
//!
//! A convolution with stride 1 and no padding reads its own planes this way (the
//! plane is its only phase, `pitch = in_w`); any other takes a copy split into phase
//! planes ([`Im2col::phase_split`]), one pass over its image.

use super::polyphase::{MAX_TAPS, Phases, fill_phase_plane};
use super::{Im2col, TapIndex};
use crate::conv::ConvGeometry;
use crate::copy::copy_floats;
use crate::threadpool::{GRAIN_SIZE, ThreadPool};

/// Where the taps of one input channel lie in an image of phase planes.
#[derive(Clone, Copy)]
pub(super) struct PhaseLayout {
    /// Elements from one input channel's planes to the next.
    channel_len: usize,
    /// Elements from one output row to the next in a phase plane.
    pitch: usize,
    /// Offset of each tap, in `(ky, kx)` order, from its channel's first value.
    taps: [usize; MAX_TAPS],
}

impl PhaseLayout {
    /// The layout of planes read as they are: stride 1, no padding, every tap inside
    /// the image. `None` for any other geometry.
    pub(super) fn in_place(g: &ConvGeometry) -> Option<PhaseLayout> {
        let reads_inside = g.pad_top == 0
            && g.pad_left == 0
            && g.stride_h == 1
            && g.stride_w == 1
            && g.out_h + g.kernel_h.saturating_sub(1) * g.dilation_h <= g.in_h
            && g.out_w + g.kernel_w.saturating_sub(1) * g.dilation_w <= g.in_w;
        if !reads_inside || g.kernel_h * g.kernel_w > MAX_TAPS {
            return None;
        }
        let mut taps = [0; MAX_TAPS];
        for ky in 0..g.kernel_h {
            for kx in 0..g.kernel_w {
                taps[ky * g.kernel_w + kx] = ky * g.dilation_h * g.in_w + kx * g.dilation_w;
            }
        }
        Some(PhaseLayout {
            channel_len: g.in_h * g.in_w,
            pitch: g.in_w,
            taps,
        })
    }

    /// Where im2col row `tap` (input channel, kernel row and column) of output pixel
    /// `(oy, ox)` lies: at this offset plus `oy * pitch + ox`.
    pub(super) fn tap_offset(&self, g: &ConvGeometry, TapIndex { ci, ky, kx }: TapIndex) -> usize {
        ci * self.channel_len + self.taps[ky * g.kernel_w + kx]
    }

    /// Elements from one output row to the next in a phase plane.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn pitch(&self) -> usize {
        self.pitch
    }

    /// True when `len` elements hold every phase plane of the group.
    pub(super) fn fits(&self, g: &ConvGeometry, len: usize) -> bool {
        g.group_in
            .checked_mul(self.channel_len)
            .is_some_and(|need| need <= len)
    }

    /// The layout [`Im2col::phase_split`] writes for `g`, with the length of one phase
    /// plane. `None` when the kernel has more than [`MAX_TAPS`] taps.
    fn split(g: &ConvGeometry) -> Option<(PhaseLayout, Phases, usize)> {
        let phases = Phases::new(g)?;
        let phase_len = (g.out_h + phases.row_reach) * phases.pitch;
        let (sh, sw) = (g.stride_h.max(1), g.stride_w.max(1));
        let mut taps = [0; MAX_TAPS];
        for ky in 0..g.kernel_h {
            for kx in 0..g.kernel_w {
                let (dy, dx) = (ky * g.dilation_h, kx * g.dilation_w);
                let slot = phases.slot((dy % sh, dx % sw));
                taps[ky * g.kernel_w + kx] = slot * phase_len + (dy / sh) * phases.pitch + dx / sw;
            }
        }
        let layout = PhaseLayout {
            channel_len: phases.used * phase_len,
            pitch: phases.pitch,
            taps,
        };
        Some((layout, phases, phase_len))
    }
}

impl<'a> Im2col<'a> {
    /// Elements of the phase planes [`Im2col::phase_split`] writes for one group of
    /// `g`: 0 when the convolution reads its own planes (stride 1, no padding) or has
    /// more than 64 taps.
    pub fn phase_split_len(g: &ConvGeometry) -> usize {
        if PhaseLayout::in_place(g).is_some() {
            return 0;
        }
        PhaseLayout::split(g).map_or(0, |(layout, _, _)| g.group_in * layout.channel_len)
    }

    /// One group's `[group_in, in_h, in_w]` planes as the im2col operand of `g`, split
    /// into zero-padded phase planes in `scratch` (at least
    /// [`Im2col::phase_split_len`] elements) unless the convolution reads the planes as
    /// they are, the phase planes written in parallel on `pool`. `None` when `planes`
    /// or `scratch` is shorter than that.
    pub fn phase_split(
        pool: &ThreadPool,
        g: &ConvGeometry,
        planes: &'a [f32],
        scratch: &'a mut [f32],
    ) -> Option<Im2col<'a>> {
        let image = Im2col::new(*g, planes);
        let plane = g.in_h * g.in_w;
        if !image.fits() {
            return None;
        }
        if image.layout.is_some() || plane == 0 {
            return Some(image);
        }
        let Some((layout, phases, phase_len)) = PhaseLayout::split(g) else {
            return Some(image);
        };
        let dst = scratch.get_mut(..g.group_in * layout.channel_len)?;
        // Phase plane `i` is phase `i % used` of channel `i / used`.
        let isa = crate::dispatch().gemm;
        let fill = |i: usize, phase: &mut [f32]| {
            let (channel, (ry, rx)) = (i / phases.used, phases.read[i % phases.used]);
            let src = &planes[channel * plane..(channel + 1) * plane];
            fill_phase_plane(isa, (g, &phases), src, (ry, rx), phase);
        };
        let min_planes = (GRAIN_SIZE / phase_len.max(1)).max(1);
        pool.for_each_chunk_mut(dst, phase_len.max(1), min_planes, fill);
        Some(Im2col {
            geometry: *g,
            planes: dst,
            layout: Some(layout),
        })
    }
}

/// One copy of a packing plan: `len` columns from offset `src` (relative to the tap's
/// first value) to offset `dst` (relative to the step's first value in the panels).
#[derive(Clone, Copy, Default)]
struct Piece {
    dst: usize,
    src: usize,
    len: usize,
}

/// Copies planned at once (a block of columns is planned in several rounds when its
/// output rows are short).
const PIECES: usize = 64;

/// The operands of one packing: the image and its layout, the panel width, the rows
/// `(k0, kc)` and columns `(c0, nb)` of the block, and the panels.
type Packing<'i, 'd> = (
    &'i Im2col<'i>,
    &'i PhaseLayout,
    usize,
    (usize, usize),
    (usize, usize),
    &'d mut [f32],
);

/// [`Im2col::pack_panels`] over phase planes laid out as `layout`, compiled for
/// `isa`'s vectors: with AVX2 or AVX-512 a piece of a panel (at most two vectors) is
/// two masked vector moves, with no loop or length test.
pub(super) fn pack_from_phases(isa: crate::Isa, packing: Packing<'_, '_>) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::simd_x86::{Narrow, Wide};
        #[target_feature(enable = "avx512f,avx2")]
        unsafe fn wide(packing: Packing<'_, '_>) {
            // SAFETY: this function's instructions are the vectors' (its caller's
            // promise).
            pack(packing, |step, tap, pieces| unsafe {
                copy_pieces_simd::<Wide>(step, tap, pieces)
            })
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(packing: Packing<'_, '_>) {
            // SAFETY: this function's instructions are the vectors' (its caller's
            // promise).
            pack(packing, |step, tap, pieces| unsafe {
                copy_pieces_simd::<Narrow>(step, tap, pieces)
            })
        }
        if isa.avx512().is_some() {
            // SAFETY: the `CpuSupport` token behind `avx512()` proves AVX-512 F (and
            // AVX2) were detected on this CPU.
            unsafe { wide(packing) };
            return;
        }
        if isa.avx2().is_some() {
            // SAFETY: the `CpuSupport` token behind `avx2()` proves AVX2 and FMA were
            // detected.
            unsafe { avx2(packing) };
            return;
        }
    }
    let _ = isa;
    pack(packing, copy_pieces)
}

/// Copies `pieces` of one row of K: each from `tap` at `src` to `step` at `dst`.
fn copy_pieces(step: &mut [f32], tap: &[f32], pieces: &[Piece]) {
    for p in pieces {
        copy_floats(&mut step[p.dst..p.dst + p.len], &tap[p.src..p.src + p.len]);
    }
}

/// [`copy_pieces`] with `V`'s vectors: a piece of at most two vectors (every piece of a
/// panel `2 * LANES` wide) is two masked loads and stores; a longer one, or pieces that
/// would reach past either slice, go through [`copy_pieces`].
///
/// # Safety
/// The CPU has `V`'s instructions.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn copy_pieces_simd<V: crate::simd_x86::Vector>(
    step: &mut [f32],
    tap: &[f32],
    pieces: &[Piece],
) {
    let n = V::LANES;
    let fits = pieces
        .iter()
        .all(|p| p.len <= 2 * n && p.dst + p.len <= step.len() && p.src + p.len <= tap.len());
    if !fits {
        copy_pieces(step, tap, pieces);
        return;
    }
    let (dst, src) = (step.as_mut_ptr(), tap.as_ptr());
    for p in pieces {
        let (first, second) = (p.len.min(n), p.len.saturating_sub(n));
        // SAFETY: the CPU has V's instructions (the caller's promise); the piece's
        // `len` values from `src` and to `dst` lie inside `tap` and `step` (checked
        // above), and the masked moves touch only those.
        unsafe {
            V::load_first(src.add(p.src), first).store_first(dst.add(p.dst), first);
            if second > 0 {
                V::load_first(src.add(p.src + n), second).store_first(dst.add(p.dst + n), second);
            }
        }
    }
}

/// [`pack_from_phases`] for whichever vectors it is compiled with, each row of K's
/// pieces copied by `copy`.
#[inline(always)]
fn pack(
    (image, layout, nr, (k0, kc), (c0, nb), dst): Packing<'_, '_>,
    copy: impl Fn(&mut [f32], &[f32], &[Piece]),
) {
    let g = &image.geometry;
    let ow = g.out_w;
    let panel_len = kc * nr;
    let mut pieces = [Piece::default(); PIECES];
    let mut col = 0;
    while col < nb {
        // Plan: the columns split where output rows and panels end.
        let mut count = 0;
        let (mut oy, mut ox) = ((c0 + col) / ow, (c0 + col) % ow);
        while col < nb && count < PIECES {
            let c = col % nr;
            let len = (nr - c).min(ow - ox).min(nb - col);
            pieces[count] = Piece {
                dst: (col / nr) * panel_len + c,
                src: oy * layout.pitch + ox,
                len,
            };
            count += 1;
            col += len;
            ox += len;
            if ox == ow {
                (oy, ox) = (oy + 1, 0);
            }
        }
        // Replay it for every row of K, each from its own tap.
        let mut index = TapIndex::of(g, k0);
        for kk in 0..kc {
            let tap = &image.planes[layout.tap_offset(g, index)..];
            index = index.next(g);
            copy(&mut dst[kk * nr..], tap, &pieces[..count]);
        }
    }
    // The last panel's columns past `nb` are zero.
    let tail = nb % nr;
    if tail != 0 {
        let last = &mut dst[(nb / nr) * panel_len..][..panel_len];
        for step in last.chunks_exact_mut(nr) {
            step[tail..].fill(0.0);
        }
    }
}
