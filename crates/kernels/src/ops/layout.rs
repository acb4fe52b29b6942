//! Channels-last tensors for the kernels written over NCHW planes (convolution,
//! pooling, upsampling, padding, batch and group norm).
//!
//! A 4-d tensor in ExecuTorch's channels-last dim order `[0, 2, 3, 1]` keeps its
//! logical sizes `[N, C, H, W]` but stores its elements pixel by pixel (NHWC). The
//! portable kernels accept it, as upstream's do: [`read_nchw`] hands such an input to
//! the kernel transposed into NCHW scratch (a contiguous input is read in place), and
//! [`NchwOut`] gives the kernel an NCHW buffer for a channels-last out tensor and
//! transposes it into the tensor's memory when the kernel is done. Scratch comes from
//! the kernel's temp allocator, so nothing is allocated on the heap. Each tensor is
//! looked at on its own: a contiguous input may feed a channels-last output.

use bytemuck::Pod;
use etch_linalg::layout::transpose_batched;

use crate::{Element, KernelContext, KernelError, Tensor};

/// ExecuTorch's channels-last dim order of a 4-d tensor.
const CHANNELS_LAST: [u8; 4] = [0, 2, 3, 1];

/// True when `t` is 4-d and stored channels-last.
pub fn is_channels_last(t: &Tensor) -> bool {
    t.dim_order() == CHANNELS_LAST
}

/// Fails unless `t` is contiguous or 4-d channels-last, with an error naming `what`.
pub fn require_nchw_or_channels_last(t: &Tensor, what: &str) -> Result<(), KernelError> {
    if t.is_contiguous() || is_channels_last(t) {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "{what}: dim order {:?} is not supported (contiguous or channels-last only)",
            t.dim_order()
        )))
    }
}

/// `(batch, channels, pixels)` of an image tensor.
type Extents = (usize, usize, usize);

/// [`Extents`] of a channels-last tensor's logical `[N, C, H, W]`.
fn image_extents(t: &Tensor) -> Extents {
    match *t.sizes() {
        [n, c, h, w] => (n, c, h * w),
        _ => (0, 0, 0),
    }
}

fn layout_error(what: &str) -> KernelError {
    KernelError::invalid(format!(
        "{what}: storage length does not match the channels-last shape"
    ))
}

/// The elements of `t` in NCHW (row-major logical) order: its own memory when it is
/// contiguous, a transposed copy in scratch when it is channels-last.
pub fn read_nchw<'c, T: Element + Pod>(
    ctx: &'c KernelContext<'_>,
    t: &Tensor,
    what: &str,
) -> Result<&'c [T], KernelError> {
    require_nchw_or_channels_last(t, what)?;
    let src = ctx.read::<T>(t)?;
    if t.is_contiguous() {
        return Ok(src);
    }
    let (n, c, px) = image_extents(t);
    let staged = ctx.scratch::<T>(src.len())?;
    // NHWC is [pixels, channels] per image; NCHW is its transpose.
    if !transpose_batched(src, staged, n, px, c) {
        return Err(layout_error(what));
    }
    Ok(staged)
}

/// An NCHW buffer for an out tensor: the tensor's own memory when it is contiguous,
/// scratch when it is channels-last. Call [`NchwOut::finish`] after the kernel has
/// written it; a channels-last tensor receives its data only then.
pub struct NchwOut<'c, T> {
    dst: &'c mut [T],
    /// The NCHW scratch and the image's extents when `dst` is channels-last.
    staged: Option<(&'c mut [T], Extents)>,
}

impl<'c, T: Element + Pod> NchwOut<'c, T> {
    /// The buffer for `out` (already resized to its final shape).
    pub fn new(ctx: &'c KernelContext<'_>, out: &Tensor, what: &str) -> Result<Self, KernelError> {
        require_nchw_or_channels_last(out, what)?;
        let dst = ctx.write::<T>(out)?;
        let staged = if out.is_contiguous() {
            None
        } else {
            Some((ctx.scratch::<T>(dst.len())?, image_extents(out)))
        };
        Ok(Self { dst, staged })
    }

    /// Where the kernel writes, in NCHW order.
    pub fn data(&mut self) -> &mut [T] {
        match &mut self.staged {
            Some((buf, _)) => buf,
            None => &mut *self.dst,
        }
    }

