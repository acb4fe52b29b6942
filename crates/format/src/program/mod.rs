//! The `.pte` program: its model and its loader.

pub mod model;
