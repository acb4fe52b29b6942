//! Resolving constant, mutable, delegate and named data to byte ranges.
//!
//! These follow ExecuTorch's `Program::get_constant_buffer_data`,
//! `load_mutable_subsegment_into`, `PteDataMap` and delegate blob lookup
//! (brief §1.6). Every result is an absolute, bounds-checked range of the file.

use crate::error::{FormatError, Result};
use crate::program::model::*;

impl Program {
    /// True when constants come from `constant_segment` (the format since ET 0.7)
    /// rather than the deprecated inline `constant_buffer`.
    pub fn uses_constant_segment(&self) -> bool {
        self.constant_segment
            .as_ref()
            .is_some_and(|c| !c.offsets.is_empty())
    }

    /// Entries of the constant table, including the reserved entry 0.
    pub fn constant_count(&self) -> usize {
        match &self.constant_segment {
            Some(c) if !c.offsets.is_empty() => c.offsets.len(),
            _ => self.constant_buffers.len(),
        }
    }

    /// Segment `index` as an absolute file range.
    pub fn segment(&self, index: usize) -> Result<ByteRange> {
        self.segments.get(index).copied().ok_or_else(|| {
            FormatError::index("segments", index as i64, "segments", self.segments.len())
        })
    }

    /// The bytes of constant `data_buffer_idx`, from its start to the end of its
    /// segment (or inline buffer); the tensor's size is checked with
    /// [`Program::constant_range_exact`].
    pub fn constant_range(&self, data_buffer_idx: usize) -> Result<ByteRange> {
        match &self.constant_segment {
            Some(c) if !c.offsets.is_empty() => {
                let path = || format!("constant_segment.offsets[{data_buffer_idx}]");
                if data_buffer_idx == 0 || data_buffer_idx >= c.offsets.len() {
                    return Err(FormatError::index(
                        path(),
                        data_buffer_idx as i64,
                        "constant_segment.offsets (entry 0 is reserved)",
                        c.offsets.len(),
                    ));
                }
                let segment = self.segments.get(c.segment_index).ok_or_else(|| {
                    FormatError::index(
                        "constant_segment.segment_index",
                        c.segment_index as i64,
                        "segments",
                        self.segments.len(),
                    )
                })?;
                let offset = c.offsets.get(data_buffer_idx).copied().unwrap_or(u64::MAX);
                sub_range(*segment, offset, None).ok_or_else(|| {
                    FormatError::out_of_bounds(
                        path(),
                        format!(
                            "offset {offset} exceeds constant segment {} of {} bytes",
                            c.segment_index, segment.len
                        ),
                    )
                })
            }
            _ => {
                if data_buffer_idx == 0 || data_buffer_idx >= self.constant_buffers.len() {
                    return Err(FormatError::index(
                        format!("constant_buffer[{data_buffer_idx}]"),
                        data_buffer_idx as i64,
                        "constant_buffer (entry 0 is reserved)",
                        self.constant_buffers.len(),
                    ));
                }
                Ok(self
                    .constant_buffers
                    .get(data_buffer_idx)
                    .copied()
                    .unwrap_or_default())
            }
        }
    }

    /// Exactly the `nbytes` bytes of constant `data_buffer_idx`, checked to fit.
    pub fn constant_range_exact(&self, data_buffer_idx: usize, nbytes: usize) -> Result<ByteRange> {
        let range = self.constant_range(data_buffer_idx)?;
        if nbytes > range.len {
            let path = if self.uses_constant_segment() {
                format!("constant_segment.offsets[{data_buffer_idx}]")
            } else {
                format!("constant_buffer[{data_buffer_idx}].storage")
            };
            return Err(FormatError::out_of_bounds(
                path,
                format!(
                    "constant of {nbytes} bytes exceeds the {} bytes available from its offset",
                    range.len
                ),
            ));
        }
        Ok(ByteRange {
            offset: range.offset,
            len: nbytes,
        })
    }

    /// The `nbytes` initial-state bytes of a mutable (planned) tensor with
    /// `data_buffer_idx`, always from `mutable_data_segments[0]` as ExecuTorch does.
    pub fn mutable_range(&self, data_buffer_idx: usize, nbytes: usize) -> Result<ByteRange> {
        let table = self
            .mutable_data_segments
            .first()
            .ok_or_else(|| FormatError::NotFound {
                path: "mutable_data_segments".into(),
                what: "mutable_data_segments[0] (initial state of mutable tensors)".into(),
            })?;
        let path = format!("mutable_data_segments[0].offsets[{data_buffer_idx}]");
        let offset = *table.offsets.get(data_buffer_idx).ok_or_else(|| {
            FormatError::index(
                path.clone(),
                data_buffer_idx as i64,
                "mutable_data_segments[0].offsets",
                table.offsets.len(),
            )
        })?;
        let segment = self.segments.get(table.segment_index).ok_or_else(|| {
            FormatError::index(
                "mutable_data_segments[0].segment_index",
                table.segment_index as i64,
                "segments",
                self.segments.len(),
            )
        })?;
        sub_range(*segment, offset, Some(nbytes)).ok_or_else(|| {
            FormatError::out_of_bounds(
                path,
                format!(
                    "offset {offset} + length {nbytes} exceeds segment {} of {} bytes",
                    table.segment_index, segment.len
                ),
            )
        })
    }

    /// The payload of a delegate.
    pub fn delegate_data(&self, reference: &DelegateDataReference) -> Result<ByteRange> {
        match *reference {
            DelegateDataReference::Inline(i) => {
                self.backend_delegate_data.get(i).copied().ok_or_else(|| {
                    FormatError::index(
                        "backend_delegate_data",
                        i as i64,
                        "backend_delegate_data",
                        self.backend_delegate_data.len(),
                    )
                })
            }
            DelegateDataReference::Segment(i) => self.segment(i),
        }
    }

    /// The whole segment a named-data key refers to (exact, linear lookup, as
    /// ExecuTorch's `PteDataMap`).
    pub fn named_data_range(&self, key: &str) -> Option<ByteRange> {
        let entry = self.named_data.iter().find(|n| n.key == key)?;
        self.segments.get(entry.segment_index).copied()
    }
}

/// `[segment.offset + offset, + len or to the end)` if it fits in the segment.
fn sub_range(segment: ByteRange, offset: u64, len: Option<usize>) -> Option<ByteRange> {
    let offset = usize::try_from(offset).ok()?;
    let available = segment.len.checked_sub(offset)?;
    let len = match len {
        Some(n) if n <= available => n,
        Some(_) => return None,
        None => available,
    };
    Some(ByteRange {
        offset: segment.offset.checked_add(offset)?,
        len,
    })
}
