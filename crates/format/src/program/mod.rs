//! The `.pte` program: its model and its loader.

mod file;
pub mod header;
mod lookup;
pub mod model;
mod parse;
mod validate;

pub use file::ProgramFile;
pub(crate) use parse::{check_shape, parse_segments};
