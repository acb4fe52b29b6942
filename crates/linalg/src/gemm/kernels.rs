//! Inner kernels of the matrix products: the GEMM micro-kernel over packed panels and
//! the dot-product rows of the matrix-vector path.
//!
//! Each kernel has a safe scalar version (written lane-wise so compilers vectorise
//! it) and a SIMD version per instruction set, chosen through [`Isa`]: AVX-512 and
//! AVX2+FMA on x86-64, NEON on aarch64. Tests compare every version the CPU supports
//! with the scalar one.

use half::{bf16, f16};

use etch_memory::ColumnBlock;
#[cfg(test)]
use etch_memory::ColumnBlocks;

use crate::Isa;

/// Shape of one micro-kernel tile: `mr` rows of A against `nr` columns of B.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tile {
    pub mr: usize,
    pub nr: usize,
}

/// The tile of the AVX2, NEON and scalar kernels: 6 x 16.
const TILE_6X16: Tile = Tile { mr: 6, nr: 16 };
/// Rows of the AVX-512 tile (its columns are two 16-lane registers).
#[cfg(target_arch = "x86_64")]
pub(crate) const AVX512_MR: usize = 8;
/// The AVX-512 tile.
#[cfg(target_arch = "x86_64")]
const TILE_AVX512: Tile = Tile {
    mr: AVX512_MR,
    nr: 32,
};
/// Elements of the largest tile of any instruction set.
pub(crate) const MAX_TILE: usize = MAX_MR * MAX_NR;
/// Columns of the widest tile of any instruction set.
pub(crate) const MAX_NR: usize = 32;

impl Tile {
    /// The tile the micro-kernel of `isa` computes.
    pub(crate) fn of(isa: Isa) -> Tile {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(_) | Isa::Avx512Vnni(_) => TILE_AVX512,
            _ => TILE_6X16,
        }
    }
}

/// Rows of the tallest tile of any instruction set.
pub(crate) const MAX_MR: usize = 8;

/// What a micro-kernel applies to its tile as it stores it, after any accumulation:
/// `output_clamp((v + row_add[r]) + col_add[j], (lo, hi))`. A GEMM's finish when it
/// is a bias per row (a convolution's) or per column (a linear layer's) and a clamp.
/// `-0.0` adds nothing (`x + -0.0 == x`, signed zeros included) and `(-inf, inf)`
/// clamps nothing, so one form covers every such finish.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TilePost {
    /// Added to every value of row `r`.
    pub row_add: [f32; MAX_MR],
    /// Added to every value of column `j`.
    pub col_add: [f32; MAX_NR],
    /// Lower bound.
    pub lo: f32,
    /// Upper bound.
    pub hi: f32,
}

impl TilePost {
    /// Adds nothing and clamps nothing.
    pub(crate) const NONE: TilePost = TilePost {
        row_add: [-0.0; MAX_MR],
        col_add: [-0.0; MAX_NR],
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
    };

    /// `v` of row `r`, column `j`, finished.
    #[inline]
    pub(crate) fn apply(&self, r: usize, j: usize, v: f32) -> f32 {
        crate::gemm::output_clamp((v + self.row_add[r]) + self.col_add[j], (self.lo, self.hi))
    }
}

/// A SIMD micro-kernel: `(kc, (a, lda), (b, ldb), (c, ldc, cols), accumulate, post)`,
/// see [`micro_kernel`]; it stores the first `cols` columns of its tile.
pub(crate) type SimdKernel = unsafe fn(
    usize,
    (*const f32, usize),
    (*const f32, usize),
    (*mut f32, usize, usize),
    bool,
    Option<&TilePost>,
);

/// Asks the cache for the cache lines of `len` floats from `at` (a hint: it reads
/// nothing and faults on no address). Nothing where the target has no such hint here.
#[inline]
fn prefetch_floats(at: *const f32, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..len).step_by(16) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch reads nothing and faults on no address; SSE, which it
        // needs, is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, len);
}

