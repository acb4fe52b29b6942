//! The Rust types that store one element of a tensor dtype, and PyTorch's casts
//! between them.
//!
//! Every cast goes through the widest value of the source's kind ([`CastKind`]: f32
//! for f32, f16 and bf16, f64, i64 for integers, bool), so each (source, destination)
//! pair rounds once: float to int truncates toward zero (saturating at the i64 range,
//! then wrapping to the narrower width, as C++ does on common hardware), anything to
//! bool tests `!= 0`, bool to a number is 0 or 1, and f64 to f16/bf16 goes through
//! f32 like c10's `Half`.

use bytemuck::{Pod, Zeroable};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::ScalarType;

/// A bool element as stored: one byte, 0 or 1 (any non-zero byte reads as true).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct Bool8(pub u8);

/// Which widest value an element type converts through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CastKind {
    /// `Bool8`.
    Bool,
    /// The integer types, through i64.
    Int,
    /// f32 and the 16-bit floats (exact in f32).
    F32,
    /// f64.
    F64,
}

/// A Rust type that stores one element of a tensor dtype, with PyTorch's conversions
/// to and from the widest values (use [`cast`] between two element types).
pub trait Element: Pod + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static {
    /// The dtype this type stores.
    const DTYPE: ScalarType;
    /// The widest value this type converts through.
    const KIND: CastKind;
    /// The value as f32.
    fn to_f32(self) -> f32;
    /// The value as f64.
    fn to_f64(self) -> f64;
    /// The value as i64 (floats truncate toward zero; u64 wraps).
    fn to_i64(self) -> i64;
    /// The value `!= 0`.
    fn to_bool(self) -> bool;
    /// From an f32 (floats round to nearest even, ints truncate, bool is `!= 0`).
    fn from_f32(v: f32) -> Self;
    /// From an f64 (f16/bf16 through f32, ints truncate, bool is `!= 0`).
    fn from_f64(v: f64) -> Self;
    /// From an i64 (ints wrap, floats round, bool is `!= 0`).
    fn from_i64(v: i64) -> Self;
    /// From a bool (0 or 1).
    fn from_bool(v: bool) -> Self;
}

/// Converts one element with PyTorch's semantics, rounding once.
///
/// ```
/// use etch_base::{Bool8, cast};
/// assert_eq!(cast::<f32, i32>(-2.7), -2);
/// assert_eq!(cast::<i64, i8>(300), 44);
/// assert_eq!(cast::<f32, Bool8>(0.5), Bool8(1));
/// ```
#[inline(always)]
pub fn cast<I: Element, O: Element>(x: I) -> O {
    match I::KIND {
        CastKind::Bool => O::from_bool(x.to_bool()),
        CastKind::Int => O::from_i64(x.to_i64()),
        CastKind::F32 => O::from_f32(x.to_f32()),
        CastKind::F64 => O::from_f64(x.to_f64()),
    }
}

/// Converts `src` into `dst` element by element (equal lengths; the shorter one
/// bounds the copy), with [`cast`]'s semantics; f16/bf16 to and from f32 go through
/// `half`'s vectorised slice conversion.
#[inline]
pub fn cast_slice<I: Element, O: Element>(src: &[I], dst: &mut [O]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    if I::DTYPE == O::DTYPE
        && let Ok(same) = bytemuck::try_cast_slice::<I, O>(src)
    {
        dst.copy_from_slice(same);
        return;
    }
    if half_to_f32(src, dst).is_some() || f32_to_half(src, dst).is_some() {
        return;
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = cast(x);
    }
}

/// f16/bf16 to f32 through `half`'s vectorised slice conversion.
#[inline]
fn half_to_f32<I: Element, O: Element>(src: &[I], dst: &mut [O]) -> Option<()> {
    if O::DTYPE != ScalarType::Float {
        return None;
    }
    let d: &mut [f32] = bytemuck::try_cast_slice_mut(dst).ok()?;
    match I::DTYPE {
        ScalarType::Half => {
            let s: &[f16] = bytemuck::try_cast_slice(src).ok()?;
            s.convert_to_f32_slice(d);
            Some(())
        }
        ScalarType::BFloat16 => {
            let s: &[bf16] = bytemuck::try_cast_slice(src).ok()?;
            s.convert_to_f32_slice(d);
            Some(())
        }
        _ => None,
    }
}

/// f32 to f16/bf16 through `half`'s vectorised slice conversion.
#[inline]
fn f32_to_half<I: Element, O: Element>(src: &[I], dst: &mut [O]) -> Option<()> {
    if I::DTYPE != ScalarType::Float {
        return None;
    }
    let s: &[f32] = bytemuck::try_cast_slice(src).ok()?;
    match O::DTYPE {
        ScalarType::Half => {
            let d: &mut [f16] = bytemuck::try_cast_slice_mut(dst).ok()?;
            d.convert_from_f32_slice(s);
            Some(())
        }
        ScalarType::BFloat16 => {
            let d: &mut [bf16] = bytemuck::try_cast_slice_mut(dst).ok()?;
            d.convert_from_f32_slice(s);
            Some(())
        }
        _ => None,
    }
}

