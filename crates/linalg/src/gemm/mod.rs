//! Matrix products: a packed, cache-blocked GEMM with one micro-kernel per instruction
//! set (AVX-512 8x32, AVX2+FMA 6x16, NEON 6x16, and the scalar twin) for products of
//! several rows, and a parallel dot-product path for matrix-vector products (decode:
//! one token against a weight matrix).
//!
//! Operands are f32, f16 or bf16; everything is computed in f32 and rounded once
//! into the output type. All scratch comes from the caller (the kernel context's
//! temp allocator), so no heap allocation happens here.
//!
//! Parallel scheme: the output columns are split into blocks, one task per block.
//! A task packs its block of B and multiplies the shared packed A into its columns.
//! An f32 output is its own accumulator: each task writes its column block of the
//! output rows directly ([`etch_memory::ColumnBlocks`]), and the micro-kernel
//! finishes each tile (a bias per row or per column, the clamp) as it stores the last
//! block of K. An f16 or bf16 output goes through a private f32 tile per task, and the
//! tiles are finished into the output rows in a second, row-parallel pass. Splitting
//! over columns keeps every thread busy even for a handful of rows.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod f32_api;
mod kernels;
#[cfg(target_arch = "aarch64")]
mod neon;
mod rows_alone;
mod split_depth;
#[cfg(target_arch = "x86_64")]
mod x86;

use half::{bf16, f16};

use etch_memory::{ColumnBlock, ColumnBlocks};

use crate::conv_nchw::Im2col;
use crate::copy::copy_floats;
use crate::{GRAIN_SIZE, Isa, LinalgError, ThreadPool};
pub use f32_api::{GemmF32, PackedB, RhsF32, gemm_f32, gemm_f32_rows_alone, gemm_f32_with};
use kernels::{
    APanel, BPanel, BPanels, MAX_NR, Tile, TilePost, micro_kernel, micro_kernel_row, panel_dot,
};
pub use kernels::{WeightElem, dot_rows};
pub use rows_alone::{gemm_rows_alone, rows_alone_scratch_len};
pub use split_depth::{DepthSplitB, gemm_split_depth, split_depth_scratch_len};

/// Depth of one packed block (k).
const KC: usize = 256;
/// Most rows of A packed at once (B is packed again for each such block of rows).
const MB: usize = 256;
/// Most rows of a block when A is read in place and the output is f32 (nothing to pack,
/// no private tile): fewer blocks, so fewer parallel steps and fewer packings of B,
/// while a block's rows of one K block (`512 x KC` values, 512 KiB) still fit in L2.
const MB_A_IN_PLACE: usize = 512;
/// f32 values in a 64-byte cache line.
const F32_PER_CACHE_LINE: usize = 16;
/// Most columns one task owns.
const NB_MAX: usize = 256;
/// Most packed B values (`kc x nb`) of a task's block that the tile loop counts on
/// finding in L1: 32 KiB.
const B_BLOCK_IN_L1: usize = 8 * 1024;

/// Most rows of a block for which a long-K B block with contiguous f32 rows is read in
/// place rather than packed (a projecting pointwise convolution's few output channels).
const B_IN_PLACE_MAX_ROWS: usize = 64;

/// The element slice of an operand.
#[derive(Clone, Copy)]
pub enum Elems<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    BF16(&'a [bf16]),
    /// f64 elements; only for [`gemm_f64`].
    F64(&'a [f64]),
}

impl Elems<'_> {
    fn len(&self) -> usize {
        match self {
            Elems::F32(s) => s.len(),
            Elems::F16(s) => s.len(),
            Elems::BF16(s) => s.len(),
            Elems::F64(s) => s.len(),
        }
    }

    fn is_f64(&self) -> bool {
        matches!(self, Elems::F64(_))
    }
}

/// A strided matrix view: element `(i, j)` is at `offset + i*rs + j*cs`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    /// The elements the view indexes into.
    pub data: Elems<'a>,
    /// Index of element `(0, 0)`.
    pub offset: usize,
    /// Rows of the view.
    pub rows: usize,
    /// Columns of the view.
    pub cols: usize,
    /// Row stride (elements).
    pub rs: usize,
    /// Column stride (elements).
    pub cs: usize,
}

impl MatRef<'_> {
    /// Fails unless every element lies inside the data.
    fn check(&self, what: &'static str) -> Result<(), LinalgError> {
        if self.rows == 0 || self.cols == 0 {
            return Ok(());
        }
        let last = (self.rows - 1)
            .checked_mul(self.rs)
            .and_then(|r| {
                (self.cols - 1)
                    .checked_mul(self.cs)
                    .and_then(|c| c.checked_add(r))
            })
            .and_then(|x| x.checked_add(self.offset));
        match last {
            Some(l) if l < self.data.len() => Ok(()),
            _ => Err(LinalgError::ViewOutOfBounds {
                what,
                rows: self.rows,
                cols: self.cols,
                len: self.data.len(),
            }),
        }
    }
}

/// An output element type.
pub trait OutElem: Copy + Send + Sync {
    /// `v` rounded to this type.
    fn from_f32(v: f32) -> Self;

    /// `out` as f32 values, when this type is f32 (the product is then computed in
    /// the output itself).
    fn as_f32_mut(_out: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}
impl OutElem for f32 {
    #[inline]
    fn from_f32(v: f32) -> Self {
        v
    }

    fn as_f32_mut(out: &mut [f32]) -> Option<&mut [f32]> {
        Some(out)
    }
}
impl OutElem for f16 {
    #[inline]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl OutElem for bf16 {
    #[inline]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// `out = alpha * a·b + beta * addend` (the addend is optional; `beta == 0` skips
/// it, as PyTorch does), then clamped to `clamp` when given, with `out` row-major
/// `m x n`.
#[derive(Clone, Copy)]
pub struct Gemm<'a> {
    /// The left operand, `m x k`.
    pub a: MatRef<'a>,
    /// The right operand, `k x n`.
    pub b: MatRef<'a>,
    /// Scale of the product.
    pub alpha: f32,
    /// The addend (`m x n`, strides 0 broadcast) and its scale `beta`.
    pub addend: Option<(MatRef<'a>, f32)>,
    /// `(min, max)` bounds of every output (XNNPACK's output clamp).
    pub clamp: Option<(f32, f32)>,
}

impl Gemm<'_> {
    fn dims(&self) -> (usize, usize, usize) {
        (self.a.rows, self.b.cols, self.a.cols)
    }

    /// True when finishing changes nothing: no scale, addend or clamp.
    fn finishes_as_is(&self) -> bool {
        self.alpha == 1.0 && self.clamp.is_none() && self.addend.is_none_or(|(_, beta)| beta == 0.0)
    }

    fn validate(&self, packed_b: bool) -> Result<(), LinalgError> {
        let (m, n, k) = self.dims();
        if self.b.rows != k {
            return Err(LinalgError::Shape(format!(
                "inner dimensions differ: {m}x{k} times {}x{n}",
                self.b.rows
            )));
        }
        self.a.check("left operand")?;
        if !packed_b {
            self.b.check("right operand")?;
        }
        if let Some((c, _)) = &self.addend {
            if c.rows != m || c.cols != n {
                return Err(LinalgError::Shape(format!(
                    "addend of {}x{} for a {m}x{n} output",
                    c.rows, c.cols
                )));
            }
            c.check("addend")?;
        }
        if let Some((lo, hi)) = self.clamp
            && lo.partial_cmp(&hi).is_none_or(|o| o.is_gt())
        {
            return Err(LinalgError::Shape(format!(
                "output clamp [{lo}, {hi}] is empty"
            )));
        }
        Ok(())
    }

    /// True when the product is a set of dot products against contiguous rows: one
    /// row of A against B's k-contiguous columns (or one column of B against A's
    /// k-contiguous rows).
    fn is_gemv(&self) -> bool {
        let (m, n, _) = self.dims();
        (m == 1 && self.b.rs == 1) || (n == 1 && self.a.cs == 1) || self.is_row_times_rows()
    }