/// The A operand of one micro-kernel call: a packed panel (step `k`, row `r` at
/// `k*mr + r`) or `mr` rows of a row-major f32 matrix read in place (row `r`, step `k`
/// at `r*lda + k`).
#[derive(Clone, Copy)]
pub(crate) enum APanel<'a> {
    /// A panel packed by the GEMM.
    Packed(&'a [f32]),
    /// Rows read in place, `lda` (> 0) apart.
    Rows(&'a [f32], usize),
}

impl<'a> APanel<'a> {
    /// The values the kernel reads over `kc` steps of `mr` rows, and (for the kernel)
    /// their address and the stride of the rows (0: packed).
    ///
    /// # Panics
    /// When the panel holds fewer values than `kc` steps need.
    #[inline]
    fn steps(self, mr: usize, kc: usize) -> (APanel<'a>, (*const f32, usize)) {
        let a = match self {
            APanel::Packed(p) => APanel::Packed(&p[..kc * mr]),
            APanel::Rows(r, lda) => {
                assert!(lda > 0, "rows of A read in place need a row stride");
                APanel::Rows(&r[..(mr - 1) * lda + kc], lda)
            }
        };
        match a {
            APanel::Packed(p) => (a, (p.as_ptr(), 0)),
            APanel::Rows(r, lda) => (a, (r.as_ptr(), lda)),
        }
    }

    /// Asks the cache for the values the kernel will read over `kc` steps of `mr` rows
    /// (a hint, which reads nothing): a panel of weights read in place comes from
    /// outside the core's caches on its first tile, as `mr` strided streams that the
    /// hardware prefetchers pick up late.
    #[inline]
    pub(crate) fn prefetch(&self, mr: usize, kc: usize) {
        match *self {
            APanel::Packed(p) => prefetch_floats(p.as_ptr(), (kc * mr).min(p.len())),
            APanel::Rows(a, lda) => {
                for r in 0..mr {
                    let row = a.get(r * lda..).unwrap_or(&[]);
                    prefetch_floats(row.as_ptr(), kc.min(row.len()));
                }
            }
        }
    }

    /// A's value for row `r` at step `k`.
    #[inline]
    fn at(&self, mr: usize, r: usize, k: usize) -> f32 {
        match *self {
            APanel::Packed(a) => a[k * mr + r],
            APanel::Rows(a, lda) => a[r * lda + k],
        }
    }
}

/// The B operand of one micro-kernel call: a packed panel (step `k`, column `j` at
/// `k*nr + j`) or `nr` columns of a row-major f32 matrix read in place (step `k`,
/// column `j` at `k*ldb + j`).
#[derive(Clone, Copy)]
pub(crate) enum BPanel<'a> {
    /// A panel packed by the GEMM.
    Packed(&'a [f32]),
    /// Rows read in place, `ldb` (>= `nr`) apart.
    Rows(&'a [f32], usize),
}

impl<'a> BPanel<'a> {
    /// The values the kernel reads over `kc` steps and the distance between two steps.
    ///
    /// # Panics
    /// When the panel holds fewer values than `kc` steps need.
    #[inline]
    fn steps(self, nr: usize, kc: usize) -> (&'a [f32], usize) {
        match self {
            BPanel::Packed(b) => (&b[..kc * nr], nr),
            BPanel::Rows(b, ldb) => {
                assert!(
                    ldb >= nr,
                    "rows of B read in place are at least a panel wide"
                );
                (
                    &b[..kc.checked_sub(1).map_or(0, |last| last * ldb + nr)],
                    ldb,
                )
            }
        }
    }
}

/// The SIMD micro-kernel of `isa` for a tile of `cols` columns, if it has one: on x86-64
/// a tile of at most one vector of columns (the last of a row whose width is not a
/// multiple of the tile's) has a kernel of its own that multiplies only B's first
/// vector, half the work for the same values.
fn simd_kernel(isa: Isa, cols: usize) -> Option<SimdKernel> {
    // (NEON has one kernel for every width.)
    #[cfg(not(target_arch = "x86_64"))]
    let _ = cols;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(_) if cols <= 8 => Some(super::avx2::kernel_one_vector),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(_) => Some(super::avx2::kernel),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(_) | Isa::Avx512Vnni(_) if cols <= 16 => Some(super::avx512::kernel_one_vector),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(_) | Isa::Avx512Vnni(_) => Some(super::avx512::kernel),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon(_) | Isa::NeonDot(_) => Some(super::neon::kernel_6x16),
        Isa::Scalar => None,
    }
}

/// `tile[mr x nr] (+)= A_panel · B_panel` over `kc` steps, with the tile of `isa`;
/// `a` holds `kc` steps of `mr` rows, `b` `kc` steps of `nr` columns. Writes the
/// `rows x cols` corner of the tile to `out` at `(row, col)` of the block, adding to
/// what is there when `accumulate`, then applying `post` when given.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn micro_kernel(
    isa: Isa,
    kc: usize,
    a: APanel<'_>,
    b: BPanel<'_>,
    out: &mut ColumnBlock<'_, f32>,
    (row, col): (usize, usize),
    (rows, cols): (usize, usize),
    (accumulate, post): (bool, Option<&TilePost>),
) {
    let t = Tile::of(isa);
    let (a, (a_ptr, lda)) = a.steps(t.mr, kc);
    let (b, ldb) = b.steps(t.nr, kc);
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(rows <= t.mr && cols <= t.nr);
    if let Some(kernel) = simd_kernel(isa, cols)
        && rows == t.mr
    {
        let ld = out.ld();
        let c = out.window_ptr((row, col), (rows, cols));
        let c = c.unwrap_or_else(|| panic!("tile at ({row}, {col}) outside its block"));
        let c = (c, ld, cols);
        // SAFETY: the Isa variant carries the proof that its instructions exist on this
        // CPU; a holds kc*mr values (packed) or (mr-1)*lda + kc (rows), b (kc-1)*ldb + nr
        // (both sliced so above), and the block has an mr x cols window at c with row
        // stride ld (window_ptr checked it).
        unsafe { kernel(kc, (a_ptr, lda), (b.as_ptr(), ldb), c, accumulate, post) };
        return;
    }
    let mut tile = [0f32; MAX_TILE];
    match simd_kernel(isa, t.nr) {
        // SAFETY: as above, with the local tile (row stride nr) as c.
        Some(kernel) => unsafe {
            kernel(
                kc,
                (a_ptr, lda),
                (b.as_ptr(), ldb),
                (tile.as_mut_ptr(), t.nr, t.nr),
                false,
                None,
            )
        },
        None => kernel_scalar(kc, t, a, (b, ldb), &mut tile),
    }
    for (r, src) in tile.chunks_exact(t.nr).take(rows).enumerate() {
        let dst = &mut out.row_mut(row + r)[col..col + cols];
        for (j, (d, &s)) in dst.iter_mut().zip(src).enumerate() {
            let v = if accumulate { *d + s } else { s };
            *d = post.map_or(v, |p| p.apply(r, j, v));
        }
    }
}

