//! `.ptd` (FlatTensor) named-data files (brief §1.7, ExecuTorch
//! `extension/flat_tensor/`).
//!
//! Layout: root offset at 0, identifier `FT01` at 4, the mandatory `FH01` header at
//! 8 (`u32` length, `u64` flatbuffer_offset, flatbuffer_size, segment_base_offset,
//! segment_data_size), the FlatBuffers data (parsed from file offset 0), then the
//! segments at `segment_base_offset`.

use std::path::Path;

use etch_memory::SharedBytes;

use crate::ScalarType;
use crate::error::{FormatError, Result};
use crate::file_bytes::{open_file, slice_range};
use crate::flatbuf::{Buffer, FieldPath};
use crate::limits::{MAX_LIST_ITEMS, MAX_NAMED_DATA, MAX_SEGMENTS};
use crate::program::header::{check_identifier, header_err, u32_at, u64_at};
use crate::program::model::ByteRange;

/// The FlatTensor file identifier.
pub const DATA_FILE_IDENTIFIER: &str = "FT01";
/// The FlatTensor header magic, at offset 8.
pub const DATA_FILE_HEADER_MAGIC: &[u8; 4] = b"FH01";
/// The header length the writer emits and the reader requires at least.
pub const DATA_FILE_HEADER_LEN: u32 = 40;

/// The `FH01` header of a `.ptd` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlatTensorHeader {
    /// Bytes of the header including magic and this field (>= 40).
    pub header_length: u32,
    /// Offset of the FlatBuffers data after the header (the data itself is parsed from file offset 0).
    pub flatbuffer_offset: u64,
    /// Bytes of FlatBuffers data, not counting the inserted header.
    pub flatbuffer_size: u64,
    /// File offset of the first segment.
    pub segment_base_offset: u64,
    /// Bytes from `segment_base_offset` to the end of the last segment.
    pub segment_data_size: u64,
}

/// Shape and dtype stored next to a named tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    /// Element type.
    pub scalar_type: ScalarType,
    /// Sizes, each >= 0.
    pub sizes: Vec<usize>,
    /// A permutation of `0..sizes.len()`.
    pub dim_order: Vec<u8>,
}

impl TensorLayout {
    /// Bytes of the tensor (checked against overflow at load).
    pub fn nbytes(&self) -> usize {
        self.sizes.iter().product::<usize>() * self.scalar_type.element_size()
    }
}

/// One named-data entry of a `.ptd` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataEntry {
    /// The key (a tensor's fully qualified name, or an opaque blob name).
    pub key: String,
    /// Index into [`DataFile::segments`] (checked at load).
    pub segment_index: usize,
    /// Shape and dtype, when the data is a tensor.
    pub tensor_layout: Option<TensorLayout>,
}

/// A loaded and validated `.ptd` file.
///
/// ```
/// use etch_format::{DataFile, FormatError};
/// let err = DataFile::from_static(b"\0\0\0\0FT01").unwrap_err();
/// assert_eq!(err.path(), Some("header.magic"));
/// ```
#[derive(Debug, Clone)]
pub struct DataFile {
    bytes: SharedBytes,
    header: FlatTensorHeader,
    version: u32,
    segments: Vec<ByteRange>,
    entries: Vec<DataEntry>,
}

/// Parses and checks the `FH01` header against the file length.
fn parse_header(data: &[u8]) -> Result<FlatTensorHeader> {
    check_identifier(data, DATA_FILE_IDENTIFIER, "an ExecuTorch data file (.ptd)")?;
    if data.get(8..12) != Some(DATA_FILE_HEADER_MAGIC.as_slice()) {
        return Err(header_err("magic", "missing FH01 header at offset 8"));
    }
    let short = || {
        header_err(
            "header_length",
            format!("file of {} bytes ends inside the header", data.len()),
        )
    };
    let header_length = u32_at(data, 12).ok_or_else(short)?;
    if header_length < DATA_FILE_HEADER_LEN {
        return Err(header_err(
            "header_length",
            format!("header length {header_length} is smaller than {DATA_FILE_HEADER_LEN}"),
        ));
    }
    let header = FlatTensorHeader {
        header_length,
        flatbuffer_offset: u64_at(data, 16).ok_or_else(short)?,
        flatbuffer_size: u64_at(data, 24).ok_or_else(short)?,
        segment_base_offset: u64_at(data, 32).ok_or_else(short)?,
        segment_data_size: u64_at(data, 40).ok_or_else(short)?,
    };
    let file_len = data.len() as u64;
    check_region_in_file(
        "flatbuffer_size",
        ("flatbuffer offset", header.flatbuffer_offset),
        ("size", header.flatbuffer_size),
        file_len,
    )?;
    check_region_in_file(
        "segment_data_size",
        ("segment base offset", header.segment_base_offset),
        ("segment data size", header.segment_data_size),
        file_len,
    )?;
    Ok(header)
}

