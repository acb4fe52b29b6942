//! `pixel_shuffle.out` and `pixel_unshuffle.out`: moves blocks of `r x r` channels
//! into `r x r` spatial tiles and back, over the last three dims `[C, H, W]` (any
//! leading dims). Each is one strided gather of the shared copy engine; both tensors
//! must be contiguous and of one dtype.

use crate::ops::shape::common::{Strided, checked_numel, copy_tensor, require_copy_pair};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::pixel_shuffle.out", pixel_shuffle);
    r.register("aten::pixel_unshuffle.out", pixel_unshuffle);
}

/// The input split as `[leading, C, H, W]` with a checked factor `r` and `r * r`.
struct Image {
    leading: usize,
    c: usize,
    h: usize,
    w: usize,
    r: usize,
    rr: usize,
}

impl Image {
    fn of(input: &Tensor, factor: i64, what: &str) -> Result<Self, KernelError> {
        let rank = input.rank();
        if rank < 3 {
            return Err(KernelError::invalid(format!(
                "{what}: input of rank {rank} (at least 3 dims, [.., C, H, W])"
            )));
        }
        if factor <= 0 {
            return Err(KernelError::invalid(format!(
                "{what}: factor must be positive, got {factor}"
            )));
        }
        let r = usize::try_from(factor)
            .map_err(|_| KernelError::invalid(format!("{what}: factor {factor} too large")))?;
        let rr = r
            .checked_mul(r)
            .ok_or_else(|| KernelError::invalid(format!("{what}: factor {factor} too large")))?;
        let s = input.sizes();
        // Every stride of the gathers below is at most C*H*W.
        checked_numel(&s[rank - 3..])?;
        Ok(Image {
            leading: checked_numel(&s[..rank - 3])?,
            c: s[rank - 3],
            h: s[rank - 2],
            w: s[rank - 1],
            r,
            rr,
        })
    }
}

/// Resizes `out` to `input`'s leading dims followed by `chw` and gathers `input`
/// through `layout(..)` into it (an empty input builds no layout).
fn gather_image(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    input: &Tensor,
    out: OutArg,
    chw: [usize; 3],
    layout: impl FnOnce() -> Result<Strided, KernelError>,
) -> Result<(), KernelError> {
    let rank = input.rank();
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank - 3].copy_from_slice(&input.sizes()[..rank - 3]);
    sizes[rank - 3..rank].copy_from_slice(&chw);
    require_copy_pair(input, &out.tensor())?;
    let out = out.resize(a, &sizes[..rank])?;
    require_copy_pair(input, &out)?;
    if input.numel() == 0 {
        return Ok(());
    }
    copy_tensor(ctx, input, &out, 0, &layout()?)
}

op_args! {
    /// `pixel_shuffle.out(Tensor self, int upscale_factor, *, Tensor(a!) out)`:
    /// `[.., C*r*r, H, W] -> [.., C, H*r, W*r]`.
    struct PixelShuffleArgs = "aten::pixel_shuffle.out" {
        input: Tensor,
        upscale_factor: i64,
        out: OutArg,
    } returns 1
}

fn pixel_shuffle(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let PixelShuffleArgs {
        input,
        upscale_factor,
        out,
    } = PixelShuffleArgs::unpack(a)?;
    let Image {
        leading,
        c,
        h,
        w,
        r,
        rr,
    } = Image::of(&input, upscale_factor, "pixel_shuffle")?;
    if c % rr != 0 {
        return Err(KernelError::invalid(format!(
            "pixel_shuffle: {c} channels do not divide by the factor squared ({rr})"
        )));
    }
    let oc = c / rr;
    let too_big = || KernelError::invalid("pixel_shuffle: out size overflows");
    let oh = h.checked_mul(r).ok_or_else(too_big)?;
    let ow = w.checked_mul(r).ok_or_else(too_big)?;
    // Out element [n, oc, y*r + i, x*r + j] is input [n, oc*r*r + i*r + j, y, x]:
    // gather over [n, oc, y, i, x, j].
    let plane = h * w;
    gather_image(ctx, a, &input, out, [oc, oh, ow], || {
        Strided::new(
            &[leading, oc, h, r, w, r],
            &[c * plane, rr * plane, w, r * plane, 1, plane],
        )
    })
}

op_args! {
    /// `pixel_unshuffle.out(Tensor self, int downscale_factor, *, Tensor(a!) out)`:
    /// `[.., C, H*r, W*r] -> [.., C*r*r, H, W]`.
    struct PixelUnshuffleArgs = "aten::pixel_unshuffle.out" {
        input: Tensor,
        downscale_factor: i64,
        out: OutArg,
    } returns 1
}

