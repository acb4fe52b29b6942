//! Element conversions with PyTorch's cast semantics, and tensor bytes viewed as a
//! slice of whichever dtype they hold.
//!
//! Every cast goes through the widest value of the source's kind (f32 for f32, f16 and
//! bf16, f64, i64 for integers, bool), so each (source, destination) pair rounds once:
//! float to int truncates toward zero (saturating at the i64 range, then wrapping to
//! the narrower width, as C++ does on common hardware), anything to bool tests `!= 0`,
//! bool to a number is 0 or 1, and f64 to f16/bf16 goes through f32 like c10's `Half`.

use std::sync::Mutex;

use bytemuck::Pod;
use etch_base::ScalarType;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::{KernelContext, KernelError, Scalar, Tensor, ThreadPool};

pub use etch_base::Bool8;

/// Which widest value a dtype converts through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Bool,
    Int,
    /// f32 and the 16-bit floats (exact in f32).
    F32,
    F64,
}

/// A tensor element type with PyTorch's conversions.
pub trait Elem: Pod + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: ScalarType;
    const KIND: Kind;
    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    fn to_bool(self) -> bool;
    fn from_f32(v: f32) -> Self;
    fn from_f64(v: f64) -> Self;
    fn from_i64(v: i64) -> Self;
    fn from_bool(v: bool) -> Self;

    /// A `Scalar` argument converted to this type.
    #[inline]
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Int(v) => Self::from_i64(v),
            Scalar::Double(v) => Self::from_f64(v),
            Scalar::Bool(v) => Self::from_bool(v),
        }
    }
}

/// Converts one element, rounding once.
#[inline(always)]
pub fn cast<I: Elem, O: Elem>(x: I) -> O {
    match I::KIND {
        Kind::Bool => O::from_bool(x.to_bool()),
        Kind::Int => O::from_i64(x.to_i64()),
        Kind::F32 => O::from_f32(x.to_f32()),
        Kind::F64 => O::from_f64(x.to_f64()),
    }
}

