//! The format layer's error type.

use std::path::{Path, PathBuf};

/// Why a `.pte` or `.ptd` file (or a lookup into one) was rejected.
///
/// Every variant about file contents carries `path`, the location of the bad field
/// written like `execution_plan[0].values[17].tensor.sizes[2]` (or `header.program_size`
/// for the binary headers), so a failure names exactly what is wrong.
///
/// ```
/// use etch_format::{FormatError, ProgramFile};
/// let err = ProgramFile::from_static(b"\x08\0\0\0ET99\0\0\0\0").unwrap_err();
/// assert!(matches!(err, FormatError::IncompatibleVersion { .. }));
/// assert_eq!(err.path(), Some("header.identifier"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The file could not be read or mapped.
    #[error("cannot read {}", file.display())]
    Io {
        /// The file that failed.
        file: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Memory for a copy of part of the file could not be allocated.
    #[error("cannot allocate {what}")]
    Alloc {
        /// What was being copied.
        what: &'static str,
        /// The allocator's error.
        #[source]
        source: etch_memory::AllocError,
    },
    /// The file identifier is not the one expected: not a `.pte`/`.ptd` at all.
    #[error("{path}: not {expected_kind}: expected identifier {expected:?}, found {found:?}")]
    BadIdentifier {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What kind of file was expected.
        expected_kind: &'static str,
        /// The identifier expected.
        expected: &'static str,
        /// What the file holds instead.
        found: String,
    },
    /// The identifier names another version of the format.
    #[error("{path}: incompatible format version {found:?} (this reader supports {supported:?})")]
    IncompatibleVersion {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What the file holds instead.
        found: String,
        /// The version this reader supports.
        supported: &'static str,
    },
    /// A binary header field is inconsistent (sizes, lengths, magic).
    #[error("{path}: {reason}")]
    Header {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What is wrong, with the numbers involved.
        reason: String,
    },
    /// An offset or length points outside its buffer.
    #[error("{path}: {reason}")]
    OutOfBounds {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What is wrong, with the numbers involved.
        reason: String,
    },
    /// A string field is not UTF-8.
    #[error("{path}: string is not valid UTF-8")]
    InvalidUtf8 {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
    },
    /// A field the loader needs is absent.
    #[error("{path}: required field is missing")]
    MissingField {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
    },
    /// A union tag or enum value the format does not define.
    #[error("{path}: unknown {what} {tag}")]
    UnknownTag {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What was counted or looked up.
        what: &'static str,
        /// The unknown value.
        tag: i64,
    },
    /// An index does not fit the table it indexes.
    #[error("{path}: index {index} is out of range for {target} of length {len}")]
    IndexOutOfRange {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// The offending index.
        index: i64,
        /// The table the index refers to.
        target: String,
        /// Length of that table.
        len: usize,
    },
    /// A value index refers to a value of the wrong kind.
    #[error("{path}: value {index} is {found}, expected {expected}")]
    WrongValueType {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// The offending index.
        index: usize,
        /// The identifier expected.
        expected: &'static str,
        /// What the file holds instead.
        found: &'static str,
    },
    /// A count exceeds one of the limits in [`crate::limits`].
    #[error("{path}: {what} {count} exceeds the limit of {limit}")]
    LimitExceeded {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What was counted or looked up.
        what: &'static str,
        /// The count found.
        count: u64,
        /// The limit.
        limit: u64,
    },
    /// A field has a value the format forbids.
    #[error("{path}: {reason}")]
    Invalid {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What is wrong, with the numbers involved.
        reason: String,
    },
    /// A field has a value the format allows but etch (like ExecuTorch) does not support.
    #[error("{path}: not supported: {reason}")]
    Unsupported {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What is wrong, with the numbers involved.
        reason: String,
    },
    /// A lookup by name or key found nothing.
    #[error("{path}: {what} not found")]
    NotFound {
        /// Path of the offending field (`execution_plan[0].values[3].tensor.sizes`).
        path: String,
        /// What was counted or looked up.
        what: String,
    },
}

/// The `path` field of every variant that has one (`None` for [`FormatError::Io`]):
/// one list of variants for reading and for rewriting the path.
macro_rules! path_field {
    ($error:expr) => {{
        use FormatError::*;
        match $error {
            Io { .. } | Alloc { .. } => None,
            BadIdentifier { path, .. }
            | IncompatibleVersion { path, .. }
            | Header { path, .. }
            | OutOfBounds { path, .. }
            | InvalidUtf8 { path }
            | MissingField { path }
            | UnknownTag { path, .. }
            | IndexOutOfRange { path, .. }
            | WrongValueType { path, .. }
            | LimitExceeded { path, .. }
            | Invalid { path, .. }
            | Unsupported { path, .. }
            | NotFound { path, .. } => Some(path),
        }
    }};
}

impl FormatError {
    /// The path of the offending field, when the error is about file contents.
    pub fn path(&self) -> Option<&str> {
        path_field!(self).map(String::as_str)
    }

    /// The same error, reported at `new_path` (used when a lookup fails on behalf of
    /// a field, e.g. a tensor's `data_buffer_idx`).
    pub(crate) fn with_path(mut self, new_path: String) -> Self {
        if let Some(path) = path_field!(&mut self) {
            *path = new_path;
        }
        self
    }

    /// Wraps an I/O error on `file` (for `map_err` after opening or mapping it).
    pub(crate) fn io(file: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| FormatError::Io {
            file: file.to_owned(),
            source,
        }
    }

    pub(crate) fn invalid(path: impl ToString, reason: impl Into<String>) -> Self {
        FormatError::Invalid {
            path: path.to_string(),
            reason: reason.into(),
        }
    }

    /// Fails with [`FormatError::LimitExceeded`] at `path` when `count` (of `what`:
    /// "vector length", "tensor rank", ...) is above `limit`.
    pub(crate) fn check_limit(
        path: &dyn std::fmt::Display,
        what: &'static str,
        count: u64,
        limit: u64,
    ) -> Result<(), Self> {
        if count <= limit {
            return Ok(());
        }
        Err(FormatError::LimitExceeded {
            path: path.to_string(),
            what,
            count,
            limit,
        })
    }

    pub(crate) fn out_of_bounds(path: impl ToString, reason: impl Into<String>) -> Self {
        FormatError::OutOfBounds {
            path: path.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn index(
        path: impl ToString,
        index: i64,
        target: impl Into<String>,
        len: usize,
    ) -> Self {
        FormatError::IndexOutOfRange {
            path: path.to_string(),
            index,
            target: target.into(),
            len,
        }
    }
}

/// Result alias of the format layer.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;