/// Checks that the header's region `offset + size` (each given with the words that
/// name it in the message) ends inside the file of `file_len` bytes, without
/// overflow; otherwise a header error on `field`.
fn check_region_in_file(
    field: &str,
    (offset_name, offset): (&str, u64),
    (size_name, size): (&str, u64),
    file_len: u64,
) -> Result<()> {
    if offset.checked_add(size).is_some_and(|end| end <= file_len) {
        return Ok(());
    }
    Err(header_err(
        field,
        format!("{offset_name} {offset} + {size_name} {size} exceeds the file of {file_len} bytes"),
    ))
}

impl DataFile {
    /// Parses and validates a `.ptd` held in `bytes`.
    pub fn from_bytes(bytes: SharedBytes) -> Result<Self> {
        let data = bytes.as_slice();
        let header = parse_header(data)?;
        // Both fit in the file length, checked above.
        let fb_end = (header.flatbuffer_offset + header.flatbuffer_size) as usize;
        let buf = Buffer::new(data.get(..fb_end).unwrap_or(data));
        let root_path = FieldPath::Root;
        let root = buf.root(&root_path)?;
        let version = root.scalar::<u32>(0, 0, &root_path.field("version"))?;

        let p = root_path.field("segments");
        let segments = crate::program::parse_segments(
            root.tables(1, MAX_SEGMENTS, &p)?,
            &p,
            header.segment_base_offset,
            data.len(),
        )?;

        let p = root_path.field("named_data");
        let tables = root.tables(2, MAX_NAMED_DATA, &p)?;
        let mut entries = Vec::with_capacity(tables.len());
        for i in 0..tables.len() {
            let ep = p.index(i);
            let t = tables.get(i, &ep)?;
            let key = t.required_string(0, &ep.field("key"))?.to_owned();
            let sp = ep.field("segment_index");
            let segment_index = t.scalar::<u32>(1, 0, &sp)? as usize;
            let segment = segments.get(segment_index).ok_or_else(|| {
                FormatError::index(sp, segment_index as i64, "segments", segments.len())
            })?;
            let lp = ep.field("tensor_layout");
            let tensor_layout = match t.table(2, &lp)? {
                Some(l) => {
                    let tp = lp.field("scalar_type");
                    let code = l.scalar::<i8>(0, 0, &tp)?;
                    let scalar_type = ScalarType::from_code(code.into()).ok_or_else(|| {
                        FormatError::UnknownTag {
                            path: tp.to_string(),
                            what: "ScalarType",
                            tag: code.into(),
                        }
                    })?;
                    let szp = lp.field("sizes");
                    let dop = lp.field("dim_order");
                    let raw = l.vector_or_empty::<i32>(1, MAX_LIST_ITEMS, &szp)?;
                    let dim_order: Vec<u8> = l
                        .vector_or_empty::<u8>(2, MAX_LIST_ITEMS, &dop)?
                        .iter()
                        .collect();
                    let (sizes, nbytes) = crate::program::check_shape(
                        raw.len(),
                        raw.iter(),
                        &dim_order,
                        scalar_type,
                        &szp,
                        &dop,
                    )?;
                    if nbytes > segment.len as u64 {
                        return Err(FormatError::out_of_bounds(
                            lp,
                            format!(
                                "tensor of {nbytes} bytes exceeds segment {segment_index} of {} bytes",
                                segment.len
                            ),
                        ));
                    }
                    Some(TensorLayout {
                        scalar_type,
                        sizes,
                        dim_order,
                    })
                }
                None => None,
            };
            entries.push(DataEntry {
                key,
                segment_index,
                tensor_layout,
            });
        }
        Ok(DataFile {
            bytes,
            header,
            version,
            segments,
            entries,
        })
    }

    /// Parses a `.ptd` embedded in the binary.
    pub fn from_static(bytes: &'static [u8]) -> Result<Self> {
        Self::from_bytes(SharedBytes::Static(bytes))
    }

    /// Reads the file at `path` into aligned memory and loads it.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), SharedBytes::read_file)?)
    }

    /// Memory-maps the file at `path` (and `mlock`s it when `lock`) and loads it.
    pub fn map(path: impl AsRef<Path>, lock: bool) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), |p| {
            SharedBytes::map_file(p, lock)
        })?)
    }

    /// The file's bytes, which every [`ByteRange`] indexes.
    pub fn bytes(&self) -> &SharedBytes {
        &self.bytes
    }

    /// The bytes of `range`, or `None` if it is not inside the file.
    pub fn slice(&self, range: ByteRange) -> Option<&[u8]> {
        slice_range(&self.bytes, range)
    }

    /// The `FH01` header.
    pub fn header(&self) -> &FlatTensorHeader {
        &self.header
    }

    /// The FlatTensor schema version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The segments, as absolute file ranges.
    pub fn segments(&self) -> &[ByteRange] {
        &self.segments
    }

    /// The named-data entries, in file order.
    pub fn entries(&self) -> &[DataEntry] {
        &self.entries
    }

    /// The keys, in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.key.as_str())
    }

    /// The segment holding `key` and its tensor layout, if any (exact match, first
    /// entry wins).
    pub fn get(&self, key: &str) -> Option<(ByteRange, Option<&TensorLayout>)> {
        let entry = self.entries.iter().find(|e| e.key == key)?;
        let range = self.segments.get(entry.segment_index).copied()?;
        Some((range, entry.tensor_layout.as_ref()))
    }
}
