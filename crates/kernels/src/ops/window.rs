//! Sliding-window arguments shared by convolution and pooling: per-dimension
//! `kernel_size` / `stride` / `padding` / `dilation` lists (one value broadcast to
//! every spatial dim, as PyTorch accepts), and the output-size rule of
//! ExecuTorch's `calculate_kernel_output_sizes`.

use crate::{IntList, KernelError, Tensor};

/// The values of int-list argument `list` for `dims` spatial dimensions: a list of
/// `dims` values as is, one value repeated, and an empty list as `default` (`None`:
/// empty is an error). Every value must be at least `min`.
pub fn spatial_list<const D: usize>(
    list: &IntList<'_>,
    dims: usize,
    default: Option<[i64; D]>,
    min: i64,
    what: &str,
) -> Result<[usize; D], KernelError> {
    let mut out = [0usize; D];
    for d in 0..dims.min(D) {
        let v = match list.len() {
            0 => match default {
                Some(def) => def[d],
                None => {
                    return Err(KernelError::invalid(format!("{what} must not be empty")));
                }
            },
            1 => list.get(0)?,
            n if n == dims => list.get(d)?,
            n => {
                return Err(KernelError::invalid(format!(
                    "{what} has {n} values for {dims} spatial dims"
                )));
            }
        };
        if v < min {
            return Err(KernelError::invalid(format!(
                "{what} value {v} is below {min}"
            )));
        }
        out[d] = usize::try_from(v).map_err(|_| KernelError::invalid(format!("{what} {v}")))?;
    }
    Ok(out)
}

/// Output length of a window over `size` input elements (`ceil_mode` as PyTorch's
/// pooling: the last window may overhang, but must start inside the input or its
/// left padding). `None` when no window fits.
pub fn output_len(
    size: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Option<usize> {
    let span = dilation
        .checked_mul(kernel.checked_sub(1)?)?
        .checked_add(1)?;
    let padded = size.checked_add(pad.checked_mul(2)?)?;
    let room = padded.checked_sub(span)?;
    let stride = stride.max(1);
    let mut n = if ceil_mode {
        room.div_ceil(stride) + 1
    } else {
        room / stride + 1
    };
    if ceil_mode && (n - 1) * stride >= size + pad {
        n -= 1;
    }
    Some(n)
}

/// Fails unless `t` has rank 3 or 4 (`[C, H, W]` / `[N, C, H, W]`) and the contiguous
/// or (4-d) channels-last dim order; returns `(batch, channels, h, w)`.
pub fn nchw_dims(t: &Tensor, what: &str) -> Result<(usize, usize, usize, usize), KernelError> {
    super::layout::require_nchw_or_channels_last(t, what)?;
    match *t.sizes() {
        [c, h, w] => Ok((1, c, h, w)),
        [n, c, h, w] => Ok((n, c, h, w)),
        _ => Err(KernelError::invalid(format!(
            "{what}: expected a 3-d or 4-d tensor, got shape {:?}",
            t.sizes()
        ))),
    }
}

/// Fails unless `t` is in the contiguous dim order (channels-last and other orders are
/// refused with a typed error naming the tensor).
pub fn require_contiguous(t: &Tensor, what: &str) -> Result<(), KernelError> {
    if t.is_contiguous() {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "{what}: dim order {:?} is not supported (contiguous only)",
            t.dim_order()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lengths_follow_pytorch() {
        assert_eq!(output_len(224, 7, 2, 3, 1, false), Some(112));
        assert_eq!(output_len(112, 3, 2, 1, 1, false), Some(56));
        // ceil_mode: 5 with k2 s2 gives 3, but a window starting in the right padding
        // is dropped.
        assert_eq!(output_len(5, 2, 2, 0, 1, true), Some(3));
        assert_eq!(output_len(5, 2, 2, 0, 1, false), Some(2));
        assert_eq!(output_len(4, 2, 2, 1, 1, true), Some(3));
        assert_eq!(output_len(2, 5, 1, 0, 1, false), None);
        assert_eq!(output_len(3, 0, 1, 0, 1, false), None);
    }
}
