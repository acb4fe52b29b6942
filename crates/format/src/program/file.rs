//! [`ProgramFile`]: a `.pte` file's bytes plus its validated model.

use std::path::Path;

use etch_memory::SharedBytes;

use crate::error::Result;
use crate::file_bytes::{open_file, slice_range};
use crate::program::header::parse_layout;
use crate::program::model::*;
use crate::program::parse::parse_program;
use crate::program::validate::validate_program;

/// A loaded and fully validated `.pte` program.
///
/// Loading parses the FlatBuffers program data into the owned [`Program`] model and
/// checks it eagerly: every index, offset and length, dtype, shape and planned
/// memory placement (see the crate docs). Tensor bytes are not copied: accessors
/// return [`ByteRange`]s, absolute offsets into [`ProgramFile::bytes`], so the
/// runtime can bind constants zero-copy.
///
/// ```
/// use etch_format::{FormatError, ProgramFile};
/// // 8 bytes: a root offset and the identifier, but no tables.
/// let err = ProgramFile::from_static(b"\x08\0\0\0ET12").unwrap_err();
/// assert!(matches!(err, FormatError::OutOfBounds { .. }));
/// ```
#[derive(Debug, Clone)]
pub struct ProgramFile {
    bytes: SharedBytes,
    header: Option<ExtendedHeader>,
    program_size: usize,
    program: Program,
}

impl ProgramFile {
    /// Parses and validates a program held in `bytes`.
    pub fn from_bytes(bytes: SharedBytes) -> Result<Self> {
        let data = bytes.as_slice();
        let layout = parse_layout(data)?;
        let fb = data.get(..layout.program_size).unwrap_or(data);
        let program = parse_program(fb, layout.segment_base_offset, data.len())?;
        validate_program(&program)?;
        Ok(ProgramFile {
            header: layout.header,
            program_size: layout.program_size,
            program,
            bytes,
        })
    }

    /// Parses a program embedded in the binary (`include_bytes!`).
    ///
    /// The reader itself needs no alignment, but a runtime that reinterprets
    /// constant bytes as typed slices wants 16-byte alignment, which
    /// `include_bytes!` does not guarantee; [`ProgramFile::read`] does.
    pub fn from_static(bytes: &'static [u8]) -> Result<Self> {
        Self::from_bytes(SharedBytes::Static(bytes))
    }

    /// Reads the file at `path` into aligned memory and loads it.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), SharedBytes::read_file)?)
    }

    /// Reads the file at `path` into memory backed by transparent huge pages where the
    /// OS offers them (see [`SharedBytes::read_file_huge_pages`]) and loads it.
    pub fn read_huge_pages(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), SharedBytes::read_file_huge_pages)?)
    }

    /// Memory-maps the file at `path` (and `mlock`s it when `lock`) and loads it.
    pub fn map(path: impl AsRef<Path>, lock: bool) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), |p| {
            SharedBytes::map_file(p, lock)
        })?)
    }

    /// The validated program model.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The file's bytes, which every [`ByteRange`] indexes.
    pub fn bytes(&self) -> &SharedBytes {
        &self.bytes
    }

    /// The bytes of `range`, or `None` if it does not lie inside the file (ranges
    /// returned by this type always do).
    pub fn slice(&self, range: ByteRange) -> Option<&[u8]> {
        slice_range(&self.bytes, range)
    }

    /// The `eh00` extended header, if the file has one.
    pub fn header(&self) -> Option<&ExtendedHeader> {
        self.header.as_ref()
    }

    /// Bytes of FlatBuffers program data at the start of the file.
    pub fn program_size(&self) -> usize {
        self.program_size
    }

    /// The execution plan (method) called `name`.
    pub fn plan(&self, name: &str) -> Option<&ExecutionPlan> {
        self.program.plan(name)
    }

    /// True when some method hands part of its graph to a delegate backend.
    pub fn has_delegates(&self) -> bool {
        self.program
            .execution_plans
            .iter()
            .any(|p| !p.delegates.is_empty())
    }

    /// The method names, in file order.
    pub fn method_names(&self) -> impl Iterator<Item = &str> {
        self.program.execution_plans.iter().map(|p| p.name.as_str())
    }

    /// The bytes of constant `data_buffer_idx` from its offset to the end of its
    /// segment (or inline buffer). Use [`ProgramFile::check_constant`] for the
    /// exact range of a tensor of known size.
    pub fn constant_data(&self, data_buffer_idx: usize) -> Result<ByteRange> {
        self.program.constant_range(data_buffer_idx)
    }

    /// Exactly `nbytes` bytes of constant `data_buffer_idx`, checked to fit.
    pub fn check_constant(&self, data_buffer_idx: usize, nbytes: usize) -> Result<ByteRange> {
        self.program.constant_range_exact(data_buffer_idx, nbytes)
    }

    /// The initial state (`nbytes` bytes) of a planned tensor with
    /// `data_buffer_idx > 0`, from `mutable_data_segments[0]`.
    pub fn mutable_data(&self, data_buffer_idx: usize, nbytes: usize) -> Result<ByteRange> {
        self.program.mutable_range(data_buffer_idx, nbytes)
    }

    /// Segment `index`, as an absolute file range.
    pub fn segment(&self, index: usize) -> Result<ByteRange> {
        self.program.segment(index)
    }

    /// A delegate's payload (inline data or a segment).
    pub fn delegate_data(&self, reference: &DelegateDataReference) -> Result<ByteRange> {
        self.program.delegate_data(reference)
    }

    /// The segment the program's `named_data` entry `key` refers to.
    pub fn named_data(&self, key: &str) -> Option<ByteRange> {
        self.program.named_data_range(key)
    }
}