    /// One row of A against an f32 B whose rows are contiguous (a transposed weight, as
    /// `permute` then `addmm` leave it): B is best read row by row ([`gemv_axpy`]).
    fn is_row_times_rows(&self) -> bool {
        let (m, n, _) = self.dims();
        m == 1 && n > 1 && self.b.cs == 1 && self.b.rs != 1 && matches!(self.b.data, Elems::F32(_))
    }
}

/// Most steps of a row of A panels that [`task`] asks the cache for ahead.
const PREFETCH_A_MAX_STEPS: usize = 128;

/// Scratch plan of one product.
#[derive(Clone, Copy, Debug)]
struct Plan {
    tile: Tile,
    mb: usize,
    /// Rows of each task's private f32 tile (`mb`, or 0 when tasks write the output).
    tile_rows: usize,
    /// Columns per task.
    nb: usize,
    /// Tasks per round.
    tasks: usize,
    /// Most tasks of one parallel step, when a block of rows is split by rows too
    /// ([`Plan::grid`]): the thread count, at least `tasks`.
    most_tasks: usize,
}

impl Plan {
    /// The plan of a product whose tasks multiply into private tiles (and, with
    /// [`Plan::scratch_len`], the scratch bound of every plan of the product).
    fn new(tile: Tile, m: usize, n: usize, threads: usize) -> Plan {
        let plan = Plan::with_rows(tile, (m, MB), n, threads);
        Plan {
            tile_rows: plan.mb,
            ..plan
        }
    }

    /// The plan of a product whose tasks write an f32 output directly: no private tile,
    /// and blocks of up to [`MB_A_IN_PLACE`] rows when A is read in place.
    fn into_output(tile: Tile, m: usize, n: usize, threads: usize, a_in_place: bool) -> Plan {
        let most = if a_in_place { MB_A_IN_PLACE } else { MB };
        Plan::with_rows(tile, (m, most), n, threads)
    }

    /// The plan for blocks of at most `most` rows, without a private tile.
    fn with_rows(tile: Tile, (m, most): (usize, usize), n: usize, threads: usize) -> Plan {
        // Blocks of rows of equal size (a multiple of the tile's rows), so that no block
        // of a few leftover rows packs all of B again: 512 rows are two blocks of 256,
        // not 252 + 252 + 8.
        let blocks = m.div_ceil(most).max(1);
        let mb = m
            .div_ceil(blocks)
            .next_multiple_of(tile.mr)
            .clamp(1, most.max(tile.mr));
        let threads = threads.max(1);
        // Enough rounds that each task owns at most NB_MAX columns, spread evenly.
        let per_round_max = threads * NB_MAX;
        let rounds = n.div_ceil(per_round_max).max(1);
        let cols_per_round = n.div_ceil(rounds);
        let nb = cols_per_round.div_ceil(threads).div_ceil(tile.nr) * tile.nr;
        let nb = nb.clamp(tile.nr, NB_MAX);
        // At most one task per thread, and no more than the output's column blocks
        // allow (`ColumnBlocks::MAX_BLOCKS`).
        let tasks = cols_per_round
            .div_ceil(nb)
            .clamp(1, threads.min(ColumnBlocks::<f32>::MAX_BLOCKS));
        Plan {
            tile,
            mb,
            tile_rows: 0,
            nb,
            tasks,
            most_tasks: threads.clamp(tasks, ColumnBlocks::<f32>::MAX_BLOCKS),
        }
    }

    /// How a block of `mb` rows and `n` columns that tasks write directly is split over
    /// at most `most_tasks` tasks: `(rows, columns)` of each task's block, whole tiles
    /// (the last row and column of blocks may be smaller). A task's time is about its
    /// tiles (whole tiles computed, even where only a few of their columns are
    /// needed), plus a row of tiles for packing its columns of B, which a task of each
    /// row block does again. Where a row is not a whole number of cache lines, tasks
    /// side by side would write the same line of nearly every row, and the line would
    /// bounce between their cores at each store: such a split counts double. Of the
    /// splits whose largest task costs least, the one with the most row blocks, then
    /// the fewest column blocks: each task then writes whole output rows, the channels
    /// of a convolution, which a depthwise or depth-split layer after it reads on the
    /// same thread (MobileNetV2's 28x28 expansions, 784 columns, tie 2 x 1 with 1 x 2).
    ///
    /// Columns alone split a 14x14 plane's 196 columns (7 panels of 32) 4:3 over two
    /// threads, sharing a line in every row; rows split it evenly and share none.
    fn grid(&self, mb: usize, n: usize) -> (usize, usize) {
        let (mr, nr) = (self.tile.mr, self.tile.nr);
        let (panels_a, panels_b) = (mb.div_ceil(mr).max(1), n.div_ceil(nr).max(1));
        let rows_share_lines = !n.is_multiple_of(F32_PER_CACHE_LINE);
        let mut best = (usize::MAX, mr * panels_a, nr * panels_b);
        // Most row blocks first, so that a tie goes to rows (see above).
        for row_blocks in (1..=self.most_tasks.min(panels_a)).rev() {
            let most_cols = (self.most_tasks / row_blocks).clamp(1, panels_b);
            for col_blocks in [1, most_cols] {
                let (rows, cols) = (panels_a.div_ceil(row_blocks), panels_b.div_ceil(col_blocks));
                let shared = col_blocks > 1 && rows_share_lines;
                let cost = cols * (rows + 1) * if shared { 2 } else { 1 };
                if cost < best.0 {
                    best = (cost, rows * mr, cols * nr);
                }
            }
        }
        (best.1, best.2)
    }

    /// Scratch for one block of packed A (none when A is read in place).
    fn a_len(&self, k: usize, a_in_place: bool) -> usize {
        if a_in_place {
            return 0;
        }
        self.mb.div_ceil(self.tile.mr) * self.tile.mr * k
    }

    /// Scratch of one task: its private tile, if any, and its packed block of B.
    fn task_len(&self) -> usize {
        self.tile_rows * self.nb + KC * self.nb
    }

    /// Scratch of the tasks of one step, whichever way the product runs: `tasks`
    /// tasks with private tiles ([`Plan::new`]), or up to `most_tasks` tasks that
    /// write the output ([`Plan::into_output`], no tile; the same `nb`).
    fn tasks_len(&self) -> usize {
        (self.tasks * self.task_len()).max(self.most_tasks * KC * self.nb)
    }
}

/// Scratch (f32 elements) that [`gemm`] needs for this product on `threads` threads
/// with the micro-kernel of `isa`.
pub fn scratch_len(isa: Isa, g: &Gemm<'_>, threads: usize) -> usize {
    let (m, n, k) = g.dims();
    if m == 0 || n == 0 {
        return 0;
    }
    if g.is_gemv() {
        return gemv_scratch_len(g, threads);
    }
    scratch_len_tiled(isa, (m, n, k), threads, reads_a_in_place(g, Tile::of(isa)))
}

/// Scratch of a matrix-vector product: the vector gathered (`k`), and for one whose B
/// rows are read in turn ([`gemv_axpy`]) split over its depth, each task's partial sums.
fn gemv_scratch_len(g: &Gemm<'_>, threads: usize) -> usize {
    let (_, n, k) = g.dims();
    let tasks = if g.is_row_times_rows() {
        axpy_depth_tasks(n, k, threads)
    } else {
        1
    };
    k + if tasks > 1 { tasks * n } else { 0 }
}

/// Scratch of the tiled product: A's packed block unless `a_in_place`, and each task's.
fn scratch_len_tiled(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    threads: usize,
    a_in_place: bool,
) -> usize {
    let p = Plan::new(Tile::of(isa), m, n, threads);
    p.a_len(k, a_in_place) + p.tasks_len()
}

/// Runs the product into `out` (`m*n` elements, row-major) with the kernels of `isa`,
/// using `scratch` (at least [`scratch_len`] elements).
pub fn gemm<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    out: &mut [O],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    run(pool, isa, g, RightSource::View, out, scratch)
}

/// Scratch (f32 elements) that [`gemm_im2col`] needs for this product on `threads`
/// threads with the micro-kernel of `isa`.
pub fn im2col_scratch_len(isa: Isa, g: &Gemm<'_>, threads: usize) -> usize {
    let (m, n, k) = g.dims();
    if m == 0 || n == 0 {
        return 0;
    }
    scratch_len_tiled(isa, (m, n, k), threads, reads_a_in_place(g, Tile::of(isa)))
}

