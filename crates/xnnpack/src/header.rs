//! The payload header (`XH00`) that precedes the XNNGraph flatbuffer and the constant
//! region (`backends/xnnpack/runtime/XNNHeader.h` / `XNNHeader.cpp` upstream).
//!
//! Layout, little-endian: 4 bytes of padding, the magic `XH00`, a `u16` header length,
//! `u32` flatbuffer offset, `u32` flatbuffer size, `u32` constant-data offset, `u64`
//! constant-data size. Without the magic the whole payload is a flatbuffer (older files).

use std::ops::Range;

use etch_kernels::BackendError;

/// Magic at bytes 4..8.
pub const MAGIC: &[u8; 4] = b"XH00";
/// Bytes the header occupies (through the constant-data size).
pub const HEADER_LEN: usize = 30;
/// A flatbuffer holds at least its root offset and its identifier.
const MIN_FLATBUFFER_LEN: usize = 8;

/// Where the flatbuffer and the constant region lie inside the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadLayout {
    /// Byte range of the XNNGraph flatbuffer.
    pub flatbuffer: Range<usize>,
    /// Byte range of the constant region (empty without a header).
    pub constants: Range<usize>,
    /// Whether the payload had an `XH00` header (false: a legacy headerless blob).
    pub has_header: bool,
}

fn header_error(field: &str, reason: String) -> BackendError {
    BackendError::InvalidPayload {
        field: format!("header.{field}"),
        reason,
    }
}

/// The `N` bytes of `bytes` at `at`, zeros where `bytes` is too short.
fn bytes_at<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes
        .get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .unwrap_or([0; N])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes_at(bytes, at))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes_at(bytes, at))
}

/// Reads the header of `payload`, checking every range against the payload's length
/// and that the constant region follows the flatbuffer without overlapping it.
///
/// ```
/// use etch_xnnpack::header::parse_header;
/// // A headerless blob is a flatbuffer from its first byte.
/// let legacy = [0u8; 16];
/// assert_eq!(parse_header(&legacy).unwrap().flatbuffer, 0..16);
/// ```
pub fn parse_header(payload: &[u8]) -> Result<PayloadLayout, BackendError> {
    if payload.get(4..8) != Some(MAGIC.as_slice()) {
        if payload.len() < MIN_FLATBUFFER_LEN {
            return Err(header_error(
                "magic",
                format!(
                    "payload of {} bytes is neither an XH00 header nor a flatbuffer",
                    payload.len()
                ),
            ));
        }
        return Ok(PayloadLayout {
            flatbuffer: 0..payload.len(),
            constants: 0..0,
            has_header: false,
        });
    }
    if payload.len() < HEADER_LEN {
        return Err(header_error(
            "length",
            format!(
                "payload of {} bytes is shorter than the {HEADER_LEN}-byte header",
                payload.len()
            ),
        ));
    }
    let len = payload.len() as u64;
    let fb_offset = u64::from(u32_at(payload, 10));
    let fb_size = u64::from(u32_at(payload, 14));
    let const_offset = u64::from(u32_at(payload, 18));
    let const_size = u64_at(payload, 22);
    if fb_size < MIN_FLATBUFFER_LEN as u64 {
        return Err(header_error(
            "flatbuffer_size",
            format!("{fb_size} is below the minimum of {MIN_FLATBUFFER_LEN}"),
        ));
    }
    if fb_offset > len || fb_size > len - fb_offset {
        return Err(header_error(
            "flatbuffer_offset",
            format!("offset {fb_offset} + size {fb_size} exceeds the payload of {len} bytes"),
        ));
    }
    if const_offset > len || const_size > len - const_offset {
        return Err(header_error(
            "constant_data_offset",
            format!("offset {const_offset} + size {const_size} exceeds the payload of {len} bytes"),
        ));
    }
    if const_offset < fb_offset || const_offset - fb_offset < fb_size {
        return Err(header_error(
            "constant_data_offset",
            format!(
                "constant data at {const_offset} overlaps the flatbuffer at {fb_offset} (+{fb_size})"
            ),
        ));
    }
    // All four fit in the payload length, so they fit usize.
    let (fb_offset, fb_size) = (fb_offset as usize, fb_size as usize);
    let (const_offset, const_size) = (const_offset as usize, const_size as usize);
    Ok(PayloadLayout {
        flatbuffer: fb_offset..fb_offset + fb_size,
        constants: const_offset..const_offset + const_size,
        has_header: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(fb: (u32, u32), consts: (u32, u64), total: usize) -> Vec<u8> {
        let mut b = vec![0u8; total];
        b[4..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&30u16.to_le_bytes());
        b[10..14].copy_from_slice(&fb.0.to_le_bytes());
        b[14..18].copy_from_slice(&fb.1.to_le_bytes());
        b[18..22].copy_from_slice(&consts.0.to_le_bytes());
        b[22..30].copy_from_slice(&consts.1.to_le_bytes());
        b
    }

    #[test]
    fn ranges_are_checked() {
        let ok = parse_header(&header((32, 16), (48, 16), 64)).unwrap();
        assert_eq!(ok.flatbuffer, 32..48);
        assert_eq!(ok.constants, 48..64);
        assert!(parse_header(&header((32, 64), (48, 16), 64)).is_err());
        assert!(parse_header(&header((32, 16), (40, 16), 64)).is_err());
        assert!(parse_header(&header((32, 16), (48, u64::MAX), 64)).is_err());
        assert!(parse_header(&header((32, 4), (48, 0), 64)).is_err());
        assert!(parse_header(&header((32, 16), (48, 0), 64)[..20]).is_err());
        assert!(parse_header(&[1, 2, 3]).is_err());
    }
}
