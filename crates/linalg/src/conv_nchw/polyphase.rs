//! The depthwise plane kernel over polyphase planes: every filter tap becomes one
//! contiguous stream, so the taps of a block of outputs accumulate in registers.
//!
//! With strides `(sh, sw)` the zero-padded input splits into `sh * sw` *phase planes*:
//! phase `(ry, rx)` holds padded pixel `(r * sh + ry, c * sw + rx)` at `(r, c)`. Tap
//! `(ky, kx)` of output `(oy, ox)` reads padded pixel `(oy * sh + ky * dh, ox * sw +
//! kx * dw)`: phase `((ky * dh) % sh, (kx * dw) % sw)` at row `oy + ky * dh / sh` and
//! column `ox + kx * dw / sw`. Laid out `pitch = out_w + (kw - 1) * dw / sw` columns
//! wide, each tap is then the phase plane read at a fixed offset from the flat index
//! `oy * pitch + ox`. The kernel computes every flat index of a band of output rows,
//! the `pitch - out_w` columns past the row's end included, and copies the rows out.
//!
//! Each output is the bias plus its taps in `(ky, kx)` order, as in the row kernel; the
//! padding taps add `0 * w`, which leaves the sum unchanged.

use crate::conv::ConvGeometry;
use crate::copy::copy_floats;

/// Outputs per register block: eight AVX2 vectors, enough independent sums to hide the
/// fused multiply-add latency.
const BLOCK: usize = 64;

/// Most taps (and phases) the kernel handles; larger filters use the row kernel.
pub(super) const MAX_TAPS: usize = 64;

/// Scratch the kernel prefers: room for a whole plane up to this many elements.
const PREFERRED_SCRATCH: usize = 32 * 1024;

/// The phase planes of one geometry: their width, reach and which phases a tap reads.
pub(super) struct Phases {
    /// Columns of a phase plane row (and of a flat output row).
    pub(super) pitch: usize,
    /// Extra phase rows below a band: `(kh - 1) * dh / sh`.
    pub(super) row_reach: usize,
    /// Extra columns read past the last flat index: `(kw - 1) * dw / sw`.
    col_reach: usize,
    /// The phases read, `(ry, rx)`, in slot order.
    pub(super) read: [(usize, usize); MAX_TAPS],
    /// How many phases are read.
    pub(super) used: usize,
}

impl Phases {
    /// The phases of `g`, or `None` when its kernel has more than [`MAX_TAPS`] taps.
    pub(super) fn new(g: &ConvGeometry) -> Option<Phases> {
        let (sh, sw) = (g.stride_h.max(1), g.stride_w.max(1));
        if g.kernel_h * g.kernel_w > MAX_TAPS {
            return None;
        }
        let mut read = [(0, 0); MAX_TAPS];
        let mut used = 0;
        for ky in 0..g.kernel_h {
            for kx in 0..g.kernel_w {
                let phase = ((ky * g.dilation_h) % sh, (kx * g.dilation_w) % sw);
                if !read[..used].contains(&phase) {
                    read[used] = phase;
                    used += 1;
                }
            }
        }
        Some(Phases {
            pitch: g.out_w + (g.kernel_w.saturating_sub(1) * g.dilation_w) / sw,
            row_reach: (g.kernel_h.saturating_sub(1) * g.dilation_h) / sh,
            col_reach: (g.kernel_w.saturating_sub(1) * g.dilation_w) / sw,
            read,
            used,
        })
    }

    /// Where phase `(ry, rx)` lies among the phases read.
    pub(super) fn slot(&self, phase: (usize, usize)) -> usize {
        self.read[..self.used]
            .iter()
            .position(|&p| p == phase)
            .unwrap_or(0)
    }

    /// Flat outputs computed for a band of `rows` output rows (whole blocks).
    fn flat(&self, rows: usize) -> usize {
        (rows * self.pitch).div_ceil(BLOCK) * BLOCK
    }

    /// Length of one phase plane for a band of `rows`: every element a block reads.
    fn phase_len(&self, rows: usize) -> usize {
        self.flat(rows) + self.row_reach * self.pitch + self.col_reach
    }

    /// Scratch a band of `rows` takes: the phase planes and the flat outputs (the sums
    /// of a convolution, the winning taps of max pooling).
    fn scratch_len(&self, rows: usize) -> usize {
        (self.used * self.phase_len(rows)) + self.flat(rows)
    }