/// [`gemm`] with B the im2col matrix of `image` (one convolution group), packed
/// straight from the image's planes: `g.b` only gives the shape (`image.rows()` x
/// `image.cols()`), and `scratch` holds at least [`im2col_scratch_len`] elements.
pub fn gemm_im2col(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    image: &Im2col<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    check_im2col(g, image)?;
    run(pool, isa, g, RightSource::Im2col(image, 0), out, scratch)
}

/// Fails unless `image` is the im2col operand that `g`'s B stands for.
fn check_im2col(g: &Gemm<'_>, image: &Im2col<'_>) -> Result<(), LinalgError> {
    if g.b.rows != image.rows() || g.b.cols != image.cols() || !image.fits() {
        return Err(LinalgError::Shape(format!(
            "an im2col operand of {}x{} for planes of {} values: the geometry needs {}x{} over {} x {} x {}",
            g.b.rows,
            g.b.cols,
            image.planes_len(),
            image.rows(),
            image.cols(),
            image.geometry().group_in,
            image.geometry().in_h,
            image.geometry().in_w,
        )));
    }
    Ok(())
}

/// Where the tiled product reads B from.
#[derive(Clone, Copy)]
enum RightSource<'s> {
    /// `g.b` itself, packed block by block.
    View,
    /// Panels packed ahead of time (`g.b` only gives the shape).
    Packed(&'s PackedB),
    /// An im2col matrix packed block by block from its image, from the given row of the
    /// matrix on (`g.b` only gives the shape: a product over part of the depth reads
    /// rows from there).
    Im2col(&'s Im2col<'s>, usize),
}

/// [`gemm`] with B from `src`.
fn run<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    src: RightSource<'_>,
    out: &mut [O],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    g.validate(!matches!(src, RightSource::View))?;
    if g.a.data.is_f64() || g.b.data.is_f64() || g.addend.is_some_and(|(c, _)| c.data.is_f64()) {
        return Err(LinalgError::Unsupported("f64 operands go through gemm_f64"));
    }
    let (m, n, k) = g.dims();
    if out.len() < m * n {
        return Err(LinalgError::OutputTooSmall {
            what: "matrix product",
            need: m * n,
            len: out.len(),
        });
    }
    let out = &mut out[..m * n];
    if m == 0 || n == 0 {
        return Ok(());
    }
    let a_in_place = reads_a_in_place(g, Tile::of(isa));
    let gemv = matches!(src, RightSource::View) && g.is_gemv();
    let packed_gemv = matches!(src, RightSource::Packed(_)) && m == 1;
    let need = if gemv {
        gemv_scratch_len(g, pool.threads())
    } else if packed_gemv {
        k
    } else {
        scratch_len_tiled(isa, (m, n, k), pool.threads(), a_in_place)
    };
    if scratch.len() < need {
        return Err(LinalgError::ScratchTooSmall {
            what: "matrix product",
            need,
            len: scratch.len(),
        });
    }
    if k == 0 {
        // Empty sum: only the addend contributes.
        for (i, row) in out.chunks_exact_mut(n).enumerate() {
            for (j, o) in row.iter_mut().enumerate() {
                *o = O::from_f32(clamp(g, addend_at(g, i, j)));
            }
        }
        return Ok(());
    }
    if gemv && g.is_row_times_rows() {
        return gemv_axpy(pool, isa, g, out, scratch);
    }
    if gemv {
        return gemv_rows(pool, isa, g, out, scratch);
    }
    if let RightSource::Packed(packed) = src
        && m == 1
    {
        gemv_packed(pool, g, packed, out, scratch);
        return Ok(());
    }
    let (tile, threads) = (Tile::of(isa), pool.threads());
    match O::as_f32_mut(out) {
        Some(out) => {
            let plan = Plan::into_output(tile, m, n, threads, a_in_place);
            let (apack, rest) = scratch.split_at_mut(plan.a_len(k, a_in_place));
            let work = &mut rest[..plan.most_tasks * plan.task_len()];
            tiled_into_output(pool, isa, g, src, &plan, apack, work, out);
        }
        None => {
            let plan = Plan::new(tile, m, n, threads);
            let (apack, rest) = scratch.split_at_mut(plan.a_len(k, a_in_place));
            let work = &mut rest[..plan.tasks * plan.task_len()];
            tiled_through_tiles(pool, isa, g, src, &plan, apack, work, out);
        }
    }
    Ok(())
}

/// Where the micro-kernels read A from in one block of rows.
#[derive(Clone, Copy)]
enum ASource<'s> {
    /// Packed into `mr`-row panels (all of K each).
    Packed(&'s [f32]),
    /// The block's rows of a row-major f32 A, read in place: the block's first row at
    /// `offset`, rows `lda` apart.
    Rows {
        data: &'s [f32],
        offset: usize,
        lda: usize,
    },
}

impl<'s> ASource<'s> {
    /// The same rows from row `r0` on (a multiple of the tile's rows), for a task that
    /// owns the block's rows from there.
    fn rows_from(self, t: Tile, k: usize, r0: usize) -> ASource<'s> {
        match self {
            ASource::Packed(apack) => ASource::Packed(&apack[(r0 / t.mr) * t.mr * k..]),
            ASource::Rows { data, offset, lda } => ASource::Rows {
                data,
                offset: offset + r0 * lda,
                lda,
            },
        }
    }

    /// The micro-kernel operand of panel `p` (rows `p*mr ..`), steps `k0..k0 + kc`.
    #[inline]
    fn panel(self, t: Tile, k: usize, p: usize, (k0, kc): (usize, usize)) -> APanel<'s> {
        match self {
            ASource::Packed(apack) => {
                APanel::Packed(&apack[p * t.mr * k + k0 * t.mr..][..kc * t.mr])
            }
            ASource::Rows { data, offset, lda } => {
                APanel::Rows(&data[offset + p * t.mr * lda + k0..], lda)
            }
        }
    }
}

/// True when the micro-kernels read A's rows in place rather than packed: an f32 A
/// with contiguous rows whose every panel is whole.
fn reads_a_in_place(g: &Gemm<'_>, t: Tile) -> bool {
    matches!(g.a.data, Elems::F32(_))
        && g.a.cs == 1
        && g.a.rs >= g.a.cols
        && g.a.rows.is_multiple_of(t.mr)
}

