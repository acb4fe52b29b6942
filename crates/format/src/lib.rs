//! etch's format layer: `.pte` and `.ptd` bytes to a validated program.

pub mod program;
mod scalar_type;

pub use program::model::*;
pub use scalar_type::ScalarType;