/// A SIMD row-of-tiles kernel: `(kc, (a, lda), (b, ldb, b_step), (c, ldc), panels,
/// accumulate, post)`, see [`micro_kernel_row`].
pub(crate) type SimdKernelRow = unsafe fn(
    usize,
    (*const f32, usize),
    (*const f32, usize, usize),
    (*mut f32, usize),
    usize,
    bool,
    Option<&TilePost>,
);

/// The row-of-tiles kernel of `isa`, if it has one (x86-64).
fn simd_kernel_row(isa: Isa) -> Option<SimdKernelRow> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(_) => Some(super::avx2::kernel_row),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(_) | Isa::Avx512Vnni(_) => Some(super::avx512::kernel_row),
        _ => None,
    }
}

/// The B operand of [`micro_kernel_row`]: whole panels side by side, panel `q`'s step
/// `k` at `q * step + k * ldb` of `values` (packed panels: `ldb` the tile's width and
/// `step` `kc` times it; rows read in place: `ldb` their stride, `step` the width).
#[derive(Clone, Copy)]
pub(crate) struct BPanels<'a> {
    pub values: &'a [f32],
    pub ldb: usize,
    pub step: usize,
}

impl<'a> BPanels<'a> {
    /// Panel `q`, as one micro-kernel call reads it.
    fn panel(self, q: usize) -> BPanel<'a> {
        BPanel::Rows(&self.values[q * self.step..], self.ldb)
    }
}

