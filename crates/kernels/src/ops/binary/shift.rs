//! The bit shifts of `bitwise_left_shift` and `bitwise_right_shift`, on values held
//! in i64 that the caller narrows to the common dtype afterwards.
//!
//! Within range (`0 <= b < width`) they are C's shifts of the common dtype, which the
//! official portable kernel applies (a left shift wraps to the width; a right shift is
//! arithmetic for signed dtypes, logical for unsigned ones). C leaves other shift
//! counts undefined; these follow PyTorch's CPU kernels for them: a left shift by a
//! negative count or by the width or more gives 0, a right shift gives the sign
//! fill (0 or -1, 0 for unsigned dtypes).

use etch_base::ScalarType;

/// The width and signedness of the common dtype a shift runs in.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bits {
    width: i64,
    signed: bool,
}

impl Bits {
    /// The integer (or bool) `dtype`'s width and signedness.
    pub(super) fn of(dtype: ScalarType) -> Self {
        Bits {
            width: dtype.element_size() as i64 * 8,
            signed: !matches!(
                dtype,
                ScalarType::Bool
                    | ScalarType::Byte
                    | ScalarType::UInt16
                    | ScalarType::UInt32
                    | ScalarType::UInt64
            ),
        }
    }
}

/// `a << b` (see the module documentation).
#[inline(always)]
pub(super) fn left(a: i64, b: i64, bits: Bits) -> i64 {
    if (0..bits.width).contains(&b) {
        a.wrapping_shl(b as u32)
    } else {
        0
    }
}

/// `a >> b` (see the module documentation). `a` holds a value of the common dtype:
/// sign-extended when signed, zero-extended otherwise (all 64 bits for u64).
#[inline(always)]
pub(super) fn right(a: i64, b: i64, bits: Bits) -> i64 {
    let in_range = (0..bits.width).contains(&b);
    match (bits.signed, in_range) {
        (true, true) => a >> b,
        (true, false) => a >> 63,
        (false, true) => ((a as u64) >> b) as i64,
        (false, false) => 0,
    }
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;

    use super::{Bits, left, right};
    use crate::testing::Harness;

    #[test]
    fn shifts_follow_c_within_range_and_pytorch_outside() {
        let i8b = Bits::of(ScalarType::Char);
        let u8b = Bits::of(ScalarType::Byte);
        let i64b = Bits::of(ScalarType::Long);
        assert_eq!(left(100, 1, i8b) as i8, -56);
        assert_eq!(left(1, 8, i8b), 0);
        assert_eq!(left(1, -1, i8b), 0);
        assert_eq!(left(1, 63, i64b), i64::MIN);
        assert_eq!(right(-5, 1, i8b), -3);
        assert_eq!(right(-5, 9, i8b), -1);
        assert_eq!(right(5, 9, i8b), 0);
        assert_eq!(right(200, 3, u8b), 25);
        assert_eq!(right(200, 8, u8b), 0);
        assert_eq!(right(-1, 60, Bits::of(ScalarType::UInt64)), 15);
    }

    /// The shift ops element by element on broadcast i32 tensors, and with a scalar.
    #[test]
    fn shift_ops_match_the_elementwise_rule() {
        let a: Vec<i32> = vec![1, -7, 1 << 30, 12345, -1, 0];
        let b: Vec<i32> = vec![0, 1, 2, 31, 33, -2];
        let mut h = Harness::new();
        let x = h.tensor(&[6, 1], &a);
        let y = h.tensor(&[6], &b);
        for (op, shl) in [
            ("aten::bitwise_left_shift.Tensor_out", true),
            ("aten::bitwise_right_shift.Tensor_out", false),
        ] {
            let out = h.out(ScalarType::Int, &[6, 6]);
            h.call(op, &[x, y, out, out]).unwrap();
            let want: Vec<i32> = a
                .iter()
                .flat_map(|&p| {
                    b.iter().map(move |&q| match (shl, (0..32).contains(&q)) {
                        (true, true) => p.wrapping_shl(q as u32),
                        (true, false) => 0,
                        (false, true) => p >> q,
                        (false, false) => p >> 31,
                    })
                })
                .collect();
            assert_eq!(h.read::<i32>(out), want, "{op}");
        }
        let u = h.tensor(&[3], &[0x80u8, 3, 255]);
        let two = h.int(2);
        let out = h.out(ScalarType::Byte, &[3]);
        h.call(
            "aten::bitwise_left_shift.Tensor_Scalar_out",
            &[u, two, out, out],
        )
        .unwrap();
        assert_eq!(h.read::<u8>(out), vec![0, 12, 252]);
        h.call(
            "aten::bitwise_right_shift.Tensor_Scalar_out",
            &[u, two, out, out],
        )
        .unwrap();
        assert_eq!(h.read::<u8>(out), vec![32, 0, 63]);
        // A float operand is refused.
        let f = h.tensor(&[3], &[1.0f32, 2.0, 3.0]);
        let fo = h.out(ScalarType::Float, &[3]);
        assert!(
            h.call(
                "aten::bitwise_left_shift.Tensor_Scalar_out",
                &[f, two, fo, fo]
            )
            .is_err()
        );
        let half = h.double(0.5);
        assert!(
            h.call(
                "aten::bitwise_right_shift.Tensor_Scalar_out",
                &[u, half, out, out]
            )
            .is_err()
        );
    }
}
