//! etch's base types, below every other crate: dtypes ([`ScalarType`]), shape dynamism
//! ([`ShapeDynamism`]), the one element trait ([`Element`]) with [`Bool8`], and
//! [`MAX_RANK`], and PyTorch broadcasting ([`broadcast_shapes`], [`broadcast_strides`]).

mod broadcast;
mod element;
mod scalar_type;
mod shape_dynamism;

pub use broadcast::{broadcast_shapes, broadcast_strides};
pub use element::{Bool8, CastKind, Element, can_cast, cast, cast_slice};
pub use scalar_type::ScalarType;
pub use shape_dynamism::ShapeDynamism;

/// Most dimensions a tensor may have (ExecuTorch's `kTensorDimensionLimit`).
pub const MAX_RANK: usize = 16;
