//! Test helpers: a FlatBuffers writer and `.pte`/`.ptd` descriptions.
#![allow(dead_code)]

pub mod data_file;
pub mod flatbuffers;
pub mod program;