/// The blocks of `plan.mb` rows of a tiled product, A's rows packed into `apack` first
/// unless read in place; `block(a, (m0, mb))` runs one.
fn for_each_row_block(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    plan: &Plan,
    apack: &mut [f32],
    mut block: impl FnMut(ASource<'_>, (usize, usize)),
) {
    let (m, _, _) = g.dims();
    let in_place = match g.a.data {
        Elems::F32(data) if reads_a_in_place(g, plan.tile) => Some(data),
        _ => None,
    };
    let mut m0 = 0;
    while m0 < m {
        let mb = plan.mb.min(m - m0);
        let a = match in_place {
            Some(data) => ASource::Rows {
                data,
                offset: g.a.offset + m0 * g.a.rs,
                lda: g.a.rs,
            },
            None => {
                pack_a(pool, isa, plan.tile, &g.a, m0, mb, apack);
                ASource::Packed(apack)
            }
        };
        block(a, (m0, mb));
        m0 += mb;
    }
}

/// The rounds of a tiled product: each block of rows (see [`for_each_row_block`]) split
/// into rounds of at most `plan.tasks` column blocks; `round(a, (m0, mb), (n0, width,
/// tasks))` runs one.
fn for_each_round(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    plan: &Plan,
    apack: &mut [f32],
    mut round: impl FnMut(ASource<'_>, (usize, usize), (usize, usize, usize)),
) {
    let n = g.b.cols;
    for_each_row_block(pool, isa, g, plan, apack, |a, rows| {
        let mut n0 = 0;
        while n0 < n {
            let width = (plan.tasks * plan.nb).min(n - n0);
            round(a, rows, (n0, width, width.div_ceil(plan.nb)));
            n0 += width;
        }
    });
}

/// Runs `run(t, scratch)` for each task of a round, on the pool when there are several;
/// `work` holds the round's tasks' scratch, `plan.task_len()` each.
fn run_tasks(
    pool: &ThreadPool,
    plan: &Plan,
    work: &mut [f32],
    run: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if work.len() > plan.task_len() {
        pool.for_each_chunk_mut(work, plan.task_len(), 1, run);
    } else {
        run(0, work);
    }
}

/// The tiled product of an f32 output: each block of rows is one parallel step, in
/// which each task owns a block of the output ([`Plan::grid`]: a contiguous span of
/// its columns, of some or all of its rows) and multiplies straight into it,
/// `plan.nb` columns at a time, finishing them there.
#[allow(clippy::too_many_arguments)]
fn tiled_into_output(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    src: RightSource<'_>,
    plan: &Plan,
    apack: &mut [f32],
    work: &mut [f32],
    out: &mut [f32],
) {
    let n = g.b.cols;
    let k = g.a.cols;
    for_each_row_block(pool, isa, g, plan, apack, |a, (m0, mb)| {
        let rows = &mut out[m0 * n..(m0 + mb) * n];
        let (part_rows, span) = plan.grid(mb, n);
        let Some(parts) = ColumnBlocks::grid(rows, (mb, n), n, (part_rows, span)) else {
            unreachable!("the output's rows hold a block of rows, in at most most_tasks parts")
        };
        let run = |t: usize, chunk: &mut [f32]| {
            let Some(mut owned) = parts.take(t) else {
                unreachable!("each task takes its own part once")
            };
            let (r0, c0) = (parts.rows(t).start, parts.columns(t).start);
            let a = a.rows_from(plan.tile, k, r0);
            let bpack = &mut chunk[plan.tile_rows * plan.nb..];
            let mut j = 0;
            while j < owned.cols() {
                let width = plan.nb.min(owned.cols() - j);
                let Some(mut block) = owned.columns_mut(j..j + width) else {
                    unreachable!("the columns lie inside the part")
                };
                let dest = (&mut block, Dest::Output { m0: m0 + r0 });
                task(isa, plan.tile, g, src, a, c0 + j, dest, bpack);
                j += width;
            }
        };
        run_tasks(
            pool,
            plan,
            &mut work[..parts.blocks() * plan.task_len()],
            run,
        );
    });
}

/// The tiled product of an f16 or bf16 output: each task multiplies into a private
/// f32 tile, and the tiles are then finished into the output rows in a row-parallel
/// pass.
#[allow(clippy::too_many_arguments)]
fn tiled_through_tiles<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    src: RightSource<'_>,
    plan: &Plan,
    apack: &mut [f32],
    work: &mut [f32],
    out: &mut [O],
) {
    let n = g.b.cols;
    for_each_round(
        pool,
        isa,
        g,
        plan,
        apack,
        |a, (m0, mb), (n0, width, tasks)| {
            let run = |t: usize, chunk: &mut [f32]| {
                let c0 = n0 + t * plan.nb;
                let nb = plan.nb.min(n0 + width - c0);
                let (tile, bpack) = chunk.split_at_mut(plan.tile_rows * plan.nb);
                let Some(blocks) = ColumnBlocks::new(tile, mb, nb, plan.nb, nb) else {
                    unreachable!("a task's tile holds mb x nb values")
                };
                let Some(mut block) = blocks.take(0) else {
                    unreachable!("a one-block split has block 0")
                };
                task(
                    isa,
                    plan.tile,
                    g,
                    src,
                    a,
                    c0,
                    (&mut block, Dest::Tile),
                    bpack,
                );
            };
            run_tasks(pool, plan, &mut work[..tasks * plan.task_len()], run);
            let tiles = TileRows {
                tiles: &*work,
                plan,
                tasks,
                n0,
                round: width,
                m0,
            };
            let rows = &mut out[m0 * n..(m0 + mb) * n];
            let write = |first: usize, chunk: &mut [O]| finish_tiles(isa, g, &tiles, first, chunk);
            if mb * width >= GRAIN_SIZE && mb >= 2 && pool.threads() > 1 {
                let per = mb.div_ceil(pool.threads());
                pool.for_each_chunk_mut(rows, per * n, 1, |ci, c| write(ci * per, c));
            } else {
                write(0, rows);
            }
        },
    );
}

/// The tiles of one round of [`run`]: task `t` holds output columns `n0 + t * nb ..`
/// of rows `m0 ..`, at row stride `nb`.
struct TileRows<'t> {
    tiles: &'t [f32],
    plan: &'t Plan,
    tasks: usize,
    n0: usize,
    round: usize,
    m0: usize,
}

/// Finishes (scale, addend, clamp) the round's tiles into output rows `first ..` of the
/// block (`chunk`, whole rows), compiled for `isa` so the row loops use its vectors.
fn finish_tiles<O: OutElem>(
    isa: Isa,
    g: &Gemm<'_>,
    t: &TileRows<'_>,
    first: usize,
    chunk: &mut [O],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = isa.avx2() {
        avx2::finish_tiles(cpu, g, t, first, chunk);
        return;
    }
    let _ = isa;
    finish_tiles_body(g, t, first, chunk);
}

/// The body of [`finish_tiles`].
#[inline(always)]
fn finish_tiles_body<O: OutElem>(g: &Gemm<'_>, t: &TileRows<'_>, first: usize, chunk: &mut [O]) {
    let n = g.b.cols;
    let nb_max = t.plan.nb;
    for (r, row) in chunk.chunks_exact_mut(n).enumerate() {
        let i = first + r;
        for task in 0..t.tasks {
            let c0 = t.n0 + task * nb_max;
            let nb = nb_max.min(t.n0 + t.round - c0);
            let tile = &t.tiles[task * t.plan.task_len() + i * nb_max..][..nb];
            finish_row(g, tile, t.m0 + i, c0, &mut row[c0..c0 + nb]);
        }
    }
}

#[inline]
fn addend_at(g: &Gemm<'_>, i: usize, j: usize) -> f32 {
    match &g.addend {
        Some((c, beta)) if *beta != 0.0 => beta * get(&c.data, c.offset + i * c.rs + j * c.cs),
        _ => 0.0,
    }
}

/// `v` inside the output clamp `[lo, hi]` (XNNPACK's `output_min/max`, PyTorch's
/// `hardtanh`): below `lo` it is `lo`, above `hi` it is `hi`, otherwise (NaN included)
/// it is kept. Compare-and-select, so loops over it vectorise.
#[inline(always)]
pub fn output_clamp(v: f32, (lo, hi): (f32, f32)) -> f32 {
    if v < lo {
        lo
    } else if v > hi {
        hi
    } else {
        v
    }
}

/// `v` inside the output clamp of `g`, if any.
#[inline]
fn clamp(g: &Gemm<'_>, v: f32) -> f32 {
    g.clamp.map_or(v, |bounds| output_clamp(v, bounds))
}

#[inline]
fn finish(g: &Gemm<'_>, v: f32, i: usize, j: usize) -> f32 {
    let v = if g.alpha == 1.0 { v } else { g.alpha * v };
    let v = match &g.addend {
        Some((c, beta)) if *beta != 0.0 => {
            let x = get(&c.data, c.offset + i * c.rs + j * c.cs);
            v + if *beta == 1.0 { x } else { beta * x }
        }
        _ => v,
    };
    clamp(g, v)
}

/// What finishing output row `i` from column `c0` on (`len` columns) takes: the common
/// cases (no scaling; no addend, an f32 addend row, or one addend value for the row)
/// are plain slice loops the compiler vectorises; anything else goes element by
/// element through [`finish`].
enum RowFinish<'g> {
    /// Clamp only (to `(-inf, inf)` without a clamp).
    Clamp,
    /// Add the f32 addend row, then clamp.
    AddRow(&'g [f32]),
    /// Add one value, then clamp.
    AddValue(f32),
    /// [`finish`] element by element.
    General,
}