macro_rules! int_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: ScalarType = ScalarType::$d;
            const KIND: CastKind = CastKind::Int;
            #[inline(always)]
            fn to_f32(self) -> f32 { self as f32 }
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn to_bool(self) -> bool { self != 0 }
            #[inline(always)]
            fn from_f32(v: f32) -> Self { v as i64 as $t }
            #[inline(always)]
            fn from_f64(v: f64) -> Self { v as i64 as $t }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
            #[inline(always)]
            fn from_bool(v: bool) -> Self { v as $t }
        }
    )*};
}

int_element!(
    i8 => Char,
    u8 => Byte,
    i16 => Short,
    i32 => Int,
    i64 => Long,
    u16 => UInt16,
    u32 => UInt32,
    u64 => UInt64,
);

macro_rules! float_element {
    ($($t:ty => $d:ident, $kind:ident);* $(;)?) => {$(
        impl Element for $t {
            const DTYPE: ScalarType = ScalarType::$d;
            const KIND: CastKind = CastKind::$kind;
            #[inline(always)]
            fn to_f32(self) -> f32 { self as f32 }
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn to_bool(self) -> bool { self != 0.0 }
            #[inline(always)]
            fn from_f32(v: f32) -> Self { v as $t }
            #[inline(always)]
            fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
            #[inline(always)]
            fn from_bool(v: bool) -> Self { v as u8 as $t }
        }
    )*};
}

float_element!(f32 => Float, F32; f64 => Double, F64);

macro_rules! half_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: ScalarType = ScalarType::$d;
            const KIND: CastKind = CastKind::F32;
            #[inline(always)]
            fn to_f32(self) -> f32 { <$t>::to_f32(self) }
            #[inline(always)]
            fn to_f64(self) -> f64 { <$t>::to_f32(self) as f64 }
            #[inline(always)]
            fn to_i64(self) -> i64 { <$t>::to_f32(self) as i64 }
            #[inline(always)]
            fn to_bool(self) -> bool { <$t>::to_f32(self) != 0.0 }
            #[inline(always)]
            fn from_f32(v: f32) -> Self { <$t>::from_f32(v) }
            #[inline(always)]
            fn from_f64(v: f64) -> Self { <$t>::from_f32(v as f32) }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { <$t>::from_f32(v as f32) }
            #[inline(always)]
            fn from_bool(v: bool) -> Self { <$t>::from_f32(v as u8 as f32) }
        }
    )*};
}

half_element!(f16 => Half, bf16 => BFloat16);

impl Element for Bool8 {
    const DTYPE: ScalarType = ScalarType::Bool;
    const KIND: CastKind = CastKind::Bool;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        (self.0 != 0) as u8 as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        (self.0 != 0) as u8 as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        (self.0 != 0) as i64
    }
    #[inline(always)]
    fn to_bool(self) -> bool {
        self.0 != 0
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        Bool8((v != 0.0) as u8)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        Bool8((v != 0.0) as u8)
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Bool8((v != 0) as u8)
    }
    #[inline(always)]
    fn from_bool(v: bool) -> Self {
        Bool8(v as u8)
    }
}

/// PyTorch's `canCast(from, to)`: no float to integral, no non-bool to bool.
pub fn can_cast(from: ScalarType, to: ScalarType) -> bool {
    if from.is_floating_point() && to.is_integral() {
        return false;
    }
    !(from != ScalarType::Bool && to == ScalarType::Bool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_follow_pytorch() {
        assert_eq!(cast::<f32, i32>(-2.7), -2);
        assert_eq!(cast::<f32, u8>(-1.0), 255);
        assert_eq!(cast::<f64, i8>(300.0), 44);
        assert_eq!(cast::<i64, i8>(300), 44);
        assert_eq!(cast::<f32, Bool8>(0.5), Bool8(1));
        assert_eq!(cast::<f32, Bool8>(f32::NAN), Bool8(1));
        assert_eq!(cast::<Bool8, f32>(Bool8(1)), 1.0);
        assert_eq!(cast::<Bool8, i64>(Bool8(2)), 1);
        assert_eq!(cast::<i64, i8>(129), -127);
        assert_eq!(cast::<f32, f16>(1.0009766), f16::from_f32(1.0009766));
        assert_eq!(cast::<f64, f16>(1.5), f16::from_f32(1.5));
        assert_eq!(cast::<i64, f32>(16_777_217), 16_777_216.0);
        assert_eq!(cast::<f16, f64>(f16::from_f32(0.5)), 0.5);
        assert_eq!(cast::<f32, i64>(f32::NAN), 0);
        assert!(can_cast(ScalarType::Long, ScalarType::Float));
        assert!(!can_cast(ScalarType::Float, ScalarType::Long));
        assert!(!can_cast(ScalarType::Long, ScalarType::Bool));
    }

    #[test]
    fn slices_cast_like_elements() {
        let src = [1.0f32 / 3.0, -2.5, 65504.0, f32::NAN, 0.0];
        let mut h = [f16::ZERO; 5];
        cast_slice(&src, &mut h);
        for (&x, &y) in src.iter().zip(&h) {
            assert_eq!(cast::<f32, f16>(x).to_bits(), y.to_bits());
        }
        let mut back = [0f32; 5];
        cast_slice(&h, &mut back);
        for (&x, &y) in h.iter().zip(&back) {
            assert_eq!(cast::<f16, f32>(x).to_bits(), y.to_bits());
        }
        let mut ints = [0i8; 5];
        cast_slice(&src, &mut ints);
        assert_eq!(ints, [0, -2, -32, 0, 0]);
    }
}