    /// The most output rows (up to `out_h`) whose band fits `scratch` elements.
    fn band_rows(&self, out_h: usize, scratch: usize) -> usize {
        let mut rows = out_h;
        if self.scratch_len(rows) > scratch {
            // Each row costs `pitch` per phase plane and in the flat outputs.
            let fixed = self.scratch_len(0) + (self.used + 1) * BLOCK;
            rows = scratch.saturating_sub(fixed) / ((self.used + 1) * self.pitch).max(1);
        }
        while rows > 0 && self.scratch_len(rows) > scratch {
            rows -= 1;
        }
        rows
    }
}

/// Scratch elements a [`Plan`] runs best with for `g`: a whole plane's phase planes and
/// outputs, up to 128 KiB.
pub(super) fn preferred_scratch_len(g: &ConvGeometry) -> usize {
    Phases::new(g).map_or(0, |p| p.scratch_len(g.out_h).min(PREFERRED_SCRATCH))
}

/// The polyphase kernel prepared for one geometry and scratch size: the band height and
/// every tap's offset into the band's phase planes.
pub(super) struct Plan {
    phases: Phases,
    /// Output rows per band (the last band may have fewer).
    band: usize,
    phase_len: usize,
    /// Per tap, in `(ky, kx)` order: its offset into the phase planes and its index into
    /// the filter.
    taps: [(usize, usize); MAX_TAPS],
    /// Per tap, in the same order: `(ky * dh, kx * dw)`, how far it reaches from the
    /// window's first padded pixel.
    reach: [(usize, usize); MAX_TAPS],
    n_taps: usize,
}

impl Plan {
    /// The plan for `g` with `scratch` elements of scratch, or `None` when the geometry
    /// has too many taps or not even one output row fits (the caller's kernel without
    /// scratch then runs).
    pub(super) fn new(g: &ConvGeometry, scratch: usize) -> Option<Plan> {
        let phases = Phases::new(g)?;
        let band = phases.band_rows(g.out_h, scratch);
        if band == 0 {
            return None;
        }
        let phase_len = phases.phase_len(band);
        let (sh, sw) = (g.stride_h.max(1), g.stride_w.max(1));
        let mut taps = [(0, 0); MAX_TAPS];
        let mut reach = [(0, 0); MAX_TAPS];
        let mut n_taps = 0;
        for ky in 0..g.kernel_h {
            for kx in 0..g.kernel_w {
                let (dy, dx) = (ky * g.dilation_h, kx * g.dilation_w);
                let slot = phases.slot((dy % sh, dx % sw));
                let offset = slot * phase_len + (dy / sh) * phases.pitch + dx / sw;
                taps[n_taps] = (offset, ky * g.kernel_w + kx);
                reach[n_taps] = (dy, dx);
                n_taps += 1;
            }
        }
        Some(Plan {
            phases,
            band,
            phase_len,
            taps,
            reach,
            n_taps,
        })
    }

    /// Writes one output plane, a band of rows at a time in `scratch` (at least the
    /// length the plan was made for). Slice lengths are the caller's to check.
    #[inline(always)]
    pub(super) fn run<const FUSED: bool>(
        &self,
        g: &ConvGeometry,
        input: &[f32],
        filter: &[f32],
        bias: f32,
        output: &mut [f32],
        scratch: &mut [f32],
    ) {
        let mut weights = [0f32; MAX_TAPS];
        for (w, &(_, k)) in weights.iter_mut().zip(&self.taps[..self.n_taps]) {
            *w = filter[k];
        }
        let mut oy0 = 0;
        while oy0 < g.out_h {
            let rows = self.band.min(g.out_h - oy0);
            self.band_of_rows::<FUSED>(g, input, &weights, bias, oy0, rows, output, scratch);
            oy0 += rows;
        }
    }

