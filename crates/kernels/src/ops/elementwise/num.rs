//! Arithmetic on the three compute types (f32, f64, i64) with PyTorch's semantics:
//! integers wrap, floats follow IEEE, `maximum`/`minimum` propagate NaN.

use super::dtype::Element;

/// A compute type.
pub trait Num: Element + PartialOrd + Copy {
    const FLOAT: bool;
    const ZERO: Self;
    const ONE: Self;

    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// True division for floats; truncating division for integers (`o != 0`).
    fn div(self, o: Self) -> Self;
    /// Division rounded toward zero (integers: `o != 0`).
    fn div_trunc(self, o: Self) -> Self;
    /// Division rounded toward negative infinity (integers: `o != 0`).
    fn div_floor(self, o: Self) -> Self;
    /// C's `fmod`: the remainder of the truncating division, with the sign of `self`
    /// (integers: `o != 0`).
    fn fmod(self, o: Self) -> Self;
    /// Python's modulo: the remainder of the flooring division, with the sign of `o`
    /// (integers: `o != 0`).
    fn remainder(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn is_nan(self) -> bool;
    /// Larger of two; NaN if either is NaN.
    #[inline(always)]
    fn maximum(self, o: Self) -> Self {
        if self.is_nan() || self > o { self } else { o }
    }
    /// Smaller of two; NaN if either is NaN.
    #[inline(always)]
    fn minimum(self, o: Self) -> Self {
        if self.is_nan() || self < o { self } else { o }
    }
    fn pow(self, e: Self) -> Self;
    fn bitand(self, o: Self) -> Self;
    fn bitor(self, o: Self) -> Self;
    fn bitxor(self, o: Self) -> Self;
    fn bitnot(self) -> Self;
    // Transcendentals (integers go through f64; kernels promote them to float first).
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    /// `1 / (1 + exp(-x))`.
    #[inline(always)]
    fn sigmoid(self) -> Self {
        Self::ONE.div(Self::ONE.add(self.neg().exp()))
    }
    /// `1 / sqrt(x)`.
    #[inline(always)]
    fn rsqrt(self) -> Self {
        Self::ONE.div(self.sqrt())
    }
}

/// `Num` methods that apply one operator: `fn name(self, o) -> Self { self op o }`.
macro_rules! operator_methods {
    ($($name:ident => $op:tt),* $(,)?) => {$(
        #[inline(always)]
        fn $name(self, o: Self) -> Self {
            self $op o
        }
    )*};
}

/// Binary `Num` methods that call another method: `fn name(self, o) -> Self {
/// self.method(o) }`.
macro_rules! method_alias {
    ($($name:ident => $method:ident),* $(,)?) => {$(
        #[inline(always)]
        fn $name(self, o: Self) -> Self {
            self.$method(o)
        }
    )*};
}

/// `Num` methods that are the float type's inherent function of the same name.
macro_rules! float_methods {
    ($t:ty: $($name:ident),* $(,)?) => {$(
        #[inline(always)]
        fn $name(self) -> Self {
            <$t>::$name(self)
        }
    )*};
}

/// `Num` methods of an integer computed in f64 and truncated back.
macro_rules! via_f64_methods {
    ($($name:ident),* $(,)?) => {$(
        fn $name(self) -> Self {
            f64::$name(self as f64) as Self
        }
    )*};
}

macro_rules! float_num {
    ($t:ty, $erf:path) => {
        impl Num for $t {
            const FLOAT: bool = true;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            operator_methods!(add => +, sub => -, mul => *, div => /, fmod => %);
            float_methods!($t: abs, exp, ln, sqrt, sin, cos, tanh);
            #[inline(always)]
            fn div_trunc(self, o: Self) -> Self {
                (self / o).trunc()
            }
            #[inline]
            fn div_floor(self, o: Self) -> Self {
                // PyTorch's div_floor_floating: exact quotient from fmod, then floor.
                if o == 0.0 {
                    return self / o;
                }
                let m = self % o;
                let mut div = (self - m) / o;
                if m != 0.0 && ((o < 0.0) != (m < 0.0)) {
                    div -= 1.0;
                }
                if div != 0.0 {
                    let f = div.floor();
                    if div - f > 0.5 { f + 1.0 } else { f }
                } else {
                    (0.0 as $t).copysign(self / o)
                }
            }
            #[inline]
            fn remainder(self, o: Self) -> Self {
                let m = self % o;
                if m != 0.0 && ((o < 0.0) != (m < 0.0)) {
                    m + o
                } else {
                    m
                }
            }
            #[inline(always)]
            fn neg(self) -> Self {
                -self
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline]
            fn pow(self, e: Self) -> Self {
                if e == 2.0 {
                    self * self
                } else if e == 1.0 {
                    self
                } else if e == 0.5 {
                    <$t>::sqrt(self)
                } else {
                    <$t>::powf(self, e)
                }
            }
            #[inline(always)]
            fn bitand(self, _: Self) -> Self {
                self
            }
            #[inline(always)]
            fn bitor(self, _: Self) -> Self {
                self
            }
            #[inline(always)]
            fn bitxor(self, _: Self) -> Self {
                self
            }
            #[inline(always)]
            fn bitnot(self) -> Self {
                self
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
        }
    };
}

float_num!(f32, libm::erff);
float_num!(f64, libm::erf);

impl Num for i64 {
    const FLOAT: bool = false;
    const ZERO: Self = 0;
    const ONE: Self = 1;
    operator_methods!(bitand => &, bitor => |, bitxor => ^);
    // Integers wrap, as PyTorch's do; `div` of integers truncates.
    method_alias!(add => wrapping_add, sub => wrapping_sub, mul => wrapping_mul, div => div_trunc);
    via_f64_methods!(exp, ln, sqrt, sin, cos, tanh);
    #[inline(always)]
    fn div_trunc(self, o: Self) -> Self {
        if o == 0 { 0 } else { self.wrapping_div(o) }
    }
    #[inline(always)]
    fn div_floor(self, o: Self) -> Self {
        if o == 0 {
            return 0;
        }
        let q = self.wrapping_div(o);
        if self.wrapping_rem(o) != 0 && ((self < 0) != (o < 0)) {
            q.wrapping_sub(1)
        } else {
            q
        }
    }
    #[inline(always)]
    fn fmod(self, o: Self) -> Self {
        if o == 0 { 0 } else { self.wrapping_rem(o) }
    }
    #[inline(always)]
    fn remainder(self, o: Self) -> Self {
        let m = self.fmod(o);
        if m != 0 && ((o < 0) != (m < 0)) {
            m.wrapping_add(o)
        } else {
            m
        }
    }
    #[inline(always)]
    fn neg(self) -> Self {
        self.wrapping_neg()
    }
    #[inline(always)]
    fn abs(self) -> Self {
        self.wrapping_abs()
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        false
    }
    #[inline]
    fn pow(self, e: Self) -> Self {
        if e < 0 {
            return match self {
                1 => 1,
                -1 => {
                    if e % 2 == 0 {
                        1
                    } else {
                        -1
                    }
                }
                _ => 0,
            };
        }
        let (mut base, mut e, mut acc) = (self, e as u64, 1i64);
        while e > 0 {
            if e & 1 == 1 {
                acc = acc.wrapping_mul(base);
            }
            base = base.wrapping_mul(base);
            e >>= 1;
        }
        acc
    }
    #[inline(always)]
    fn bitnot(self) -> Self {
        !self
    }
    fn erf(self) -> Self {
        libm::erf(self as f64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_semantics() {
        assert_eq!(Num::div_floor(-7i64, 2), -4);
        assert_eq!(Num::div_floor(7i64, -2), -4);
        assert_eq!(Num::div_trunc(-7i64, 2), -3);
        assert_eq!(Num::div_trunc(i64::MIN, -1), i64::MIN);
        assert_eq!(Num::pow(3i64, 4), 81);
        assert_eq!(Num::pow(2i64, -1), 0);
        assert_eq!(Num::pow(-1i64, -3), -1);
        assert_eq!(Num::add(i64::MAX, 1), i64::MIN);
        assert_eq!(Num::fmod(-7i64, 3), -1);
        assert_eq!(Num::remainder(-7i64, 3), 2);
        assert_eq!(Num::remainder(7i64, -3), -2);
        assert_eq!(Num::remainder(i64::MIN, -1), 0);
    }

    #[test]
    fn float_semantics() {
        assert_eq!(Num::div_floor(-7.0f32, 2.0), -4.0);
        assert_eq!(Num::div_floor(7.5f64, -2.0), -4.0);
        assert!(Num::div_floor(1.0f32, 0.0).is_infinite());
        assert!(Num::maximum(f32::NAN, 1.0).is_nan());
        assert!(Num::maximum(1.0f32, f32::NAN).is_nan());
        assert!(Num::minimum(f64::NAN, 1.0).is_nan());
        assert_eq!(Num::minimum(2.0f32, 1.0), 1.0);
        assert_eq!(Num::div_trunc(-0.5f32, 1.0), 0.0);
        assert_eq!(Num::fmod(-7.5f32, 2.0), -1.5);
        assert_eq!(Num::remainder(-7.5f32, 2.0), 0.5);
        assert_eq!(Num::remainder(7.5f64, -2.0), -0.5);
        assert!(Num::remainder(1.0f32, 0.0).is_nan());
        assert!((Num::erf(1.0f32) - 0.842_700_8).abs() < 1e-6);
    }
}

/// The float types kernels compute in (f32, f64) with their operators, for kernels
/// that write formulas directly (distances, sampling coordinates).
pub trait Real:
    Element
    + PartialOrd
    + Copy
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Rem<Output = Self>
    + std::ops::AddAssign
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// `|self|`.
    fn abs(self) -> Self;
    /// The square root.
    fn sqrt(self) -> Self;
    /// `self` to the power `e`.
    fn powf(self, e: Self) -> Self;
    /// The largest integer not above `self`.
    fn floor(self) -> Self;
    /// Rounds half-way cases to even, as C's `nearbyint` in the default mode.
    fn round_ties_even(self) -> Self;
    /// The value of an `i64` (rounded to nearest).
    fn of_i64(v: i64) -> Self;
    /// Truncated toward zero, saturating (NaN gives 0), as Rust's `as i64`.
    fn trunc_i64(self) -> i64;
}

macro_rules! real {
    ($($t:ty),*) => {$(
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn abs(self) -> Self { <$t>::abs(self) }
            fn sqrt(self) -> Self { <$t>::sqrt(self) }
            fn powf(self, e: Self) -> Self { <$t>::powf(self, e) }
            fn floor(self) -> Self { <$t>::floor(self) }
            fn round_ties_even(self) -> Self { <$t>::round_ties_even(self) }
            fn of_i64(v: i64) -> Self { v as $t }
            fn trunc_i64(self) -> i64 { self as i64 }
        }
    )*};
}

real!(f32, f64);
