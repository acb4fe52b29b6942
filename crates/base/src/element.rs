//! The Rust types that store one element of a tensor dtype.

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};

use crate::ScalarType;

/// A bool element as stored: one byte, 0 or 1 (any non-zero byte reads as true).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct Bool8(pub u8);

/// A Rust type that stores one element of a tensor dtype.
pub trait Element: Pod + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static {
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
    Bool8 => Bool,
);
