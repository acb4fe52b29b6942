//! Names and codes of `backends/xnnpack/serialization/runtime_schema.fbs` (the schema
//! the official runtime reads): datatypes, node kinds by union tag, flags.

/// `XNN_INVALID_VALUE_ID`: "no value" (e.g. a fully connected node without bias).
pub const INVALID_VALUE_ID: u32 = u32::MAX;
/// `XNN_VALUE_FLAG_EXTERNAL_INPUT`.
pub const VALUE_FLAG_EXTERNAL_INPUT: u32 = 1;
/// `XNN_VALUE_FLAG_EXTERNAL_OUTPUT`.
pub const VALUE_FLAG_EXTERNAL_OUTPUT: u32 = 2;
/// `XNN_FLAG_TRANSPOSE_WEIGHTS` / `XNN_FLAG_TRANSPOSE_B`: weights are `[k, n]`.
pub const FLAG_TRANSPOSE_WEIGHTS: u32 = 0x1;
/// `XNN_FLAG_TENSORFLOW_LEGACY_MODE` (bilinear resize).
pub const FLAG_TENSORFLOW_LEGACY_MODE: u32 = 0x4;
/// `XNN_FLAG_ALIGN_CORNERS` (bilinear resize).
pub const FLAG_ALIGN_CORNERS: u32 = 0x8;
/// `XNN_FLAG_KEEP_DIMS` (reductions, pooling).
pub const FLAG_KEEP_DIMS: u32 = 0x40;
/// Most external values a graph may declare (checked by `XNNCompiler.cpp`).
pub const MAX_EXTERNS: u32 = 4096;

/// `XNNDatatype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Datatype {
    Fp32,
    Fp16,
    QInt8,
    QUInt8,
    QInt32,
    QcInt8,
    QcInt32,
    QcInt4,
    QdInt8,
    QbInt4,
    QpInt8,
    Int32,
    Pfp32,
    Bf16,
}

impl Datatype {
    /// The datatype of schema code `code` (0, invalid, and unknown codes give `None`).
    pub fn from_code(code: i16) -> Option<Self> {
        use Datatype::*;
        Some(match code {
            1 => Fp32,
            2 => Fp16,
            3 => QInt8,
            4 => QUInt8,
            5 => QInt32,
            6 => QcInt8,
            7 => QcInt32,
            8 => QcInt4,
            9 => QdInt8,
            10 => QbInt4,
            11 => QpInt8,
            12 => Int32,
            13 => Pfp32,
            14 => Bf16,
            _ => return None,
        })
    }

    /// The schema name (`xnn_datatype_fp32` without the prefix).
    pub fn name(self) -> &'static str {
        use Datatype::*;
        match self {
            Fp32 => "fp32",
            Fp16 => "fp16",
            QInt8 => "qint8",
            QUInt8 => "quint8",
            QInt32 => "qint32",
            QcInt8 => "qcint8",
            QcInt32 => "qcint32",
            QcInt4 => "qcint4",
            QdInt8 => "qdint8",
            QbInt4 => "qbint4",
            QpInt8 => "qpint8",
            Int32 => "int32",
            Pfp32 => "pfp32",
            Bf16 => "bf16",
        }
    }

    /// Bytes of a constant of `numel` elements in this datatype (4-bit types pack two
    /// per byte along rows of `row` elements); `None` on overflow.
    pub fn constant_bytes(self, numel: usize, row: usize) -> Option<usize> {
        use Datatype::*;
        match self {
            Fp32 | QInt32 | QcInt32 | Int32 | Pfp32 => numel.checked_mul(4),
            Fp16 | Bf16 => numel.checked_mul(2),
            QInt8 | QUInt8 | QcInt8 | QdInt8 | QpInt8 => Some(numel),
            QcInt4 | QbInt4 => {
                let row = row.max(1);
                (numel / row).checked_mul(row.div_ceil(2))
            }
        }
    }
}

macro_rules! node_kinds {
    ($($tag:literal $name:ident,)*) => {
        /// `XNodeUnion` members, by their union tag.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[allow(missing_docs)]
        pub enum NodeKind { $($name,)* }

        impl NodeKind {
            /// The kind of union tag `tag`.
            pub fn from_tag(tag: u8) -> Option<Self> {
                match tag { $($tag => Some(NodeKind::$name),)* _ => None }
            }

            /// The schema name without the `XNN` prefix (`FullyConnected`).
            pub fn name(self) -> &'static str {
                match self { $(NodeKind::$name => stringify!($name),)* }
            }
        }
    };
}

node_kinds! {
    1 Add,
    2 FullyConnected,
    3 Softmax,
    4 Sigmoid,
    5 StaticTranspose,
    6 Clamp,
    7 Conv2d,
    8 Div,
    9 StaticResizeBilinear2D,
    10 StaticConstantPad,
    11 AvgPooling2d,
    12 Minimum,
    13 DepthwiseConv2d,
    14 MaxPooling2d,
    15 Multiply,
    16 Subtract,
    17 Floor,
    18 Convert,
    19 GlobalAvgPooling2d,
    20 StaticReshape,
    21 ArgMaxPooling2d,
    22 SquareRoot,
    23 Ceiling,
    24 Hardswish,
    25 LeakyReLU,
    26 Maximum,
    27 Negate,
    28 Square,
    29 ELU,
    30 Abs,
    31 PReLU,
    32 Concatenate2,
    33 Concatenate3,
    34 Concatenate4,
    35 StaticSlice,
    36 ScaledDotProductAttention,
    37 BatchMatrixMultiply,
    38 Concatenate5,
    39 ConvTranspose2d,
    40 ReciprocalSquareRoot,
    41 Log,
    42 Gelu,
    43 Tanh,
    44 Exp,
    45 Sin,
    46 Copy,
    47 Cos,
}
