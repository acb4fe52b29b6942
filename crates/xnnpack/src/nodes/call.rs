//! What a node gets when it runs: the pool, every value's dims for this call, its input
//! slices and output slice in the arena (or the call's own tensors), and scratch; and
//! the small helpers the node kinds share to check and split them.

use etch_kernels::{KernelError, ThreadPool};

use crate::dims::Dims;

/// Most values one node reads (`Concatenate5`).
pub const MAX_INPUTS: usize = 5;

/// The value indices a node reads, in operand order.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inputs {
    ids: [usize; MAX_INPUTS],
    len: usize,
}

impl Inputs {
    /// The first [`MAX_INPUTS`] of `ids`.
    pub fn new(ids: &[usize]) -> Self {
        let mut inputs = Self::default();
        ids.iter().for_each(|&v| inputs.push(v));
        inputs
    }

    /// Appends value `v` (nothing when full).
    pub fn push(&mut self, v: usize) {
        if let Some(slot) = self.ids.get_mut(self.len) {
            *slot = v;
            self.len += 1;
        }
    }

    /// The value indices.
    pub fn as_slice(&self) -> &[usize] {
        &self.ids[..self.len]
    }
}

/// Working memory of one call, shared by its nodes in turn: the im2col blocks (f32, or
/// int8 bytes four to a word) and the GEMM scratch after them.
pub struct Scratch<'a> {
    buffer: &'a mut [f32],
    im2col_len: usize,
}

impl<'a> Scratch<'a> {
    /// `buffer` holding `im2col_len` elements of im2col blocks, then GEMM scratch.
    pub fn new(buffer: &'a mut [f32], im2col_len: usize) -> Self {
        Self { buffer, im2col_len }
    }

    /// The im2col part and the GEMM part.
    pub fn parts(&mut self) -> (&mut [f32], &mut [f32]) {
        let at = self.im2col_len.min(self.buffer.len());
        self.buffer.split_at_mut(at)
    }

    /// The whole buffer, for a node that splits it per task itself (each task's im2col
    /// block and GEMM scratch side by side).
    pub fn whole(&mut self) -> &mut [f32] {
        self.buffer
    }
}

/// One node's run: its operands for this call.
pub struct NodeCall<'a> {
    /// The pool the node splits its work over.
    pub pool: &'a ThreadPool,
    /// Dims of every value for this call.
    pub shapes: &'a [Dims],
    /// The node's input slices in [`Inputs`] order (f32 elements; an int8 value's bytes
    /// four to a word, see [`int8`]).
    pub inputs: [&'a [f32]; MAX_INPUTS],
    /// The output slice (at least the output's elements).
    pub output: &'a mut [f32],
    /// Scratch for im2col blocks and GEMMs.
    pub scratch: Scratch<'a>,
}

/// The error of an operand or scratch buffer shorter than its node needs.
pub fn short(what: &str) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {what}: operand too short"))
}

/// The error of a kernel of `etch-linalg` that refused its operands.
pub fn linalg(e: etch_linalg::LinalgError) -> KernelError {
    KernelError::invalid(format!("XNNPACK delegate: {e}"))
}

/// `Ok` when a linalg kernel that reports success as a `bool` succeeded.
pub fn checked(ok: bool, what: &str) -> Result<(), KernelError> {
    if ok { Ok(()) } else { Err(short(what)) }
}

/// The int8 bytes of a qint8 value's arena words.
pub fn int8(words: &[f32]) -> &[i8] {
    bytemuck::cast_slice(words)
}

/// The int8 bytes of a qint8 value's arena words, mutably.
pub fn int8_mut(words: &mut [f32]) -> &mut [i8] {
    bytemuck::cast_slice_mut(words)
}

/// XNNPACK's `output_min/max` as a GEMM clamp (`None` when it clamps nothing).
pub fn clamp_of(min: f32, max: f32) -> Option<(f32, f32)> {
    (min > f32::NEG_INFINITY || max < f32::INFINITY).then_some((min, max))
}

/// Runs `f` on each image of a batch of `batch`: the consecutive blocks of `in_len`
/// elements of `x` and of `out_len` elements of `out` (`what` names the node in the
/// error when either is short).
pub fn per_image<T, U>(
    what: &str,
    batch: usize,
    (x, in_len): (&[T], usize),
    (out, out_len): (&mut [U], usize),
    mut f: impl FnMut(&[T], &mut [U]) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    for b in 0..batch {
        let src = x
            .get(b * in_len..(b + 1) * in_len)
            .ok_or_else(|| short(what))?;
        let dst = out
            .get_mut(b * out_len..(b + 1) * out_len)
            .ok_or_else(|| short(what))?;
        f(src, dst)?;
    }
    Ok(())
}

/// Output elements below which an elementwise node (or concatenation) runs on one
/// thread: a task handed to a spinning worker costs about a microsecond, so the
/// work per task must be several microseconds.
const MIN_PARALLEL_ELEMENTS: usize = 16 * 1024;

/// How many tasks an elementwise node of `len` output elements is split into: one per
/// thread, or one when it is small.
pub fn elementwise_tasks(pool: &ThreadPool, len: usize) -> usize {
    if len < MIN_PARALLEL_ELEMENTS {
        1
    } else {
        pool.threads().clamp(1, len / (MIN_PARALLEL_ELEMENTS / 2))
    }
}