macro_rules! int_elem {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Elem for $t {
            const DTYPE: ScalarType = ScalarType::$d;
            const KIND: Kind = Kind::Int;
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

int_elem!(
    i8 => Char,
    u8 => Byte,
    i16 => Short,
    i32 => Int,
    i64 => Long,
    u16 => UInt16,
    u32 => UInt32,
    u64 => UInt64,
);

impl Elem for f32 {
    const DTYPE: ScalarType = ScalarType::Float;
    const KIND: Kind = Kind::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn to_bool(self) -> bool {
        self != 0.0
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_bool(v: bool) -> Self {
        v as u8 as f32
    }
}

impl Elem for f64 {
    const DTYPE: ScalarType = ScalarType::Double;
    const KIND: Kind = Kind::F64;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn to_bool(self) -> bool {
        self != 0.0
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_bool(v: bool) -> Self {
        v as u8 as f64
    }
}

macro_rules! half_elem {
    ($($t:ty => $d:ident),*) => {$(
        impl Elem for $t {
            const DTYPE: ScalarType = ScalarType::$d;
            const KIND: Kind = Kind::F32;
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

half_elem!(f16 => Half, bf16 => BFloat16);

impl Elem for Bool8 {
    const DTYPE: ScalarType = ScalarType::Bool;
    const KIND: Kind = Kind::Bool;
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

/// Calls `$body` with `$E` bound to the Rust type of `$dtype`, for the thirteen dtypes
/// kernels compute with; other dtypes evaluate `$other`.
macro_rules! with_elem {
    ($dtype:expr, $E:ident => $body:expr, $other:expr) => {{
        use half::{bf16, f16};
        #[allow(unused_imports)]
        use $crate::ops::elementwise::dtype::Bool8;
        match $dtype {
            etch_base::ScalarType::Float => {
                type $E = f32;
                $body
            }
            etch_base::ScalarType::Double => {
                type $E = f64;
                $body
            }
            etch_base::ScalarType::Half => {
                type $E = f16;
                $body
            }
            etch_base::ScalarType::BFloat16 => {
                type $E = bf16;
                $body
            }
            etch_base::ScalarType::Char => {
                type $E = i8;
                $body
            }
            etch_base::ScalarType::Byte => {
                type $E = u8;
                $body
            }
            etch_base::ScalarType::Short => {
                type $E = i16;
                $body
            }
            etch_base::ScalarType::Int => {
                type $E = i32;
                $body
            }
            etch_base::ScalarType::Long => {
                type $E = i64;
                $body
            }
            etch_base::ScalarType::UInt16 => {
                type $E = u16;
                $body
            }
            etch_base::ScalarType::UInt32 => {
                type $E = u32;
                $body
            }
            etch_base::ScalarType::UInt64 => {
                type $E = u64;
                $body
            }
            etch_base::ScalarType::Bool => {
                type $E = Bool8;
                $body
            }
            _ => $other,
        }
    }};
}
pub(crate) use with_elem;

/// Calls `$body` with `$C` bound to the type elementwise arithmetic of `$dtype` runs
/// in: f64 for f64, f32 for the other floats, i64 for integers and bool.
macro_rules! with_compute {
    ($dtype:expr, $C:ident => $body:expr) => {{
        let dt: etch_base::ScalarType = $dtype;
        if dt == etch_base::ScalarType::Double {
            type $C = f64;
            $body
        } else if dt.is_floating_point() {
            type $C = f32;
            $body
        } else {
            type $C = i64;
            $body
        }
    }};
}
pub(crate) use with_compute;

/// The error for a dtype outside the thirteen supported ones.
pub fn unsupported(dtype: ScalarType, what: &'static str) -> KernelError {
    KernelError::UnsupportedDtype { dtype, what }
}

/// True for the dtypes kernels compute with.
pub fn is_supported(dtype: ScalarType) -> bool {
    with_elem!(dtype, E => { let _ = std::mem::size_of::<E>(); true }, false)
}

/// Rounds every value of `s` through `dtype` (a narrower type than `T`, or `T`
/// itself): the step that makes arithmetic in a wide type give the narrow type's
/// result.
pub fn narrow_slice<T: Elem>(dtype: ScalarType, s: &mut [T]) {
    if dtype == T::DTYPE {
        return;
    }
    match dtype {
        ScalarType::Half => roundtrip::<T, f16>(s),
        ScalarType::BFloat16 => roundtrip::<T, bf16>(s),
        ScalarType::Float => roundtrip::<T, f32>(s),
        ScalarType::Char => roundtrip::<T, i8>(s),
        ScalarType::Byte => roundtrip::<T, u8>(s),
        ScalarType::Short => roundtrip::<T, i16>(s),
        ScalarType::Int => roundtrip::<T, i32>(s),
        ScalarType::UInt16 => roundtrip::<T, u16>(s),
        ScalarType::UInt32 => roundtrip::<T, u32>(s),
        ScalarType::Bool => roundtrip::<T, Bool8>(s),
        _ => {}
    }
}

/// True when rounding a `T` through `dtype` can change it.
pub fn narrows<T: Elem>(dtype: ScalarType) -> bool {
    dtype != T::DTYPE
        && !matches!(
            dtype,
            ScalarType::Long | ScalarType::Double | ScalarType::UInt64
        )
}

fn roundtrip<T: Elem, X: Elem>(s: &mut [T]) {
    for v in s {
        *v = cast::<X, T>(cast::<T, X>(*v));
    }
}

macro_rules! typed_slices {
    ($($var:ident($t:ty) = $d:ident),* $(,)?) => {
        /// A tensor's elements, typed by its dtype.
        #[derive(Clone, Copy)]
        pub enum In<'a> { $($var(&'a [$t])),* }

        /// A tensor's elements, mutably, typed by its dtype.
        pub enum Out<'a> { $($var(&'a mut [$t])),* }

        impl<'a> In<'a> {
            /// The elements of `t` (current numel).
            pub fn read(ctx: &'a KernelContext<'_>, t: &Tensor) -> Result<Self, KernelError> {
                Ok(match t.dtype() {
                    $(ScalarType::$d => In::$var(ctx.read_raw::<$t>(t)?),)*
                    other => return Err(unsupported(other, "tensor element access")),
                })
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                match self { $(In::$var(s) => s.len()),* }
            }

            /// True when there are no elements.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// The dtype.
            pub fn dtype(&self) -> ScalarType {
                match self { $(In::$var(_) => ScalarType::$d),* }
            }

            /// The elements as `C`, when `C` is their type.
            pub fn as_slice<C: Elem>(&self) -> Option<&'a [C]> {
                if C::DTYPE != self.dtype() {
                    return None;
                }
                match *self { $(In::$var(s) => bytemuck::try_cast_slice(s).ok()),* }
            }

            /// Element `i` converted to `C` (`i` must be in bounds).
            #[inline]
            pub fn get<C: Elem>(&self, i: usize) -> C {
                match self { $(In::$var(s) => cast(s[i])),* }
            }

            /// `dst.len()` elements from `off` with stride `stride`, converted to `C`.
            /// The caller has checked that the last one is in bounds.
            #[inline]
            pub fn load<C: Elem>(&self, off: usize, stride: usize, dst: &mut [C]) {
                match self { $(In::$var(s) => load_from(s, off, stride, dst)),* }
            }
        }

        impl<'a> Out<'a> {
            /// The elements of `t` (current numel), mutably.
            pub fn write(ctx: &'a KernelContext<'_>, t: &Tensor) -> Result<Self, KernelError> {
                Ok(match t.dtype() {
                    $(ScalarType::$d => Out::$var(ctx.write_raw::<$t>(t)?),)*
                    other => return Err(unsupported(other, "tensor element access")),
                })
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                match self { $(Out::$var(s) => s.len()),* }
            }

            /// True when there are no elements.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// The elements as `R`, when `R` is their type.
            pub fn as_mut_slice<R: Elem>(&mut self) -> Option<&mut [R]> {
                match self {
                    $(Out::$var(s) => {
                        if R::DTYPE == ScalarType::$d { bytemuck::try_cast_slice_mut(&mut **s).ok() } else { None }
                    })*
                }
            }

            /// Stores `src` from `off` with stride `stride`, converting from `R`.
            #[inline]
            pub fn store<R: Elem>(&mut self, off: usize, stride: usize, src: &[R]) {
                match self { $(Out::$var(s) => store_to(s, off, stride, src)),* }
            }

            /// Sets element `i` (in bounds) from `v`.
            #[inline]
            pub fn set<R: Elem>(&mut self, i: usize, v: R) {
                match self { $(Out::$var(s) => s[i] = cast(v)),* }
            }

            /// Sets every element to the scalar `v` converted to the dtype.
            pub fn fill_scalar(&mut self, v: Scalar) {
                match self { $(Out::$var(s) => s.fill(<$t>::from_scalar(v))),* }
            }

            /// Splits off the first `mid` elements.
            pub fn split_at(self, mid: usize) -> (Out<'a>, Out<'a>) {
                match self {
                    $(Out::$var(s) => {
                        let (a, b) = s.split_at_mut(mid.min(s.len()));
                        (Out::$var(a), Out::$var(b))
                    })*
                }
            }
        }
    };
}

/// Most chunks [`Out::par_chunks`] splits an output into.
const MAX_CHUNKS: usize = 64;

impl<'a> Out<'a> {
    /// Runs `f(first, chunk)` over consecutive chunks of a multiple of `chunk_len`
    /// elements (`first` is the chunk's first element), in parallel on `pool`.
    ///
    /// `f` is a trait object so that the pool's generic code is instantiated once for
    /// every kernel; each chunk travels to its task through its own uncontended mutex.
    pub fn par_chunks(
        self,
        pool: &ThreadPool,
        chunk_len: usize,
        f: &(dyn Fn(usize, Out<'_>) + Sync),
    ) {
        let len = self.len();
        let chunk_len = chunk_len.max(1);
        let chunk_len = chunk_len * len.div_ceil(chunk_len).div_ceil(MAX_CHUNKS).max(1);
        let n = len.div_ceil(chunk_len);
        if n <= 1 || pool.threads() <= 1 {
            f(0, self);
            return;
        }
        let slots: [Mutex<Option<Out<'a>>>; MAX_CHUNKS] = std::array::from_fn(|_| Mutex::new(None));
        let mut rest = self;
        for slot in slots.iter().take(n) {
            let (head, tail) = rest.split_at(chunk_len);
            if let Ok(mut s) = slot.lock() {
                *s = Some(head);
            }
            rest = tail;
        }
        pool.parallel_for(0..n, 1, |_, range| {
            for i in range {
                let part = slots[i].lock().ok().and_then(|mut s| s.take());
                if let Some(part) = part {
                    f(i * chunk_len, part);
                }
            }
        });
    }
}

typed_slices!(
    F32(f32) = Float,
    F64(f64) = Double,
    F16(f16) = Half,
    BF16(bf16) = BFloat16,
    I8(i8) = Char,
    U8(u8) = Byte,
    I16(i16) = Short,
    I32(i32) = Int,
    I64(i64) = Long,
    U16(u16) = UInt16,
    U32(u32) = UInt32,
    U64(u64) = UInt64,
    Bool(Bool8) = Bool,
);

#[inline]
fn load_from<E: Elem, C: Elem>(s: &[E], off: usize, stride: usize, dst: &mut [C]) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    if stride == 1 {
        let src = &s[off..off + n];
        if half_fast_load(src, dst).is_some() {
            return;
        }
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = cast(x);
        }
    } else if stride == 0 {
        let v = cast(s[off]);
        dst.fill(v);
    } else {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = cast(s[off + i * stride]);
        }
    }
}

/// f16/bf16 to f32 through `half`'s vectorised slice conversion.
#[inline]
fn half_fast_load<E: Elem, C: Elem>(src: &[E], dst: &mut [C]) -> Option<()> {
    if C::DTYPE != ScalarType::Float {
        return None;
    }
    let d: &mut [f32] = bytemuck::try_cast_slice_mut(dst).ok()?;
    match E::DTYPE {
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

#[inline]
fn store_to<E: Elem, R: Elem>(s: &mut [E], off: usize, stride: usize, src: &[R]) {
    let n = src.len();
    if n == 0 {
        return;
    }
    if stride == 1 {
        let dst = &mut s[off..off + n];
        if half_fast_store(src, dst).is_some() {
            return;
        }
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = cast(x);
        }
    } else {
        for (i, &x) in src.iter().enumerate() {
            s[off + i * stride] = cast(x);
        }
    }
}

/// f32 to f16/bf16 through `half`'s vectorised slice conversion.
#[inline]
fn half_fast_store<E: Elem, R: Elem>(src: &[R], dst: &mut [E]) -> Option<()> {
    if R::DTYPE != ScalarType::Float {
        return None;
    }
    let s: &[f32] = bytemuck::try_cast_slice(src).ok()?;
    match E::DTYPE {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_follow_pytorch() {
        assert_eq!(cast::<f32, i32>(-2.7), -2);
        assert_eq!(cast::<f32, u8>(-1.0), 255);
        assert_eq!(cast::<f64, i8>(300.0), 44);
        assert_eq!(cast::<f32, Bool8>(0.5), Bool8(1));
        assert_eq!(cast::<f32, Bool8>(f32::NAN), Bool8(1));
        assert_eq!(cast::<Bool8, f32>(Bool8(1)), 1.0);
        assert_eq!(cast::<Bool8, i64>(Bool8(2)), 1);
        assert_eq!(cast::<i64, i8>(129), -127);
        assert_eq!(cast::<f32, f16>(1.0009766), f16::from_f32(1.0009766));
        assert_eq!(cast::<i64, f32>(16_777_217), 16_777_216.0);
        assert_eq!(cast::<f16, f64>(f16::from_f32(0.5)), 0.5);
        assert_eq!(cast::<f32, i64>(f32::NAN), 0);
    }

    #[test]
    fn narrowing_rounds_through_the_narrow_type() {
        let mut v = [1.0f32 / 3.0, 2049.0];
        narrow_slice(ScalarType::Half, &mut v);
        assert_eq!(v, [f16::from_f32(1.0 / 3.0).to_f32(), 2048.0]);
        let mut i = [200i64, -129];
        narrow_slice(ScalarType::Char, &mut i);
        assert_eq!(i, [-56, 127]);
        let mut b = [2i64, 0];
        narrow_slice(ScalarType::Bool, &mut b);
        assert_eq!(b, [1, 0]);
        assert!(narrows::<f32>(ScalarType::Half));
        assert!(!narrows::<i64>(ScalarType::Long));
    }
}
