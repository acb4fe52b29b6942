//! Copies of short runs of f32 (a panel row, a plane row) without a `memcpy` call:
//! the compiler turns a plain copy loop of unknown length into one, whose call costs
//! more than copying the few dozen values the packing and plane kernels move at a
//! time.

/// `dst.copy_from_slice(src)` over the shorter length: whole blocks of 16, then the
/// last 16, 8, 4 or 1-3 values as straight-line moves, overlapping what is already
/// copied.
#[inline(always)]
pub(crate) fn copy_floats(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    match n {
        16.. => {
            let (dst_blocks, _) = dst.as_chunks_mut::<16>();
            let (src_blocks, _) = src.as_chunks::<16>();
            for (d, s) in dst_blocks.iter_mut().zip(src_blocks) {
                *d = *s;
            }
            dst[n - 16..].copy_from_slice(&src[n - 16..]);
        }
        8.. => {
            dst[..8].copy_from_slice(&src[..8]);
            dst[n - 8..].copy_from_slice(&src[n - 8..]);
        }
        4.. => {
            dst[..4].copy_from_slice(&src[..4]);
            dst[n - 4..].copy_from_slice(&src[n - 4..]);
        }
        _ => {
            for (d, &s) in dst.iter_mut().zip(src).take(3) {
                *d = s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::copy_floats;

    #[test]
    fn copies_every_length_exactly() {
        let src: Vec<f32> = (0..80).map(|i| i as f32 + 0.5).collect();
        for n in 0..80 {
            let mut dst = vec![-1f32; n + 3];
            copy_floats(&mut dst[..n], &src[..n]);
            assert_eq!(&dst[..n], &src[..n], "length {n}");
            assert!(
                dst[n..].iter().all(|&v| v == -1.0),
                "length {n} wrote past the end"
            );
            // A longer source copies only as much as the destination holds.
            let mut short = vec![-1f32; n];
            copy_floats(&mut short, &src);
            assert_eq!(&short[..], &src[..n]);
        }
    }
}
