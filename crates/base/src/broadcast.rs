//! PyTorch broadcasting of shapes and of strided views.

use crate::MAX_RANK;

/// Broadcasts `shapes` (right-aligned, PyTorch rules) into `buf`; returns the filled
/// prefix, or `None` when they do not broadcast or the rank exceeds [`MAX_RANK`].
///
/// ```
/// let mut buf = [0; etch_base::MAX_RANK];
/// assert_eq!(etch_base::broadcast_shapes(&[&[3, 1], &[1, 4]], &mut buf), Some(&[3, 4][..]));
/// ```
pub fn broadcast_shapes<'b>(
    shapes: &[&[usize]],
    buf: &'b mut [usize; MAX_RANK],
) -> Option<&'b [usize]> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    if rank > MAX_RANK {
        return None;
    }
    for d in 0..rank {
        let mut size = 1usize;
        for s in shapes {
            let off = rank - s.len();
            if d < off {
                continue;
            }
            let v = s[d - off];
            if v == size || v == 1 {
                continue;
            }
            if size == 1 {
                size = v;
            } else {
                return None;
            }
        }
        buf[d] = size;
    }
    Some(&buf[..rank])
}

/// Strides that read a view of `sizes`/`strides` broadcast to `target` (right-aligned;
/// 0 along broadcast dims), into `buf`; `None` when it does not broadcast or `buf` is
/// shorter than `target`.
pub fn broadcast_strides<'b>(
    sizes: &[usize],
    strides: &[usize],
    target: &[usize],
    buf: &'b mut [usize],
) -> Option<&'b [usize]> {
    if sizes.len() > target.len() || target.len() > buf.len() || strides.len() < sizes.len() {
        return None;
    }
    let lead = target.len() - sizes.len();
    for (d, &t) in target.iter().enumerate() {
        buf[d] = if d < lead {
            0
        } else {
            let s = sizes[d - lead];
            if s == t {
                if s == 1 { 0 } else { strides[d - lead] }
            } else if s == 1 {
                0
            } else {
                return None;
            }
        };
    }
    Some(&buf[..target.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rules() {
        let mut buf = [0; MAX_RANK];
        assert_eq!(
            broadcast_shapes(&[&[1, 5, 64], &[64]], &mut buf),
            Some(&[1, 5, 64][..])
        );
        assert_eq!(broadcast_shapes(&[&[], &[2]], &mut buf), Some(&[2][..]));
        assert_eq!(
            broadcast_shapes(&[&[0, 1], &[3]], &mut buf),
            Some(&[0, 3][..])
        );
        assert_eq!(broadcast_shapes(&[&[2, 3], &[3, 2]], &mut buf), None);
        let mut s = [0; 4];
        assert_eq!(
            broadcast_strides(&[3, 1], &[1, 1], &[2, 3, 4], &mut s),
            Some(&[0, 1, 0][..])
        );
        assert_eq!(broadcast_strides(&[3], &[1], &[4], &mut s), None);
    }
}