/// [`micro_kernel`] of `panels` whole tiles side by side: rows `row..row + mr` and
/// columns `col..col + panels * nr` of the block, the same A panel against each of B's
/// panels, `accumulate` and `post` as there (`post`'s column additions, if any, are
/// those of every tile). One call of the kernel for the row, where the ISA has one.
///
/// # Panics
/// When A or B holds fewer values than the tiles read, or the tiles lie outside the
/// block.
#[allow(clippy::too_many_arguments)]
pub(crate) fn micro_kernel_row(
    isa: Isa,
    kc: usize,
    a: APanel<'_>,
    b: BPanels<'_>,
    out: &mut ColumnBlock<'_, f32>,
    (row, col): (usize, usize),
    panels: usize,
    how: (bool, Option<&TilePost>),
) {
    let t = Tile::of(isa);
    let kernel = match simd_kernel_row(isa) {
        Some(kernel) if panels > 0 && kc > 0 => kernel,
        _ => {
            for q in 0..panels {
                let at = (row, col + q * t.nr);
                micro_kernel(isa, kc, a, b.panel(q), out, at, (t.mr, t.nr), how);
            }
            return;
        }
    };
    let (_, (a_ptr, lda)) = a.steps(t.mr, kc);
    assert!(b.ldb >= t.nr, "B's steps are at least a panel wide");
    let b_need = (panels - 1) * b.step + (kc - 1) * b.ldb + t.nr;
    let b_values = &b.values[..b_need];
    let ld = out.ld();
    let c = out.window_ptr((row, col), (t.mr, panels * t.nr));
    let c = c.unwrap_or_else(|| panic!("tiles at ({row}, {col}) outside their block"));
    let (accumulate, post) = how;
    // SAFETY: the Isa variant carries the proof that its instructions exist on this
    // CPU; A holds kc*mr values (packed) or (mr-1)*lda + kc (rows), B every panel's kc
    // steps (both sliced so above), and the block has an mr x panels*nr window at c
    // with row stride ld (window_ptr checked it).
    unsafe {
        let b = (b_values.as_ptr(), b.ldb, b.step);
        kernel(kc, (a_ptr, lda), b, (c, ld), panels, accumulate, post);
    }
}

/// [`micro_kernel`] into a slice: the corner at `c`, row stride `ldc`.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn micro_kernel_into_slice(
    isa: Isa,
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    let blocks = ColumnBlocks::new(c, rows, cols, ldc, cols.max(1)).expect("the corner fits");
    let mut block = blocks.take(0).expect("one block");
    micro_kernel(
        isa,
        kc,
        APanel::Packed(a),
        BPanel::Packed(b),
        &mut block,
        (0, 0),
        (rows, cols),
        (accumulate, None),
    );
}

/// The scalar micro-kernel: `tile[r * nr + j] += Σ_k A(r, k) * b[k*ldb + j]`.
pub(crate) fn kernel_scalar(
    kc: usize,
    t: Tile,
    a: APanel<'_>,
    (b, ldb): (&[f32], usize),
    tile: &mut [f32],
) {
    for k in 0..kc {
        let bk = &b[k * ldb..k * ldb + t.nr];
        for r in 0..t.mr {
            let av = a.at(t.mr, r, k);
            let row = &mut tile[r * t.nr..(r + 1) * t.nr];
            for (o, &bv) in row.iter_mut().zip(bk) {
                *o += av * bv;
            }
        }
    }
}

/// A SIMD panel product: `(k, x, panel, out)`, see [`panel_dot`].
pub(crate) type SimdPanelDot = unsafe fn(usize, *const f32, *const f32, *mut f32);

/// `out[c] = Σ_kk x[kk] · panel[kk*nr + c]` for one packed panel of `nr = out.len()`
/// columns (the tile width of `isa`): one row of A against a panel of a packed B.
///
/// The panel is one contiguous stream, the layout in which a matrix-vector product
/// reads its weight fastest from memory.
///
/// # Panics
/// When `out` is not one tile wide or `panel` holds fewer than `x.len() * nr` values.
pub(crate) fn panel_dot(isa: Isa, x: &[f32], panel: &[f32], out: &mut [f32]) {
    let (k, nr) = (x.len(), Tile::of(isa).nr);
    assert!(out.len() == nr && panel.len() >= k * nr);
    let simd: Option<SimdPanelDot> = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(_) => Some(super::avx2::panel_dot),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(_) | Isa::Avx512Vnni(_) => Some(super::avx512::panel_dot),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon(_) | Isa::NeonDot(_) => Some(super::neon::panel_dot_16),
        Isa::Scalar => None,
    };
    match simd {
        // SAFETY: the Isa variant carries the proof that its instructions exist on this
        // CPU; x holds k values, panel k*nr and out nr (checked above).
        Some(kernel) => unsafe { kernel(k, x.as_ptr(), panel.as_ptr(), out.as_mut_ptr()) },
        None => panel_dot_scalar(x, panel, out),
    }
}