    /// Output rows `oy0..oy0 + rows`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn band_of_rows<const FUSED: bool>(
        &self,
        g: &ConvGeometry,
        input: &[f32],
        weights: &[f32; MAX_TAPS],
        bias: f32,
        oy0: usize,
        rows: usize,
        output: &mut [f32],
        scratch: &mut [f32],
    ) {
        let ph = &self.phases;
        let flat = ph.flat(rows);
        let (planes, flat_out) = scratch.split_at_mut(ph.used * self.phase_len);
        let flat_out = &mut flat_out[..flat];
        for (s, &(ry, rx)) in ph.read[..ph.used].iter().enumerate() {
            let dst = &mut planes[s * self.phase_len..(s + 1) * self.phase_len];
            fill_phase(g, ph, input, oy0, rows, (ry, rx), 0.0, dst);
        }
        let taps = &self.taps[..self.n_taps];
        for (q, out) in flat_out.chunks_exact_mut(BLOCK).enumerate() {
            let q = q * BLOCK;
            let mut acc = [bias; BLOCK];
            for (&(offset, _), &w) in taps.iter().zip(weights) {
                // In bounds: `phase_len` covers the furthest tap of the last block.
                for (a, &x) in acc.iter_mut().zip(&planes[offset + q..][..BLOCK]) {
                    *a = super::madd::<FUSED>(x, w, *a);
                }
            }
            out.copy_from_slice(&acc);
        }
        let ow = g.out_w;
        for r in 0..rows {
            let oy = oy0 + r;
            copy_floats(
                &mut output[oy * ow..(oy + 1) * ow],
                &flat_out[r * ph.pitch..][..ow],
            );
        }
    }
}

/// [`fill_phase`] of a whole plane (`g.out_h` rows from row 0), compiled for `isa`:
/// with AVX-512 a stride-2 row's de-interleave runs in 16-lane shuffles.
pub(super) fn fill_phase_plane(
    isa: crate::Isa,
    (g, ph): (&ConvGeometry, &Phases),
    input: &[f32],
    phase: (usize, usize),
    dst: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512().is_some() {
        #[target_feature(enable = "avx512f")]
        unsafe fn wide(
            g: &ConvGeometry,
            ph: &Phases,
            input: &[f32],
            phase: (usize, usize),
            dst: &mut [f32],
        ) {
            fill_phase(g, ph, input, 0, g.out_h, phase, 0.0, dst)
        }
        // SAFETY: the `CpuSupport` token behind `avx512()` proves AVX-512 F was
        // detected; `wide` is safe code compiled with those instructions.
        unsafe { wide(g, ph, input, phase, dst) };
        return;
    }
    let _ = isa;
    fill_phase(g, ph, input, 0, g.out_h, phase, 0.0, dst)
}

/// Writes phase `(ry, rx)` of the band starting at output row `oy0` into `dst`: phase
/// rows `oy0..oy0 + rows + row_reach`, `pad` wherever the padded pixel lies outside the
/// input and to the end.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn fill_phase(
    g: &ConvGeometry,
    ph: &Phases,
    input: &[f32],
    oy0: usize,
    rows: usize,
    (ry, rx): (usize, usize),
    pad: f32,
    dst: &mut [f32],
) {
    let (sh, sw) = (g.stride_h.max(1), g.stride_w.max(1));
    let (ih, iw, pitch) = (g.in_h, g.in_w, ph.pitch);
    // Phase columns whose padded column `c * sw + rx` is inside the input.
    let first = g.pad_left.saturating_sub(rx).div_ceil(sw).min(pitch);
    let end = (g.pad_left + iw)
        .saturating_sub(rx)
        .div_ceil(sw)
        .clamp(first, pitch);
    // Each row's inside copied and its padding filled (every value written once); the
    // rows past the band's, and rows wholly above or below the input, are padding.
    let filled = ((rows + ph.row_reach) * pitch).min(dst.len() / pitch.max(1) * pitch);
    let (band, rest) = dst.split_at_mut(filled);
    rest.fill(pad);
    // `c * sw + rx - pad_left` for `c` in `first..end`.
    let x0 = (first * sw + rx).saturating_sub(g.pad_left);
    for (r, row) in band.chunks_exact_mut(pitch).enumerate() {
        let padded = (oy0 + r) * sh + ry;
        let inside = padded.checked_sub(g.pad_top).filter(|&iy| iy < ih);
        let Some(iy) = inside.filter(|_| first < end) else {
            row.fill(pad);
            continue;
        };
        let (left, row) = row.split_at_mut(first);
        let (row, right) = row.split_at_mut(end - first);
        left.fill(pad);
        right.fill(pad);
        let (dst, src) = (row, &input[iy * iw + x0..(iy + 1) * iw]);
        match sw {
            1 => copy_floats(dst, src),
            // Pairs, so the loop vectorises into shuffles; an odd tail element last.
            2 => {
                let pairs = src.chunks_exact(2);
                let tail = pairs.remainder().first().copied();
                let n = pairs.len();
                for (d, p) in dst.iter_mut().zip(pairs) {
                    *d = p[0];
                }
                if let (Some(d), Some(t)) = (dst.get_mut(n), tail) {
                    *d = t;
                }
            }
            _ => {
                for (d, &s) in dst.iter_mut().zip(src.iter().step_by(sw)) {
                    *d = s;
                }
            }
        }
    }
}