#[inline(always)]
fn row_finish<'g>(g: &Gemm<'g>, i: usize, c0: usize, len: usize) -> RowFinish<'g> {
    if g.alpha != 1.0 {
        return RowFinish::General;
    }
    match &g.addend {
        None => RowFinish::Clamp,
        Some((_, beta)) if *beta == 0.0 => RowFinish::Clamp,
        Some((c, beta)) if *beta == 1.0 && c.cs == 1 => match c.data {
            Elems::F32(s) => match s.get(c.offset + i * c.rs + c0..) {
                Some(row) if row.len() >= len => RowFinish::AddRow(&row[..len]),
                _ => RowFinish::General,
            },
            _ => RowFinish::General,
        },
        Some((c, beta)) if *beta == 1.0 && c.cs == 0 => {
            RowFinish::AddValue(get(&c.data, c.offset + i * c.rs))
        }
        Some(_) => RowFinish::General,
    }
}

/// `dst[jj] = finish(tile[jj])` for output row `i`, columns `c0..`.
#[inline(always)]
fn finish_row<O: OutElem>(g: &Gemm<'_>, tile: &[f32], i: usize, c0: usize, dst: &mut [O]) {
    let bounds = g.clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
    let bound = |v: f32| output_clamp(v, bounds);
    let pairs = dst.iter_mut().zip(tile);
    match row_finish(g, i, c0, tile.len()) {
        RowFinish::Clamp => pairs.for_each(|(o, &v)| *o = O::from_f32(bound(v))),
        RowFinish::AddRow(row) => pairs
            .zip(row)
            .for_each(|((o, &v), &b)| *o = O::from_f32(bound(v + b))),
        RowFinish::AddValue(b) => pairs.for_each(|(o, &v)| *o = O::from_f32(bound(v + b))),
        RowFinish::General => {
            for (jj, (o, &v)) in pairs.enumerate() {
                *o = O::from_f32(finish(g, v, i, c0 + jj));
            }
        }
    }
}

/// Sets `post`'s clamp for `g`'s finish, when the micro-kernel can apply that finish
/// ([`TilePost`]): no scaling, and no addend or one that is a value per row or a value
/// per column (`beta` 1). `false` for any other finish.
fn prepare_tile_post(g: &Gemm<'_>, post: &mut TilePost) -> bool {
    if g.alpha != 1.0 {
        return false;
    }
    if let Some((lo, hi)) = g.clamp {
        (post.lo, post.hi) = (lo, hi);
    }
    match &g.addend {
        None => true,
        Some((c, beta)) => *beta == 0.0 || (*beta == 1.0 && (c.cs == 0 || c.rs == 0)),
    }
}

/// Whether `g`'s addend, if any, adds one value to each row (a convolution's bias): a
/// [`TilePost`] is then the same for every tile of a row of tiles.
fn addend_is_per_row(g: &Gemm<'_>) -> bool {
    match &g.addend {
        None => true,
        Some((c, beta)) => *beta == 0.0 || c.cs == 0,
    }
}

/// Sets `post`'s additions for the output tile at rows `i0..i0 + rows`, columns
/// `j0..j0 + cols` (after [`prepare_tile_post`] accepted `g`).
#[inline]
fn fill_tile_post(
    g: &Gemm<'_>,
    post: &mut TilePost,
    (i0, rows): (usize, usize),
    (j0, cols): (usize, usize),
) {
    let Some((c, beta)) = &g.addend else {
        return;
    };
    if *beta == 0.0 {
        return;
    }
    if c.cs == 0 {
        let at = |r: usize| c.offset + (i0 + r) * c.rs;
        match c.data {
            Elems::F32(s) if c.rs == 1 => {
                copy_floats(&mut post.row_add[..rows], &s[at(0)..at(0) + rows]);
            }
            _ => {
                for (r, v) in post.row_add.iter_mut().take(rows).enumerate() {
                    *v = get(&c.data, at(r));
                }
            }
        }
    } else {
        let at = |j: usize| c.offset + (j0 + j) * c.cs;
        match c.data {
            Elems::F32(s) if c.cs == 1 => {
                copy_floats(&mut post.col_add[..cols], &s[at(0)..at(0) + cols]);
            }
            _ => {
                for (j, v) in post.col_add.iter_mut().take(cols).enumerate() {
                    *v = get(&c.data, at(j));
                }
            }
        }
    }
}

/// [`finish_row`] of an f32 row in place (finishes [`tile_post`] cannot express).
fn finish_in_place(g: &Gemm<'_>, row: &mut [f32], i: usize, c0: usize) {
    for (jj, v) in row.iter_mut().enumerate() {
        *v = finish(g, *v, i, c0 + jj);
    }
}

#[inline]
fn get(d: &Elems<'_>, i: usize) -> f32 {
    match d {
        Elems::F32(s) => s[i],
        Elems::F16(s) => s[i].to_f32(),
        Elems::BF16(s) => s[i].to_f32(),
        Elems::F64(s) => s[i] as f32,
    }
}

#[inline]
fn get_f64(d: &Elems<'_>, i: usize) -> f64 {
    match d {
        Elems::F32(s) => s[i] as f64,
        Elems::F16(s) => s[i].to_f64(),
        Elems::BF16(s) => s[i].to_f64(),
        Elems::F64(s) => s[i],
    }
}

/// The product in f64 (plain loops; f64 matmuls are rare in exported programs):
/// `out = alpha * a·b + beta * addend` (the clamp of `g` is ignored).
pub fn gemm_f64(g: &Gemm<'_>, alpha: f64, beta: f64, out: &mut [f64]) -> Result<(), LinalgError> {
    g.validate(false)?;
    let (m, n, k) = g.dims();
    let len = out.len();
    let out = out.get_mut(..m * n).ok_or(LinalgError::OutputTooSmall {
        what: "matrix product",
        need: m * n,
        len,
    })?;
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            for kk in 0..k {
                s += get_f64(&g.a.data, g.a.offset + i * g.a.rs + kk * g.a.cs)
                    * get_f64(&g.b.data, g.b.offset + kk * g.b.rs + j * g.b.cs);
            }
            let mut v = alpha * s;
            if let Some((c, _)) = &g.addend
                && beta != 0.0
            {
                v += beta * get_f64(&c.data, c.offset + i * c.rs + j * c.cs);
            }
            out[i * n + j] = v;
        }
    }
    Ok(())
}

/// Packs rows `m0..m0+mb` of A (all of K) into `mr`-row panels: panel `p`, step `k`,
/// row `r` at `p*mr*K + k*mr + r`; rows past `mb` are zero.
#[allow(clippy::too_many_arguments)]
fn pack_a(
    pool: &ThreadPool,
    isa: Isa,
    t: Tile,
    a: &MatRef<'_>,
    m0: usize,
    mb: usize,
    dst: &mut [f32],
) {
    let (k, mr) = (a.cols, t.mr);
    let panels = mb.div_ceil(mr);
    let dst = &mut dst[..panels * mr * k];
    let run = |p0: usize, chunk: &mut [f32]| {
        for (pi, panel) in chunk.chunks_exact_mut(mr * k).enumerate() {
            let r0 = (p0 + pi) * mr;
            let rows = mr.min(mb - r0);
            pack_a_panel_for(isa, mr, a, m0 + r0, rows, panel);
        }
    };
    if panels * mr * k >= GRAIN_SIZE && panels >= 2 && pool.threads() > 1 {
        let per = panels.div_ceil(pool.threads());
        pool.for_each_chunk_mut(dst, per * mr * k, 1, |ci, c| run(ci * per, c));
    } else {
        run(0, dst);
    }
}

/// [`pack_a_panel`] of rows `row0..row0 + rows` of `a`, compiled for `isa`'s vectors.
fn pack_a_panel_for(
    isa: Isa,
    mr: usize,
    a: &MatRef<'_>,
    row0: usize,
    rows: usize,
    panel: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = isa.avx2() {
        // Eight whole f32 rows: transposed eight by eight in registers.
        if let (8, 1, Elems::F32(s)) = (mr, a.cs, a.data)
            && rows == 8
        {
            let k = a.cols;
            let rows: [&[f32]; 8] = std::array::from_fn(|r| {
                let base = a.offset + (row0 + r) * a.rs;
                &s[base..base + k]
            });
            avx2::pack_a_8_rows(cpu, rows, &mut panel[..8 * k]);
            return;
        }
        avx2::pack_a_panel(cpu, mr, a, row0, rows, panel);
        return;
    }
    let _ = isa;
    pack_a_panel_elems(mr, a, row0, rows, panel);
}

