//! The `.pte` binary header: root offset, `ET12` identifier and the optional `eh00`
//! extended header (brief §1.1, ExecuTorch `schema/extended_header.cpp` and
//! `Program::load`).

use crate::error::{FormatError, Result};
use crate::program::model::ExtendedHeader;

/// The file identifier this reader supports.
pub const PROGRAM_IDENTIFIER: &str = "ET12";
/// The extended header's magic, at file offset 8.
pub const EXTENDED_HEADER_MAGIC: &[u8; 4] = b"eh00";
/// Bytes of the extended header up to and including `segment_base_offset`; shorter
/// headers are corrupt.
pub const EXTENDED_HEADER_MIN_LEN: u32 = 24;
/// Bytes of the extended header including `segment_data_size`.
pub const EXTENDED_HEADER_FULL_LEN: u32 = 32;
const HEADER_START: usize = 8;

/// Where the FlatBuffers program data and the segments lie in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub header: Option<ExtendedHeader>,
    /// Bytes `[0, program_size)` hold the FlatBuffers data.
    pub program_size: usize,
    /// File offset of segment data, 0 when the program has no segments.
    pub segment_base_offset: u64,
}

/// A [`FormatError::Header`] about `header.{field}`.
pub(crate) fn header_err(field: &str, reason: impl Into<String>) -> FormatError {
    FormatError::Header {
        path: format!("header.{field}"),
        reason: reason.into(),
    }
}

/// The little-endian `u32` at `pos`, if the bytes reach that far.
pub(crate) fn u32_at(bytes: &[u8], pos: usize) -> Option<u32> {
    bytes
        .get(pos..)?
        .first_chunk::<4>()
        .map(|b| u32::from_le_bytes(*b))
}

/// The little-endian `u64` at `pos`, if the bytes reach that far.
pub(crate) fn u64_at(bytes: &[u8], pos: usize) -> Option<u64> {
    bytes
        .get(pos..)?
        .first_chunk::<8>()
        .map(|b| u64::from_le_bytes(*b))
}

/// Checks the identifier bytes `[4, 8)` against `expected`.
///
/// An identifier sharing the first two letters but with other digits is a
/// version mismatch; anything else is not this kind of file.
pub(crate) fn check_identifier(
    bytes: &[u8],
    expected: &'static str,
    expected_kind: &'static str,
) -> Result<()> {
    let Some(found) = bytes.get(4..8) else {
        return Err(header_err(
            "identifier",
            format!(
                "file of {} bytes is too small to be {expected_kind} (needs at least 8)",
                bytes.len()
            ),
        ));
    };
    if found == expected.as_bytes() {
        return Ok(());
    }
    let found_text = String::from_utf8_lossy(found).into_owned();
    let prefix = expected.as_bytes().get(..2).unwrap_or_default();
    if found.get(..2) == Some(prefix) {
        return Err(FormatError::IncompatibleVersion {
            path: "header.identifier".into(),
            found: found_text,
            supported: expected,
        });
    }
    Err(FormatError::BadIdentifier {
        path: "header.identifier".into(),
        expected_kind,
        expected,
        found: found_text,
    })
}