/// The scalar panel product (the twin the SIMD versions are tested against).
pub(crate) fn panel_dot_scalar(x: &[f32], panel: &[f32], out: &mut [f32]) {
    let nr = out.len();
    out.fill(0.0);
    for (&xv, row) in x.iter().zip(panel.chunks_exact(nr)) {
        for (o, &w) in out.iter_mut().zip(row) {
            *o += xv * w;
        }
    }
}

/// Weight element types of the matrix-vector path.
pub trait WeightElem: Copy + Send + Sync + 'static {
    /// The value as f32.
    fn to_f32(self) -> f32;

    /// Writes a run of values as f32 (over the shorter of the two lengths).
    #[inline(always)]
    fn run_to_f32(dst: &mut [f32], src: &[Self]) {
        for (d, v) in dst.iter_mut().zip(src) {
            *d = v.to_f32();
        }
    }
}
impl WeightElem for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn run_to_f32(dst: &mut [f32], src: &[f32]) {
        crate::copy::copy_floats(dst, src);
    }
}
impl WeightElem for f16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}
impl WeightElem for f64 {
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
}
impl WeightElem for bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Lanes of the scalar dot product (independent partial sums).
const LANES: usize = 8;

/// Scalar dot product of `x` with `w[..x.len()]`, lane-wise.
pub(crate) fn dot_scalar<W: WeightElem>(x: &[f32], w: &[W]) -> f32 {
    let k = x.len();
    let w = &w[..k];
    let mut acc = [0f32; LANES];
    let mut xc = x.chunks_exact(LANES);
    let mut wc = w.chunks_exact(LANES);
    for (xs, ws) in (&mut xc).zip(&mut wc) {
        for l in 0..LANES {
            acc[l] += xs[l] * ws[l].to_f32();
        }
    }
    let mut tail = 0f32;
    for (&xv, wv) in xc.remainder().iter().zip(wc.remainder()) {
        tail += xv * wv.to_f32();
    }
    let mut s = 0f32;
    for v in acc {
        s += v;
    }
    s + tail
}

/// `out[j] = dot(x, w[j*ldw..][..k])` for every `j < out.len()`, with the dot-product
/// rows of `isa`.
///
/// # Panics
/// When `w` is shorter than `(out.len() - 1) * ldw + x.len()`.
pub fn dot_rows<W: WeightElem>(isa: Isa, x: &[f32], w: &[W], ldw: usize, out: &mut [f32]) {
    let k = x.len();
    let rows = out.len();
    if rows == 0 {
        return;
    }
    assert!(w.len() >= (rows - 1) * ldw + k);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => super::avx2::dot_rows(t, x, w, ldw, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(t) | Isa::Avx512Vnni(t) => super::avx512::dot_rows(t, x, w, ldw, out),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon(t) | Isa::NeonDot(t) => super::neon::dot_rows(t, x, w, ldw, out),
        Isa::Scalar => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = dot_scalar(x, &w[j * ldw..j * ldw + k]);
            }
        }
    }
}

/// Runs `out[j] = dot(x, row j)` over rows of `k` weights at stride `ldw`: `four` on
/// each full group of 4 rows, `one` on the rows left over. Every row is handed over as
/// a slice of exactly `k` elements, which the SIMD versions rely on.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) fn by_four_rows<W: WeightElem>(
    k: usize,
    w: &[W],
    ldw: usize,
    out: &mut [f32],
    four: impl Fn([&[W]; 4]) -> [f32; 4],
    one: impl Fn(&[W]) -> f32,
) {
    let row = |j: usize| &w[j * ldw..j * ldw + k];
    let done = out.len() / 4 * 4;
    let (full, rest) = out.split_at_mut(done);
    for (g, dst) in full.chunks_exact_mut(4).enumerate() {
        let j = 4 * g;
        dst.copy_from_slice(&four([row(j), row(j + 1), row(j + 2), row(j + 3)]));
    }
    for (i, o) in rest.iter_mut().enumerate() {
        *o = one(row(done + i));
    }
}

#[cfg(test)]
#[path = "kernels_tests.rs"]
mod tests;
