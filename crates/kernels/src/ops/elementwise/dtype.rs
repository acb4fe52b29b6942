//! Tensor bytes viewed as a slice of whichever dtype they hold, dtype dispatch macros,
//! and narrowing through a dtype. The element conversions are `etch_base`'s
//! ([`Element`], [`cast`], [`cast_slice`]).

use std::sync::Mutex;

use etch_base::ScalarType;
pub use etch_base::{Bool8, Element, cast, cast_slice};
use half::{bf16, f16};

use crate::{KernelContext, KernelError, Scalar, Tensor, ThreadPool};

/// Calls `$body` with `$E` bound to the Rust type of `$dtype`, for the thirteen dtypes
/// kernels compute with; other dtypes evaluate `$other`.
macro_rules! with_elem {
    ($dtype:expr, $E:ident => $body:expr, $other:expr) => {{
        use half::{bf16, f16};
        #[allow(unused_imports)]
        use $crate::ops::elementwise::dtype::Bool8;
        match $dtype {
            $crate::ScalarType::Float => {
                type $E = f32;
                $body
            }
            $crate::ScalarType::Double => {
                type $E = f64;
                $body
            }
            $crate::ScalarType::Half => {
                type $E = f16;
                $body
            }
            $crate::ScalarType::BFloat16 => {
                type $E = bf16;
                $body
            }
            $crate::ScalarType::Char => {
                type $E = i8;
                $body
            }
            $crate::ScalarType::Byte => {
                type $E = u8;
                $body
            }
            $crate::ScalarType::Short => {
                type $E = i16;
                $body
            }
            $crate::ScalarType::Int => {
                type $E = i32;
                $body
            }
            $crate::ScalarType::Long => {
                type $E = i64;
                $body
            }
            $crate::ScalarType::UInt16 => {
                type $E = u16;
                $body
            }
            $crate::ScalarType::UInt32 => {
                type $E = u32;
                $body
            }
            $crate::ScalarType::UInt64 => {
                type $E = u64;
                $body
            }
            $crate::ScalarType::Bool => {
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
        let dt: $crate::ScalarType = $dtype;
        if dt == $crate::ScalarType::Double {
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

/// Runs `$body` with `$E` the Rust type of the floating point `$dtype` and `$A` the
/// type it computes in (f32 for f16, bf16 and f32; f64 for f64); other dtypes give
/// `UnsupportedDtype` for `$what`.
macro_rules! with_float {
    ($dtype:expr, $what:expr, $E:ident, $A:ident => $body:expr) => {{
        match $dtype {
            $crate::ScalarType::Float => {
                type $E = f32;
                type $A = f32;
                $body
            }
            $crate::ScalarType::Double => {
                type $E = f64;
                type $A = f64;
                $body
            }
            $crate::ScalarType::Half => {
                type $E = half::f16;
                type $A = f32;
                $body
            }
            $crate::ScalarType::BFloat16 => {
                type $E = half::bf16;
                type $A = f32;
                $body
            }
            dtype => Err($crate::KernelError::UnsupportedDtype { dtype, what: $what }),
        }
    }};
}
pub(crate) use with_float;

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
pub fn narrow_slice<T: Element>(dtype: ScalarType, s: &mut [T]) {
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
pub fn narrows<T: Element>(dtype: ScalarType) -> bool {
    dtype != T::DTYPE
        && !matches!(
            dtype,
            ScalarType::Long | ScalarType::Double | ScalarType::UInt64
        )
}

fn roundtrip<T: Element, X: Element>(s: &mut [T]) {
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
            pub fn as_slice<C: Element>(&self) -> Option<&'a [C]> {
                if C::DTYPE != self.dtype() {
                    return None;
                }
                match *self { $(In::$var(s) => bytemuck::try_cast_slice(s).ok()),* }
            }

            /// Element `i` converted to `C` (`i` must be in bounds).
            #[inline]
            pub fn get<C: Element>(&self, i: usize) -> C {
                match self { $(In::$var(s) => cast(s[i])),* }
            }

            /// `dst.len()` elements from `off` with stride `stride`, converted to `C`.
            /// The caller has checked that the last one is in bounds.
            #[inline]
            pub fn load<C: Element>(&self, off: usize, stride: usize, dst: &mut [C]) {
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
            pub fn as_mut_slice<R: Element>(&mut self) -> Option<&mut [R]> {
                match self {
                    $(Out::$var(s) => {
                        if R::DTYPE == ScalarType::$d { bytemuck::try_cast_slice_mut(&mut **s).ok() } else { None }
                    })*
                }
            }

            /// Stores `src` from `off` with stride `stride`, converting from `R`.
            #[inline]
            pub fn store<R: Element>(&mut self, off: usize, stride: usize, src: &[R]) {
                match self { $(Out::$var(s) => store_to(s, off, stride, src)),* }
            }

            /// Sets element `i` (in bounds) from `v`.
            #[inline]
            pub fn set<R: Element>(&mut self, i: usize, v: R) {
                match self { $(Out::$var(s) => s[i] = cast(v)),* }
            }

            /// Sets every element to the scalar `v` converted to the dtype.
            pub fn fill_scalar(&mut self, v: Scalar) {
                match self { $(Out::$var(s) => s.fill(v.cast::<$t>())),* }
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
fn load_from<E: Element, C: Element>(s: &[E], off: usize, stride: usize, dst: &mut [C]) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    if stride == 1 {
        cast_slice(&s[off..off + n], dst);
    } else if stride == 0 {
        let v = cast(s[off]);
        dst.fill(v);
    } else {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = cast(s[off + i * stride]);
        }
    }
}

#[inline]
fn store_to<E: Element, R: Element>(s: &mut [E], off: usize, stride: usize, src: &[R]) {
    let n = src.len();
    if n == 0 {
        return;
    }
    if stride == 1 {
        cast_slice(src, &mut s[off..off + n]);
    } else {
        for (i, &x) in src.iter().enumerate() {
            s[off + i * stride] = cast(x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
