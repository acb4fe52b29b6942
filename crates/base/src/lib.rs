//! etch's base types, below every other crate: dtypes ([`ScalarType`]), shape dynamism
//! ([`ShapeDynamism`]), the one element trait ([`Element`]) with [`Bool8`], and
//! [`MAX_RANK`].

mod element;
mod scalar_type;
mod shape_dynamism;

pub use element::{Bool8, Element};
pub use scalar_type::ScalarType;
pub use shape_dynamism::ShapeDynamism;

/// Most dimensions a tensor may have (ExecuTorch's `kTensorDimensionLimit`).
pub const MAX_RANK: usize = 16;
