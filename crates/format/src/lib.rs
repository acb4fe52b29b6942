//! etch's format layer: `.pte` and `.ptd` bytes to a validated program.
//!
//! [`ProgramFile`] loads an ExecuTorch program with a hand-written, bounds-checked
//! FlatBuffers reader (no `unsafe`, no generated code) and validates it before any
//! of it is used, so that the runtime never meets an out-of-range index or offset.
//! As upstream's `Program::load` and `load_method`, the program-level tables
//! (headers, segments, constant, mutable and named data, the plans' names) are
//! checked at load and each execution plan when its method is loaded
//! ([`ProgramFile::load_plan`]), so that a method etch cannot read fails alone:
//!
//! * headers: the `ET12` identifier (`ET` with other digits is an incompatible
//!   version), the optional `eh00` extended header, program and segment sizes
//!   against the file length;
//! * every FlatBuffers offset, vtable, vector and string (UTF-8), union tags and
//!   enum values, with counts bounded by [`limits`];
//! * every index: values, operators, chains, delegates, constant and mutable
//!   buffers, segments, list items, inputs and outputs, jump destinations;
//! * tensors: known dtype, sizes >= 0, rank <= 16, `dim_order` a permutation,
//!   `storage_offset == 0`, byte size without overflow, planned placement inside
//!   its memory buffer (memory id 1-based), constant data inside its segment;
//! * list values: IntList items are Int values, TensorList items are Tensors,
//!   OptionalTensorList items are Tensors, Nulls or -1.
//!
//! Errors are [`FormatError`]s naming the bad field's path, e.g.
//! `execution_plan[0].values[17].tensor.sizes[2]`.
//!
//! ```
//! use etch_format::{ProgramFile, Value};
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/xnnpack_linear.pte");
//! let file = ProgramFile::read(path)?;
//! let forward = file.plan("forward").expect("a forward method");
//! assert_eq!(forward.delegates[0].id, "XnnpackBackend");
//! let Some(Value::Tensor(input)) = forward.values.get(forward.inputs[0]) else { panic!() };
//! assert_eq!(input.sizes, [2, 8]);
//! // Bytes are never copied: ranges index the file's bytes.
//! let blob = file.delegate_data(&forward.delegates[0].processed)?;
//! assert_eq!(&file.bytes().as_slice()[blob.offset + 4..blob.offset + 8], b"XH00");
//! # Ok::<(), etch_format::FormatError>(())
//! ```
//!
//! [`DataFile`] loads `.ptd` (FlatTensor) named-data files the same way,
//! [`BundledProgramFile`] bundled programs (`.bpte`: a program with its own test
//! cases), and [`inspect`] summarises a program for `etch inspect`.

#![warn(missing_docs)]

mod bundled;
mod data_file;
mod error;
mod file_bytes;
pub mod flatbuf;
pub mod inspect;
pub mod limits;
pub mod program;

pub use bundled::{
    BUNDLED_PROGRAM_IDENTIFIER, BundledMethodTestSuite, BundledProgramFile, BundledTensor,
    BundledTestCase, BundledValue, is_bundled_program,
};
pub use data_file::{DataEntry, DataFile, FlatTensorHeader, TensorLayout};
pub use error::{FormatError, Result};
pub use etch_base::{ScalarType, ShapeDynamism};
pub use program::ProgramFile;
pub use program::model::*;
