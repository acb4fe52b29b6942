//! Element types, numbered as ExecuTorch's `schema/scalar_type.fbs`.

use std::fmt;

/// The dtype of a tensor, with the numeric values the `.pte` format uses.
///
/// ```
/// use etch_base::ScalarType;
/// assert_eq!(ScalarType::from_code(6), Some(ScalarType::Float));
/// assert_eq!(ScalarType::Float.element_size(), 4);
/// assert_eq!(ScalarType::Float.name(), "f32");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(i8)]
pub enum ScalarType {
    /// `u8`.
    Byte = 0,
    /// `i8`.
    Char = 1,
    /// `i16`.
    Short = 2,
    /// `i32`.
    Int = 3,
    /// `i64`.
    Long = 4,
    /// IEEE half, `f16`.
    Half = 5,
    #[default]
    /// `f32`.
    Float = 6,
    /// `f64`.
    Double = 7,
    /// Boolean stored as one byte.
    Bool = 11,
    /// Quantized `i8`.
    QInt8 = 12,
    /// Quantized `u8`.
    QUInt8 = 13,
    /// Quantized `i32`.
    QInt32 = 14,
    /// bfloat16.
    BFloat16 = 15,
    /// Two 4-bit values per byte.
    QUInt4x2 = 16,
    /// Four 2-bit values per byte.
    QUInt2x4 = 17,
    /// 16 opaque bits.
    Bits16 = 22,
    /// 8-bit float, 5 exponent bits.
    Float8E5M2 = 23,
    /// 8-bit float, 4 exponent bits, finite.
    Float8E4M3FN = 24,
    /// 8-bit float, 5 exponent bits, finite, unsigned zero.
    Float8E5M2FNUZ = 25,
    /// 8-bit float, 4 exponent bits, finite, unsigned zero.
    Float8E4M3FNUZ = 26,
    /// `u16`.
    UInt16 = 27,
    /// `u32`.
    UInt32 = 28,
    /// `u64`.
    UInt64 = 29,
}

impl ScalarType {
    /// Every dtype the format defines.
    pub const ALL: [ScalarType; 23] = [
        Self::Byte,
        Self::Char,
        Self::Short,
        Self::Int,
        Self::Long,
        Self::Half,
        Self::Float,
        Self::Double,
        Self::Bool,
        Self::QInt8,
        Self::QUInt8,
        Self::QInt32,
        Self::BFloat16,
        Self::QUInt4x2,
        Self::QUInt2x4,
        Self::Bits16,
        Self::Float8E5M2,
        Self::Float8E4M3FN,
        Self::Float8E5M2FNUZ,
        Self::Float8E4M3FNUZ,
        Self::UInt16,
        Self::UInt32,
        Self::UInt64,
    ];

    /// The dtype with this numeric code, or `None` for an unknown code.
    pub fn from_code(code: i64) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as i64 == code)
    }

    /// The numeric code used in the file format and in `ScalarType` kernel arguments.
    pub fn code(self) -> i8 {
        self as i8
    }

    /// Bytes per element.
    pub fn element_size(self) -> usize {
        use ScalarType::*;
        match self {
            Byte | Char | Bool | QInt8 | QUInt8 | QUInt4x2 | QUInt2x4 => 1,
            Float8E5M2 | Float8E4M3FN | Float8E5M2FNUZ | Float8E4M3FNUZ => 1,
            Short | Half | BFloat16 | Bits16 | UInt16 => 2,
            Int | Float | QInt32 | UInt32 => 4,
            Long | Double | UInt64 => 8,
        }
    }

    /// Short, NumPy-like name (`f32`, `i64`, `bool`, ...).
    pub fn name(self) -> &'static str {
        use ScalarType::*;
        match self {
            Byte => "u8",
            Char => "i8",
            Short => "i16",
            Int => "i32",
            Long => "i64",
            Half => "f16",
            Float => "f32",
            Double => "f64",
            Bool => "bool",
            QInt8 => "qint8",
            QUInt8 => "quint8",
            QInt32 => "qint32",
            BFloat16 => "bf16",
            QUInt4x2 => "quint4x2",
            QUInt2x4 => "quint2x4",
            Bits16 => "bits16",
            Float8E5M2 => "f8e5m2",
            Float8E4M3FN => "f8e4m3fn",
            Float8E5M2FNUZ => "f8e5m2fnuz",
            Float8E4M3FNUZ => "f8e4m3fnuz",
            UInt16 => "u16",
            UInt32 => "u32",
            UInt64 => "u64",
        }
    }

    /// The dtype with this short name (the inverse of [`ScalarType::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.name() == name)
    }

    /// True for f16, bf16, f32 and f64.
    pub fn is_floating_point(self) -> bool {
        matches!(
            self,
            ScalarType::Half | ScalarType::BFloat16 | ScalarType::Float | ScalarType::Double
        )
    }

    /// True for the integer types (bool excluded).
    pub fn is_integral(self) -> bool {
        use ScalarType::*;
        matches!(
            self,
            Byte | Char | Short | Int | Long | UInt16 | UInt32 | UInt64
        )
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for t in ScalarType::ALL {
            assert_eq!(ScalarType::from_code(t.code() as i64), Some(t));
            assert_eq!(ScalarType::from_name(t.name()), Some(t));
        }
        assert_eq!(ScalarType::from_code(8), None);
        assert_eq!(ScalarType::from_code(-1), None);
    }
}