    /// Moves what the kernel wrote into the out tensor's memory.
    pub fn finish(self, what: &str) -> Result<(), KernelError> {
        if let Some((buf, (n, c, px))) = self.staged
            && !transpose_batched(buf, self.dst, n, c, px)
        {
            return Err(layout_error(what));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;

    use crate::testing::Harness;

    const CL: [u8; 4] = [0, 2, 3, 1];
    const CONTIGUOUS: [u8; 4] = [0, 1, 2, 3];

    /// Builds an op's argument list from the harness, the image input and the outs.
    type BuildArgs<'a> = &'a dyn Fn(&mut Harness, usize, &[usize]) -> Vec<usize>;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let v = i
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                (v >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Runs `op` with its image input and out tensors in each combination of
    /// contiguous and channels-last, and checks every result equals the all-contiguous
    /// one. `args` builds the argument list from (input, outs, harness);
    /// `outs` are the out tensors' bounds (f32, or i64 for max-pool indices).
    fn same_in_every_layout(
        op: &str,
        input: [usize; 4],
        outs: &[(ScalarType, [usize; 4])],
        args: BuildArgs<'_>,
    ) {
        let data = values(input.iter().product(), 7);
        let run = |in_order: [u8; 4], out_order: [u8; 4]| {
            let mut h = Harness::new();
            let x = h.tensor_with_order(&input, &in_order, &data);
            let o: Vec<usize> = outs
                .iter()
                .map(|(dt, b)| h.out_with_order(*dt, b, &out_order))
                .collect();
            let a = args(&mut h, x, &o);
            h.call(op, &a).unwrap_or_else(|e| panic!("{op}: {e}"));
            o.iter()
                .map(|&i| match h.tensor_meta(i).dtype() {
                    ScalarType::Long => h
                        .read_logical::<i64>(i)
                        .into_iter()
                        .map(|v| v as f64)
                        .collect::<Vec<_>>(),
                    _ => h
                        .read_logical::<f32>(i)
                        .into_iter()
                        .map(f64::from)
                        .collect(),
                })
                .collect::<Vec<_>>()
        };
        let want = run(CONTIGUOUS, CONTIGUOUS);
        for (i, o) in [(CL, CL), (CL, CONTIGUOUS), (CONTIGUOUS, CL)] {
            assert_eq!(run(i, o), want, "{op} with input {i:?}, out {o:?}");
        }
    }

    #[test]
    fn convolution_in_every_layout() {
        let (f32_, n) = (ScalarType::Float, 2);
        for groups in [1i64, 2, 4] {
            same_in_every_layout(
                "aten::convolution.out",
                [n, 4, 7, 6],
                &[(f32_, [n, 8, 4, 3])],
                &|h, x, o| {
                    let w = h.tensor_with_order(
                        &[8, 4 / groups as usize, 3, 3],
                        &CL,
                        &values(8 * (4 / groups as usize) * 9, 3),
                    );
                    let b = h.tensor(&[8], &values(8, 5));
                    let stride = h.int_list(&[2, 2]);
                    let pad = h.int_list(&[1, 1]);
                    let dil = h.int_list(&[1, 1]);
                    let tr = h.bool(false);
                    let opad = h.int_list(&[0, 0]);
                    let g = h.int(groups);
                    vec![x, w, b, stride, pad, dil, tr, opad, g, o[0], o[0]]
                },
            );
        }
    }

    #[test]
    fn pooling_in_every_layout() {
        let (f, i) = (ScalarType::Float, ScalarType::Long);
        same_in_every_layout(
            "aten::max_pool2d_with_indices.out",
            [1, 3, 6, 5],
            &[(f, [1, 3, 3, 2]), (i, [1, 3, 3, 2])],
            &|h, x, o| {
                let k = h.int_list(&[2, 2]);
                let s = h.int_list(&[2, 2]);
                let p = h.int_list(&[0, 0]);
                let d = h.int_list(&[1, 1]);
                let ceil = h.bool(false);
                let ret = h.none();
                vec![x, k, s, p, d, ceil, o[0], o[1], ret]
            },
        );
        same_in_every_layout(
            "aten::avg_pool2d.out",
            [2, 3, 6, 5],
            &[(f, [2, 3, 3, 3])],
            &|h, x, o| {
                let k = h.int_list(&[3, 3]);
                let s = h.int_list(&[2, 2]);
                let p = h.int_list(&[1, 1]);
                let ceil = h.bool(false);
                let include = h.bool(true);
                let div = h.none();
                vec![x, k, s, p, ceil, include, div, o[0], o[0]]
            },
        );
        same_in_every_layout(
            "aten::_adaptive_avg_pool2d.out",
            [1, 5, 7, 4],
            &[(f, [1, 5, 3, 2])],
            &|h, x, o| {
                let size = h.int_list(&[3, 2]);
                vec![x, size, o[0], o[0]]
            },
        );
    }

    #[test]
    fn resampling_padding_and_norms_in_every_layout() {
        let f = ScalarType::Float;
        same_in_every_layout(
            "aten::upsample_bilinear2d.vec_out",
            [1, 3, 4, 5],
            &[(f, [1, 3, 8, 10])],
            &|h, x, o| {
                let size = h.none();
                let align = h.bool(false);
                let scales = h.push(crate::EValue::DoubleList(vec![2.0, 2.0].into()));
                vec![x, size, align, scales, o[0], o[0]]
            },
        );
        same_in_every_layout(
            "aten::upsample_nearest2d.vec_out",
            [1, 3, 4, 5],
            &[(f, [1, 3, 8, 10])],
            &|h, x, o| {
                let size = h.int_list(&[8, 10]);
                let scales = h.none();
                vec![x, size, scales, o[0], o[0]]
            },
        );
        same_in_every_layout(
            "aten::constant_pad_nd.out",
            [1, 3, 4, 5],
            &[(f, [1, 3, 7, 6])],
            &|h, x, o| {
                let pad = h.int_list(&[0, 1, 2, 1]);
                let v = h.double(0.5);
                vec![x, pad, v, o[0], o[0]]
            },
        );
        same_in_every_layout(
            "aten::_native_batch_norm_legit_no_training.out",
            [2, 3, 4, 5],
            &[(f, [2, 3, 4, 5])],
            &|h, x, o| {
                let o1 = h.out(ScalarType::Float, &[0]);
                let o2 = h.out(ScalarType::Float, &[0]);
                let ret = h.tensor_list(&[o[0], o1, o2]);
                let w = h.tensor(&[3], &values(3, 1));
                let b = h.tensor(&[3], &values(3, 2));
                let mean = h.tensor(&[3], &values(3, 3));
                let var = h.tensor(&[3], &[0.5f32, 1.0, 2.0]);
                let momentum = h.double(0.1);
                let eps = h.double(1e-5);
                vec![x, w, b, mean, var, momentum, eps, o[0], o1, o2, ret]
            },
        );
    }
}