/// [`pack_a_panel`] over `a`'s element type.
#[inline(always)]
fn pack_a_panel_elems(mr: usize, a: &MatRef<'_>, row0: usize, rows: usize, panel: &mut [f32]) {
    match a.data {
        Elems::F32(s) => pack_a_panel(s, mr, a, row0, rows, panel),
        Elems::F16(s) => pack_a_panel(s, mr, a, row0, rows, panel),
        Elems::BF16(s) => pack_a_panel(s, mr, a, row0, rows, panel),
        Elems::F64(s) => pack_a_panel(s, mr, a, row0, rows, panel),
    }
}

/// [`pack_b`] of `B[k0..k0+kc, c0..c0+nb]`, compiled for `isa`'s vectors.
fn pack_b_for(
    isa: Isa,
    nr: usize,
    b: &MatRef<'_>,
    ks: (usize, usize),
    cs: (usize, usize),
    dst: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = isa.avx2() {
        avx2::pack_b(cpu, nr, b, ks, cs, dst);
        return;
    }
    let _ = isa;
    pack_b_elems(nr, b, ks, cs, dst);
}

/// [`pack_b`] over `b`'s element type.
#[inline(always)]
fn pack_b_elems(
    nr: usize,
    b: &MatRef<'_>,
    (k0, kc): (usize, usize),
    (c0, nb): (usize, usize),
    dst: &mut [f32],
) {
    match b.data {
        Elems::F32(s) => pack_b(s, nr, b, k0, kc, c0, nb, dst),
        Elems::F16(s) => pack_b(s, nr, b, k0, kc, c0, nb, dst),
        Elems::BF16(s) => pack_b(s, nr, b, k0, kc, c0, nb, dst),
        Elems::F64(s) => pack_b(s, nr, b, k0, kc, c0, nb, dst),
    }
}

#[inline(always)]
fn pack_a_panel<T: WeightElem>(
    s: &[T],
    mr: usize,
    a: &MatRef<'_>,
    row0: usize,
    rows: usize,
    panel: &mut [f32],
) {
    let k = a.cols;
    if a.cs == 1 && rows == mr {
        match mr {
            6 => return pack_a_full::<6, T>(s, a, row0, panel),
            8 => return pack_a_full::<8, T>(s, a, row0, panel),
            _ => {}
        }
    }
    for r in 0..mr {
        if r >= rows {
            for kk in 0..k {
                panel[kk * mr + r] = 0.0;
            }
            continue;
        }
        let base = a.offset + (row0 + r) * a.rs;
        if a.cs == 1 {
            for (kk, v) in s[base..base + k].iter().enumerate() {
                panel[kk * mr + r] = v.to_f32();
            }
        } else {
            for kk in 0..k {
                panel[kk * mr + r] = s[base + kk * a.cs].to_f32();
            }
        }
    }
}

/// [`pack_a_panel`] for a full panel of `MR` contiguous rows: written step by step
/// (sequential stores, `MR` read streams).
#[inline(always)]
fn pack_a_full<const MR: usize, T: WeightElem>(
    s: &[T],
    a: &MatRef<'_>,
    row0: usize,
    panel: &mut [f32],
) {
    let k = a.cols;
    let rows: [&[T]; MR] = std::array::from_fn(|r| {
        let base = a.offset + (row0 + r) * a.rs;
        &s[base..base + k]
    });
    for (kk, step) in panel.chunks_exact_mut(MR).take(k).enumerate() {
        for (o, row) in step.iter_mut().zip(&rows) {
            *o = row[kk].to_f32();
        }
    }
}