fn pixel_unshuffle(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let PixelUnshuffleArgs {
        input,
        downscale_factor,
        out,
    } = PixelUnshuffleArgs::unpack(a)?;
    let Image {
        leading,
        c,
        h,
        w,
        r,
        rr,
    } = Image::of(&input, downscale_factor, "pixel_unshuffle")?;
    if h % r != 0 || w % r != 0 {
        return Err(KernelError::invalid(format!(
            "pixel_unshuffle: spatial size {h}x{w} does not divide by the factor {r}"
        )));
    }
    let (oh, ow) = (h / r, w / r);
    let oc = c
        .checked_mul(rr)
        .ok_or_else(|| KernelError::invalid("pixel_unshuffle: out size overflows"))?;
    // Out element [n, c*r*r + i*r + j, y, x] is input [n, c, y*r + i, x*r + j]:
    // gather over [n, c, i, j, y, x].
    gather_image(ctx, a, &input, out, [oc, oh, ow], || {
        Strided::new(
            &[leading, c, r, r, oh, ow],
            &[c * h * w, h * w, w, 1, r * w, r],
        )
    })
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::testing::Harness;

    /// Reference pixel shuffle of row-major `[n, c*r*r, h, w]` data.
    fn shuffle_ref(data: &[i32], n: usize, c: usize, h: usize, w: usize, r: usize) -> Vec<i32> {
        let ic = c * r * r;
        let mut out = Vec::with_capacity(data.len());
        for b in 0..n {
            for oc in 0..c {
                for y in 0..h * r {
                    for x in 0..w * r {
                        let ch = oc * r * r + (y % r) * r + x % r;
                        out.push(data[((b * ic + ch) * h + y / r) * w + x / r]);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn shuffle_small_case() {
        let mut h = Harness::new();
        let x = h.tensor(&[4, 1, 2], &[0i32, 1, 2, 3, 4, 5, 6, 7]);
        let f = h.int(2);
        let out = h.out(ScalarType::Int, &[1, 2, 4]);
        h.call("aten::pixel_shuffle.out", &[x, f, out, out])
            .unwrap();
        assert_eq!(h.read::<i32>(out), vec![0, 2, 1, 3, 4, 6, 5, 7]);
        let back = h.out(ScalarType::Int, &[4, 1, 2]);
        h.call("aten::pixel_unshuffle.out", &[out, f, back, back])
            .unwrap();
        assert_eq!(h.read::<i32>(back), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut h = Harness::new();
        let x = h.tensor(&[3, 2, 2], &[0f32; 12]);
        let out = h.out(ScalarType::Float, &[12, 2, 2]);
        let flat = h.tensor(&[4, 4], &[0f32; 16]);
        for (op, input, factor) in [
            ("aten::pixel_shuffle.out", x, 2),
            ("aten::pixel_shuffle.out", x, 0),
            ("aten::pixel_shuffle.out", x, -1),
            ("aten::pixel_shuffle.out", x, i64::MAX),
            ("aten::pixel_shuffle.out", flat, 1),
            ("aten::pixel_unshuffle.out", x, 3),
            ("aten::pixel_unshuffle.out", x, 0),
            ("aten::pixel_unshuffle.out", flat, 1),
        ] {
            let f = h.int(factor);
            assert!(h.call(op, &[input, f, out, out]).is_err(), "{op} {factor}");
        }
        let one = h.int(1);
        let wrong = h.out(ScalarType::Int, &[3, 2, 2]);
        assert!(
            h.call("aten::pixel_shuffle.out", &[x, one, wrong, wrong])
                .is_err()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn shuffle_matches_reference_and_unshuffle_inverts(
            n in 0usize..3, c in 1usize..3, hh in 1usize..4, ww in 1usize..4, r in 1usize..4,
            lead_rank in 0usize..2,
        ) {
            let ic = c * r * r;
            let data: Vec<i32> = (0..(n * ic * hh * ww) as i32).collect();
            let want = shuffle_ref(&data, n, c, hh, ww, r);
            let mut in_shape = vec![ic, hh, ww];
            let mut out_shape = vec![c, hh * r, ww * r];
            if lead_rank == 1 {
                in_shape.insert(0, n);
                out_shape.insert(0, n);
            } else if n != 1 {
                return Ok(());
            }
            let mut h = Harness::new();
            let x = h.tensor(&in_shape, &data);
            let f = h.int(r as i64);
            let out = h.out(ScalarType::Int, &out_shape);
            h.call("aten::pixel_shuffle.out", &[x, f, out, out]).unwrap();
            prop_assert_eq!(h.read::<i32>(out), want);
            let back = h.out(ScalarType::Int, &in_shape);
            h.call("aten::pixel_unshuffle.out", &[out, f, back, back]).unwrap();
            prop_assert_eq!(h.read::<i32>(back), data);
        }
    }
}