impl Plan {
    /// Max pooling of one plane over the same windows: for each output, the flat input
    /// index `iy * in_w + ix` of its window's largest tap, the first of equal maxima
    /// (taps in `(ky, kx)` order). Returns `false`, having written nothing useful, when
    /// the plane holds a NaN or a window has no tap above `-inf`: the caller's scalar
    /// kernel then decides those windows its own way.
    #[inline(always)]
    pub(super) fn run_max(
        &self,
        g: &ConvGeometry,
        input: &[f32],
        indices: &mut [i64],
        scratch: &mut [f32],
    ) -> bool {
        if has_nan(&input[..g.in_h * g.in_w]) {
            return false;
        }
        let mut oy0 = 0;
        while oy0 < g.out_h {
            let rows = self.band.min(g.out_h - oy0);
            if !self.max_band(g, input, oy0, rows, indices, scratch) {
                return false;
            }
            oy0 += rows;
        }
        true
    }

    /// Output rows `oy0..oy0 + rows` of [`Plan::run_max`].
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn max_band(
        &self,
        g: &ConvGeometry,
        input: &[f32],
        oy0: usize,
        rows: usize,
        indices: &mut [i64],
        scratch: &mut [f32],
    ) -> bool {
        let ph = &self.phases;
        let flat = ph.flat(rows);
        let (planes, rest) = scratch.split_at_mut(ph.used * self.phase_len);
        let tap_out = &mut rest[..flat];
        for (s, &phase) in ph.read[..ph.used].iter().enumerate() {
            let dst = &mut planes[s * self.phase_len..(s + 1) * self.phase_len];
            fill_phase(g, ph, input, oy0, rows, phase, f32::NEG_INFINITY, dst);
        }
        let taps = &self.taps[..self.n_taps];
        for (q, tap_o) in tap_out.chunks_exact_mut(BLOCK).enumerate() {
            let q = q * BLOCK;
            let mut best = [f32::NEG_INFINITY; BLOCK];
            // The winning tap, as an f32 (exact for these small integers); -1: none.
            let mut from = [-1f32; BLOCK];
            for (t, &(offset, _)) in taps.iter().enumerate() {
                let t = t as f32;
                for ((b, f), &x) in best
                    .iter_mut()
                    .zip(&mut from)
                    .zip(&planes[offset + q..][..BLOCK])
                {
                    let above = x > *b;
                    *b = if above { x } else { *b };
                    *f = if above { t } else { *f };
                }
            }
            tap_o.copy_from_slice(&from);
        }
        let ow = g.out_w;
        for r in 0..rows {
            let oy = oy0 + r;
            let row_taps = &tap_out[r * ph.pitch..][..ow];
            for (ox, (i, &t)) in indices[oy * ow..(oy + 1) * ow]
                .iter_mut()
                .zip(row_taps)
                .enumerate()
            {
                let Some(&(dy, dx)) = (t >= 0.0).then(|| self.reach.get(t as usize)).flatten()
                else {
                    return false;
                };
                // Inside the input: only a real value beats -inf.
                let iy = oy * g.stride_h + dy - g.pad_top;
                let ix = ox * g.stride_w + dx - g.pad_left;
                *i = (iy * g.in_w + ix) as i64;
            }
        }
        true
    }
}

/// True when `values` holds a NaN (tested in blocks with no early exit inside, so that
/// the test vectorises).
#[inline(always)]
fn has_nan(values: &[f32]) -> bool {
    values
        .chunks(256)
        .any(|block| block.iter().fold(false, |nan, v| nan | v.is_nan()))
}