/// Packs `B[k0..k0+kc, c0..c0+nb]` into `nr`-column panels: panel `q`, step `k`,
/// column `c` at `q*kc*nr + k*nr + c`; columns past `nb` are zero.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pack_b<T: WeightElem>(
    s: &[T],
    nr: usize,
    b: &MatRef<'_>,
    k0: usize,
    kc: usize,
    c0: usize,
    nb: usize,
    dst: &mut [f32],
) {
    let panels = nb.div_ceil(nr);
    for q in 0..panels {
        let panel = &mut dst[q * kc * nr..(q + 1) * kc * nr];
        let cols = nr.min(nb - q * nr);
        if b.rs == 1 {
            // k-contiguous columns (a linear weight [N, K]): read each column once.
            for c in 0..nr {
                if c >= cols {
                    for kk in 0..kc {
                        panel[kk * nr + c] = 0.0;
                    }
                    continue;
                }
                let base = b.offset + k0 + (c0 + q * nr + c) * b.cs;
                for (kk, v) in s[base..base + kc].iter().enumerate() {
                    panel[kk * nr + c] = v.to_f32();
                }
            }
        } else {
            for kk in 0..kc {
                let base = b.offset + (k0 + kk) * b.rs + (c0 + q * nr) * b.cs;
                let dst = &mut panel[kk * nr..(kk + 1) * nr];
                if b.cs == 1 {
                    // n-contiguous rows (activations, an im2col matrix): one run per row.
                    let (head, tail) = dst.split_at_mut(cols);
                    T::run_to_f32(head, &s[base..base + cols]);
                    tail.fill(0.0);
                    continue;
                }
                for (c, d) in dst.iter_mut().enumerate() {
                    *d = if c < cols {
                        s[base + c * b.cs].to_f32()
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// Where a task writes its product: rows `m0..m0+mb` of the output itself (finished
/// there, tile by tile, as the last block of K completes it), or a private tile that
/// [`finish_tiles`] writes to the output afterwards.
#[derive(Clone, Copy)]
enum Dest {
    /// The output's own rows; the task finishes them (first row `m0`).
    Output { m0: usize },
    /// A private f32 tile.
    Tile,
}

/// One task: columns `c0..c0 + out.cols()` of rows `0..out.rows()` of the current
/// block of A, into `out`.
#[allow(clippy::too_many_arguments)]
fn task(
    isa: Isa,
    t: Tile,
    g: &Gemm<'_>,
    src: RightSource<'_>,
    a: ASource<'_>,
    c0: usize,
    (out, dest): (&mut ColumnBlock<'_, f32>, Dest),
    bpack: &mut [f32],
) {
    let (mb, nb) = (out.rows(), out.cols());
    let k = g.a.cols;
    let panels_b = nb.div_ceil(t.nr);
    let panels_a = mb.div_ceil(t.mr);
    // Rows of the output this task finishes (first row m0), when there is a finish,
    // and whether the micro-kernel applies it (`post`) or it is applied afterwards.
    let finish_from = match dest {
        Dest::Output { m0 } if !g.finishes_as_is() => Some(m0),
        _ => None,
    };
    let mut post = TilePost::NONE;
    let in_kernel = finish_from.is_some() && prepare_tile_post(g, &mut post);
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        // Tiles row of panels by row of panels when this block's B panels fit in L1
        // (a short K, a pointwise convolution's): each A panel is then read once and
        // the output written a few rows at a time, which the hardware prefetches for
        // even when those rows are far apart and not in cache. Otherwise column by
        // column, so that each B panel stays in L1 while every A panel streams by.
        let by_rows = kc * nb <= B_BLOCK_IN_L1;
        // Such a block, or one that few rows of A meet, is read in place when B's rows
        // allow it: packing it would cost about as much as the few products each of its
        // values takes part in. Panels 0..whole_b come from the rows, a narrower last
        // one is packed (it would read past the rows' end).
        let b_rows = match src {
            RightSource::View if by_rows || mb <= B_IN_PLACE_MAX_ROWS => b_rows_in_place(g, t),
            _ => None,
        };
        let whole_b = if b_rows.is_some() { nb / t.nr } else { 0 };
        match src {
            RightSource::View if b_rows.is_some() => {
                if whole_b < panels_b {
                    let c = whole_b * t.nr;
                    pack_b_for(isa, t.nr, &g.b, (k0, kc), (c0 + c, nb - c), bpack);
                }
            }
            RightSource::View => pack_b_for(isa, t.nr, &g.b, (k0, kc), (c0, nb), bpack),
            RightSource::Im2col(image, first) => {
                image.pack_panels(isa, t.nr, (first + k0, kc), (c0, nb), bpack)
            }
            RightSource::Packed(_) => {}
        }
        let last = k0 + kc == k;
        let accumulate = k0 > 0;
        let one_tile = |p: usize, q: usize, post: &mut TilePost, out: &mut ColumnBlock<'_, f32>| {
            let ap = a.panel(t, k, p, (k0, kc));
            let rows = t.mr.min(mb - p * t.mr);
            let bp = match (src, b_rows) {
                (RightSource::Packed(p), _) => BPanel::Packed(p.panel(c0 / t.nr + q, k0, kc)),
                (_, Some((rows, ldb))) if q < whole_b => {
                    BPanel::Rows(&rows[k0 * ldb + c0 + q * t.nr..], ldb)
                }
                (_, Some(_)) => BPanel::Packed(&bpack[..kc * t.nr]),
                _ => BPanel::Packed(&bpack[q * kc * t.nr..(q + 1) * kc * t.nr]),
            };
            let cols = t.nr.min(nb - q * t.nr);
            let at = (p * t.mr, q * t.nr);
            match finish_from {
                Some(m0) if last && in_kernel => {
                    fill_tile_post(g, post, (m0 + at.0, rows), (c0 + at.1, cols));
                    let how = (accumulate, Some(&*post));
                    micro_kernel(isa, kc, ap, bp, out, at, (rows, cols), how);
                }
                Some(m0) if last => {
                    micro_kernel(isa, kc, ap, bp, out, at, (rows, cols), (accumulate, None));
                    for r in at.0..at.0 + rows {
                        let row = &mut out.row_mut(r)[at.1..at.1 + cols];
                        finish_in_place(g, row, m0 + r, c0 + at.1);
                    }
                }
                _ => micro_kernel(isa, kc, ap, bp, out, at, (rows, cols), (accumulate, None)),
            }
        };
        // The next row of A panels asked for while this one runs (on the first column
        // of panels, the only pass that reads A from outside the core's caches).
        let prefetch_a = |p: usize| {
            if p + 1 < panels_a && kc <= PREFETCH_A_MAX_STEPS {
                a.panel(t, k, p + 1, (k0, kc)).prefetch(t.mr, kc);
            }
        };
        if !by_rows {
            for tile in 0..panels_a * panels_b {
                if tile < panels_a {
                    prefetch_a(tile);
                }
                one_tile(tile % panels_a, tile / panels_a, &mut post, out);
            }
            k0 += kc;
            continue;
        }
        // Row by row of panels; a row's whole tiles in one call of the kernel where
        // their B panels lie at one distance from each other and their finish is the
        // same for each (a value per row, a clamp, or none).
        let (row_panels, row_finish) = match (src, finish_from) {
            (RightSource::Packed(_), _) => (0, None),
            (_, Some(_)) if last && !(in_kernel && addend_is_per_row(g)) => (0, None),
            (_, Some(m0)) if last => (nb / t.nr, Some(m0)),
            _ => (nb / t.nr, None),
        };
        let b_panels = match b_rows {
            Some((rows, ldb)) => BPanels {
                values: rows.get(k0 * ldb + c0..).unwrap_or(&[]),
                ldb,
                step: t.nr,
            },
            None => BPanels {
                values: &bpack[..],
                ldb: t.nr,
                step: kc * t.nr,
            },
        };
        for p in 0..panels_a {
            prefetch_a(p);
            let whole = if t.mr * (p + 1) <= mb { row_panels } else { 0 };
            if whole > 0 {
                let ap = a.panel(t, k, p, (k0, kc));
                let post = match row_finish {
                    Some(m0) => {
                        fill_tile_post(g, &mut post, (m0 + p * t.mr, t.mr), (c0, t.nr));
                        Some(&post)
                    }
                    None => None,
                };
                let at = (p * t.mr, 0);
                micro_kernel_row(isa, kc, ap, b_panels, out, at, whole, (accumulate, post));
            }
            for q in whole..panels_b {
                one_tile(p, q, &mut post, out);
            }
        }
        k0 += kc;
    }
}

/// B's rows when the micro-kernels read them in place rather than packed: an f32 B
/// with contiguous rows (activations, a pointwise convolution's input planes), at
/// least a panel wide. The rows start at B's first element; the second value is their
/// stride.
fn b_rows_in_place<'g>(g: &Gemm<'g>, t: Tile) -> Option<(&'g [f32], usize)> {
    match g.b.data {
        Elems::F32(data) if g.b.cs == 1 && g.b.rs >= t.nr => {
            data.get(g.b.offset..).map(|rows| (rows, g.b.rs))
        }
        _ => None,
    }
}

/// One row of A against a packed B (a decode step through a weight packed at load):
/// each thread streams one contiguous run of panels, which is how a matrix-vector
/// product reads memory fastest. `scratch` holds at least `k` values.
fn gemv_packed<O: OutElem>(
    pool: &ThreadPool,
    g: &Gemm<'_>,
    packed: &PackedB,
    out: &mut [O],
    scratch: &mut [f32],
) {
    let (_, n, k) = g.dims();
    let (isa, nr) = (packed.isa(), Tile::of(packed.isa()).nr);
    let xs = gather(&g.a.data, g.a.offset, g.a.cs, &mut scratch[..k]);
    let run = |first: usize, chunk: &mut [O]| {
        let mut dots = [0f32; MAX_NR];
        let dots = &mut dots[..nr];
        for (pi, piece) in chunk.chunks_mut(nr).enumerate() {
            let c0 = first + pi * nr;
            panel_dot(isa, xs, packed.panel(c0 / nr, 0, k), dots);
            for (jj, (o, &d)) in piece.iter_mut().zip(dots.iter()).enumerate() {
                *o = O::from_f32(finish(g, d, 0, c0 + jj));
            }
        }
    };
    match packed_gemv_split(n, k, nr, pool.threads()) {
        Some(per) => pool.for_each_chunk_mut(out, per, 1, |ci, c| run(ci * per, c)),
        None => run(0, out),
    }
}

/// How [`gemv_packed`] splits `n` outputs of depth `k` over `threads` threads: one
/// contiguous run of `per` columns (whole panels of `nr`) per thread, or `None` (one
/// task). [`rows_alone`] splits the same way.
fn packed_gemv_split(n: usize, k: usize, nr: usize, threads: usize) -> Option<usize> {
    let panels = n.div_ceil(nr);
    (n * k >= GRAIN_SIZE && panels >= 2 && threads > 1).then(|| panels.div_ceil(threads) * nr)
}

/// Elements `offset + i * step` of `d` as f32 into `xs` (one copy for a contiguous f32
/// run): the one vector of a matrix-vector product, gathered once.
fn gather<'x>(d: &Elems<'_>, offset: usize, step: usize, xs: &'x mut [f32]) -> &'x [f32] {
    match d {
        Elems::F32(s) if step == 1 => xs.copy_from_slice(&s[offset..offset + xs.len()]),
        _ => {
            for (i, v) in xs.iter_mut().enumerate() {
                *v = get(d, offset + i * step);
            }
        }
    }
    xs
}

/// Dot-product path: each output is a dot product against a contiguous row.
fn gemv_rows<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    out: &mut [O],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    let (m, n, k) = g.dims();
    // Orient as: x (length k) against `rows` weight rows w_j = W[j, :].
    let (x, w, rows, transposed) = if m == 1 && g.b.rs == 1 {
        (g.a, g.b, n, false)
    } else {
        // n == 1 and A's rows are k-contiguous: out[i] = dot(A[i, :], B[:, 0]).
        (g.b, g.a, m, true)
    };
    let step = if transposed { x.rs } else { x.cs };
    let xs = gather(&x.data, x.offset, step, &mut scratch[..k]);
    // Row stride and first element of the weight rows.
    let (ldw, base) = if transposed {
        (w.rs, w.offset)
    } else {
        (w.cs, w.offset)
    };
    let run = |first: usize, chunk: &mut [O]| {
        let mut buf = [0f32; DOT_ROWS_BLOCK];
        for (ci, piece) in chunk.chunks_mut(DOT_ROWS_BLOCK).enumerate() {
            let j0 = first + ci * DOT_ROWS_BLOCK;
            let dots = &mut buf[..piece.len()];
            let start = base + j0 * ldw;
            match w.data {
                Elems::F32(s) => dot_rows(isa, xs, &s[start..], ldw, dots),
                Elems::F16(s) => dot_rows(isa, xs, &s[start..], ldw, dots),
                Elems::BF16(s) => dot_rows(isa, xs, &s[start..], ldw, dots),
                Elems::F64(s) => dot_rows(isa, xs, &s[start..], ldw, dots),
            }
            for (jj, (o, &d)) in piece.iter_mut().zip(dots.iter()).enumerate() {
                let j = j0 + jj;
                let (i, jn) = if transposed { (j, 0) } else { (0, j) };
                *o = O::from_f32(finish(g, d, i, jn));
            }
        }
    };
    match dot_rows_split(rows, k, pool.threads()) {
        Some(per) => pool.for_each_chunk_mut(out, per, 1, |ci, c| run(ci * per, c)),
        None => run(0, out),
    }
    Ok(())
}

/// Weight rows one [`gemv_rows`] pass takes at a time (their dot products on the stack).
const DOT_ROWS_BLOCK: usize = 64;

/// How [`gemv_rows`] splits `rows` dot products of depth `k` over `threads` threads:
/// runs of `per` rows, a few per thread for balance and each at least 4 rows, or
/// `None` (one task). [`rows_alone`] splits the same way.
fn dot_rows_split(rows: usize, k: usize, threads: usize) -> Option<usize> {
    (rows * k >= GRAIN_SIZE && rows >= 8 && threads > 1).then(|| rows.div_ceil(threads * 4).max(4))
}

/// Output columns one [`gemv_axpy`] pass accumulates (on the stack, 16 KiB, in L1):
/// a classifier's whole row (MobileNetV2's 1000 outputs), so that its B streams from
/// memory in one sequential run rather than row pieces a page apart (0.71 -> 0.61 ms
/// for MobileNetV2's 1280 x 1000 layer on one thread).
const AXPY_COLS: usize = 4096;

/// `x · B` for one row `x` of A and an f32 B with contiguous rows: the outputs of a
/// block of columns accumulate `x[k] * B[k, ..]` for each `k` in order, so B is read
/// once, row run by row run, without packing. `scratch` holds at least `k` values.
fn gemv_axpy<O: OutElem>(
    pool: &ThreadPool,
    isa: Isa,
    g: &Gemm<'_>,
    out: &mut [O],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    let (_, n, k) = g.dims();
    let Elems::F32(b) = g.b.data else {
        return gemv_rows(pool, isa, g, out, scratch);
    };
    let (xs, partials) = scratch.split_at_mut(k);
    let xs = gather(&g.a.data, g.a.offset, g.a.cs, xs);
    let tasks = axpy_depth_tasks(n, k, pool.threads());
    if tasks > 1 {
        // Each task sums its own run of B's rows, all columns; then the partial sums
        // are added in task order and finished.
        let per = k.div_ceil(tasks);
        let partials = &mut partials[..tasks * n];
        pool.for_each_chunk_mut(partials, n, 1, |t, acc| {
            let rows = (t * per).min(k)..((t + 1) * per).min(k);
            acc.fill(0.0);
            let start = g.b.offset + rows.start * g.b.rs;
            axpy_rows(isa, &xs[rows], b, start, g.b.rs, acc);
        });
        let (sum, rest) = partials.split_at_mut(n);
        for part in rest.chunks_exact(n) {
            for (s, &v) in sum.iter_mut().zip(part) {
                *s += v;
            }
        }
        finish_row(g, sum, 0, 0, out);
        return Ok(());
    }
    let run = |first: usize, chunk: &mut [O]| {
        for (ci, piece) in chunk.chunks_mut(AXPY_COLS).enumerate() {
            let c0 = first + ci * AXPY_COLS;
            let mut acc = [0f32; AXPY_COLS];
            let acc = &mut acc[..piece.len()];
            axpy_rows(isa, xs, b, g.b.offset + c0, g.b.rs, acc);
            finish_row(g, acc, 0, c0, piece);
        }
    };
    match axpy_split(n, k, pool.threads()) {
        Some(per) => pool.for_each_chunk_mut(out, per, 1, |ci, c| run(ci * per, c)),
        None => run(0, out),
    }
    Ok(())
}

/// How [`gemv_axpy`] splits `n` columns over `threads` threads when it does not split
/// the depth: runs of `per` columns, or `None` (one task).
fn axpy_split(n: usize, k: usize, threads: usize) -> Option<usize> {
    (n * k >= GRAIN_SIZE && n >= 64 && threads > 1)
        .then(|| n.div_ceil(threads).next_multiple_of(16))
}

/// Fewest rows of B per task when [`gemv_axpy`] splits its depth.
const AXPY_MIN_TASK_ROWS: usize = 128;

/// Into how many runs of B's rows [`gemv_axpy`] splits a product of `n` columns and
/// depth `k` on `threads` threads (1: it splits the columns, or runs on one thread).
/// Each task then streams one contiguous run of B rather than a slice of every row: on
/// a 2-vCPU Xeon, MobileNetV2's classifier (1280 x 1000, 5 MB, streamed from L3) took
/// 122-144 us split by depth against 172-205 us split by columns, and the same on one
/// thread either way.
fn axpy_depth_tasks(n: usize, k: usize, threads: usize) -> usize {
    if threads > 1 && n <= AXPY_COLS && n * k >= GRAIN_SIZE {
        threads.min(k / AXPY_MIN_TASK_ROWS).max(1)
    } else {
        1
    }
}

/// `acc[j] += xs[kk] * b[start + kk * ld + j]` for every `kk` in order, compiled for
/// `isa`'s vectors.
fn axpy_rows(isa: Isa, xs: &[f32], b: &[f32], start: usize, ld: usize, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = isa.avx512() {
        avx512::axpy_rows(cpu, xs, b, start, ld, acc);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = isa.avx2() {
        avx2::axpy_rows(cpu, xs, b, start, ld, acc);
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa.neon().is_some() {
        axpy_rows_body::<true>(xs, b, start, ld, acc);
        return;
    }
    let _ = isa;
    axpy_rows_body::<false>(xs, b, start, ld, acc);
}

/// The body of [`axpy_rows`]; `FUSED` rounds `x * v + a` once (where the CPU has fused
/// multiply-adds; elsewhere `mul_add` would be a library call per element).
#[inline(always)]
fn axpy_rows_body<const FUSED: bool>(
    xs: &[f32],
    b: &[f32],
    start: usize,
    ld: usize,
    acc: &mut [f32],
) {
    let madd = |x: f32, v: f32, a: f32| if FUSED { x.mul_add(v, a) } else { x * v + a };
    let n = acc.len();
    let row = |kk: usize| &b[start + kk * ld..][..n];
    // Four rows a pass: each accumulator is loaded and stored once for four of B's
    // streams, its products still added in row order (the values of one row a pass).
    let fours = xs.len() / 4 * 4;
    for (q, x) in xs[..fours].chunks_exact(4).enumerate() {
        let (r0, r1, r2, r3) = (row(4 * q), row(4 * q + 1), row(4 * q + 2), row(4 * q + 3));
        for (j, a) in acc.iter_mut().enumerate() {
            let v = madd(x[0], r0[j], *a);
            let v = madd(x[1], r1[j], v);
            let v = madd(x[2], r2[j], v);
            *a = madd(x[3], r3[j], v);
        }
    }
    for (kk, &x) in xs.iter().enumerate().skip(fours) {
        for (a, &v) in acc.iter_mut().zip(row(kk)) {
            *a = madd(x, v, *a);
        }
    }
}

#[cfg(test)]
mod tests;
