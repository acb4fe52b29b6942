//! Getting a file's bytes, and reading ranges of them, the same way for every file
//! kind the crate loads (`.pte` programs and `.ptd` data files).

use std::path::Path;

use etch_memory::SharedBytes;

use crate::error::{FormatError, Result};
use crate::program::model::ByteRange;

/// Opens the file at `path` with `open` (read it, map it, ...), turning an I/O
/// failure into a [`FormatError::Io`] that names the file.
pub(crate) fn open_file(
    path: &Path,
    open: impl FnOnce(&Path) -> std::io::Result<SharedBytes>,
) -> Result<SharedBytes> {
    open(path).map_err(FormatError::io(path))
}

/// The bytes of `range` within `bytes`, or `None` when the range does not lie
/// inside them (including when its end overflows).
pub(crate) fn slice_range(bytes: &SharedBytes, range: ByteRange) -> Option<&[u8]> {
    let end = range.offset.checked_add(range.len)?;
    bytes.as_slice().get(range.offset..end)
}