/// Parses the identifier and the optional extended header, and checks the sizes
/// they declare against the file length.
pub(crate) fn parse_layout(bytes: &[u8]) -> Result<Layout> {
    check_identifier(bytes, PROGRAM_IDENTIFIER, "an ExecuTorch program (.pte)")?;
    let file_len = bytes.len() as u64;
    let header = parse_extended_header(bytes)?;
    let Some(h) = header else {
        return Ok(Layout {
            header: None,
            program_size: bytes.len(),
            segment_base_offset: 0,
        });
    };
    if h.program_size < 8 {
        return Err(header_err(
            "program_size",
            format!("program size {} is smaller than 8 bytes", h.program_size),
        ));
    }
    if h.program_size > file_len {
        return Err(header_err(
            "program_size",
            format!(
                "program size {} exceeds the file of {file_len} bytes",
                h.program_size
            ),
        ));
    }
    // Program::load's file-size check; old files (data size 0, base > 0) skip it.
    if (h.segment_data_size == 0 && h.segment_base_offset == 0) || h.segment_data_size > 0 {
        let expected = if h.segment_base_offset == 0 {
            Some(h.program_size)
        } else {
            h.segment_base_offset.checked_add(h.segment_data_size)
        };
        match expected {
            None => {
                return Err(header_err(
                    "segment_data_size",
                    format!(
                        "segment base offset {} + segment data size {} overflows",
                        h.segment_base_offset, h.segment_data_size
                    ),
                ));
            }
            Some(expected) if expected > file_len => {
                return Err(header_err(
                    "segment_data_size",
                    format!(
                        "segment base offset {} + segment data size {} exceeds the file of {file_len} bytes",
                        h.segment_base_offset, h.segment_data_size
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(Layout {
        header: Some(h),
        // program_size <= file_len, which is a usize.
        program_size: usize::try_from(h.program_size).unwrap_or(bytes.len()),
        segment_base_offset: h.segment_base_offset,
    })
}

/// Reads the `eh00` header at offset 8, if the magic is there.
fn parse_extended_header(bytes: &[u8]) -> Result<Option<ExtendedHeader>> {
    if bytes.get(HEADER_START..HEADER_START + 4) != Some(EXTENDED_HEADER_MAGIC.as_slice()) {
        return Ok(None);
    }
    let short = || {
        header_err(
            "header_length",
            format!(
                "file of {} bytes ends inside the extended header",
                bytes.len()
            ),
        )
    };
    let header_length = u32_at(bytes, HEADER_START + 4).ok_or_else(short)?;
    if header_length < EXTENDED_HEADER_MIN_LEN {
        return Err(header_err(
            "header_length",
            format!(
                "extended header length {header_length} is smaller than {EXTENDED_HEADER_MIN_LEN}"
            ),
        ));
    }
    let program_size = u64_at(bytes, HEADER_START + 8).ok_or_else(short)?;
    let segment_base_offset = u64_at(bytes, HEADER_START + 16).ok_or_else(short)?;
    let segment_data_size = if header_length >= EXTENDED_HEADER_FULL_LEN {
        u64_at(bytes, HEADER_START + 24).ok_or_else(short)?
    } else {
        0
    };
    Ok(Some(ExtendedHeader {
        header_length,
        program_size,
        segment_base_offset,
        segment_data_size,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: u32, program: u64, base: u64, data: u64, file: usize) -> Vec<u8> {
        let mut b = vec![0u8; file.max(40)];
        b[4..8].copy_from_slice(b"ET12");
        b[8..12].copy_from_slice(b"eh00");
        b[12..16].copy_from_slice(&len.to_le_bytes());
        b[16..24].copy_from_slice(&program.to_le_bytes());
        b[24..32].copy_from_slice(&base.to_le_bytes());
        b[32..40].copy_from_slice(&data.to_le_bytes());
        b.truncate(file);
        b
    }

    #[test]
    fn identifiers() {
        assert!(parse_layout(b"\0\0\0\0ET12").is_ok());
        let e = parse_layout(b"\0\0\0\0ET13").unwrap_err();
        assert!(matches!(e, FormatError::IncompatibleVersion { .. }), "{e}");
        let e = parse_layout(b"\0\0\0\0PK12").unwrap_err();
        assert!(matches!(e, FormatError::BadIdentifier { .. }), "{e}");
        assert!(parse_layout(b"\0\0\0\0ET1").is_err());
    }

    #[test]
    fn extended_header_sizes() {
        let ok = parse_layout(&header(32, 64, 128, 16, 144)).unwrap();
        assert_eq!(ok.program_size, 64);
        assert_eq!(ok.segment_base_offset, 128);
        // Segments end past the file.
        let e = parse_layout(&header(32, 64, 128, 17, 144)).unwrap_err();
        assert_eq!(e.path(), Some("header.segment_data_size"));
        // Program larger than the file.
        let e = parse_layout(&header(32, 200, 0, 0, 144)).unwrap_err();
        assert_eq!(e.path(), Some("header.program_size"));
        // Header too short.
        let e = parse_layout(&header(20, 64, 0, 0, 144)).unwrap_err();
        assert_eq!(e.path(), Some("header.header_length"));
        // A 24-byte header has no segment_data_size: old file, check skipped.
        let ok = parse_layout(&header(24, 64, 128, 999, 144)).unwrap();
        assert_eq!(ok.header.unwrap().segment_data_size, 0);
        // Overflow.
        let e = parse_layout(&header(32, 64, u64::MAX, 2, 144)).unwrap_err();
        assert_eq!(e.path(), Some("header.segment_data_size"));
        // Truncated inside the header.
        let e = parse_layout(&header(32, 64, 0, 0, 30)).unwrap_err();
        assert_eq!(e.path(), Some("header.header_length"));
    }
}
