//! Rust element types for tensor dtypes.

use bytemuck::Pod;
use etch_format::ScalarType;
use half::{bf16, f16};

/// A Rust type that stores one element of a tensor dtype.
pub trait Element: Pod + Send + Sync + std::fmt::Debug + PartialEq {
    /// The dtype this type stores.
    const DTYPE: ScalarType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: ScalarType = ScalarType::$d; })*
    };
}

element!(
    f32 => Float,
    f64 => Double,
    f16 => Half,
    bf16 => BFloat16,
    i8 => Char,
    u8 => Byte,
    i16 => Short,
    i32 => Int,
    i64 => Long,
    u16 => UInt16,
    u32 => UInt32,
    u64 => UInt64,
);
