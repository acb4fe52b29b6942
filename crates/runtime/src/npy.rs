//! Reading and writing NumPy `.npy` files (untrusted input: every field is checked).
//!
//! The header is parsed by `npyz`; the data of a little-endian, C-order array is
//! taken as is. bf16 has no NumPy dtype: it travels as `<u2` bits and is named by the
//! caller (see [`read_npy_as`]).

use std::path::Path;

use etch_format::ScalarType;

use crate::HostTensor;

/// Most dimensions an `.npy` input may have.
const MAX_NPY_RANK: usize = 16;

/// Why an `.npy` file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid .npy file: {message}")]
    Header { path: String, message: String },
    #[error(
        "{path}: unsupported dtype {dtype:?} (supported: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1 <u2 <u4 <u8)"
    )]
    Dtype { path: String, dtype: String },
    #[error("{path}: Fortran-order arrays are not supported; save with np.ascontiguousarray")]
    FortranOrder { path: String },
    #[error("{path}: shape {shape:?} is too large or has more than {MAX_NPY_RANK} dimensions")]
    Shape { path: String, shape: Vec<u64> },
    #[error("{path}: truncated: the header promises {expected} data bytes, the file has {found}")]
    Truncated {
        path: String,
        expected: usize,
        found: usize,
    },
    #[error("{path}: {found} data bytes after the array, expected none")]
    TrailingBytes { path: String, found: usize },
    #[error("{path}: cannot store {dtype} as .npy")]
    Unwritable { path: String, dtype: ScalarType },
}

fn dtype_of(type_str: &str) -> Option<ScalarType> {
    Some(match type_str {
        "<f4" => ScalarType::Float,
        "<f8" => ScalarType::Double,
        "<f2" => ScalarType::Half,
        "<i8" => ScalarType::Long,
        "<i4" => ScalarType::Int,
        "<i2" => ScalarType::Short,
        "|i1" | "<i1" => ScalarType::Char,
        "|u1" | "<u1" => ScalarType::Byte,
        "|b1" | "<b1" => ScalarType::Bool,
        "<u2" => ScalarType::UInt16,
        "<u4" => ScalarType::UInt32,
        "<u8" => ScalarType::UInt64,
        _ => return None,
    })
}

fn type_str_of(dtype: ScalarType) -> Option<&'static str> {
    Some(match dtype {
        ScalarType::Float => "<f4",
        ScalarType::Double => "<f8",
        ScalarType::Half => "<f2",
        ScalarType::Long => "<i8",
        ScalarType::Int => "<i4",
        ScalarType::Short => "<i2",
        ScalarType::Char => "|i1",
        ScalarType::Byte => "|u1",
        ScalarType::Bool => "|b1",
        ScalarType::UInt16 | ScalarType::BFloat16 => "<u2",
        ScalarType::UInt32 => "<u4",
        ScalarType::UInt64 => "<u8",
        _ => return None,
    })
}

/// Parses `.npy` bytes; `path` names the source in errors.
///
/// ```
/// let bytes = etch_runtime::npy::write_npy(&etch_runtime::HostTensor::from_slice(&[2], &[1i64, 2])).unwrap();
/// let t = etch_runtime::npy::read_npy(&bytes, "x.npy").unwrap();
/// assert_eq!(t.sizes, vec![2]);
/// assert!(etch_runtime::npy::read_npy(&bytes[..bytes.len() - 1], "x.npy").is_err());
/// ```
pub fn read_npy(bytes: &[u8], path: &str) -> Result<HostTensor, NpyError> {
    check_header(bytes, path)?;
    let mut rest = bytes;
    // npyz multiplies the shape's dimensions unchecked: with overflow checks on (debug
    // builds, the fuzzers) a shape whose product overflows u64 panics inside it (found by
    // fuzz/fuzz_targets/npy.rs). Any panic of the parser is an invalid file; in builds
    // without overflow checks the product wraps and the checked size below rejects it.
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        npyz::NpyHeader::from_reader(&mut rest)
    }));
    let header = match parsed {
        Ok(Ok(header)) => header,
        Ok(Err(e)) => {
            return Err(NpyError::Header {
                path: path.to_string(),
                message: e.to_string(),
            });
        }
        Err(_) => {
            return Err(NpyError::Header {
                path: path.to_string(),
                message: "the header parser failed on it (a shape whose size overflows?)"
                    .to_string(),
            });
        }
    };
    let file = npyz::NpyFile::with_header(header, &[][..]);
    let type_str = match file.dtype() {
        npyz::DType::Plain(t) => t.to_string(),
        other => format!("{other:?}"),
    };
    let dtype = dtype_of(&type_str).ok_or_else(|| NpyError::Dtype {
        path: path.to_string(),
        dtype: type_str.clone(),
    })?;
    let shape64 = file.shape().to_vec();
    if file.order() == npyz::Order::Fortran && shape64.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(NpyError::FortranOrder {
            path: path.to_string(),
        });
    }
    let shape_error = || NpyError::Shape {
        path: path.to_string(),
        shape: shape64.clone(),
    };
    if shape64.len() > MAX_NPY_RANK {
        return Err(shape_error());
    }
    let sizes: Vec<usize> = shape64
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| shape_error()))
        .collect::<Result<_, _>>()?;
    let nbytes = sizes
        .iter()
        .try_fold(dtype.element_size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(shape_error)?;
    if rest.len() < nbytes {
        return Err(NpyError::Truncated {
            path: path.to_string(),
            expected: nbytes,
            found: rest.len(),
        });
    }
    if rest.len() > nbytes {
        return Err(NpyError::TrailingBytes {
            path: path.to_string(),
            found: rest.len() - nbytes,
        });
    }
    if dtype == ScalarType::Bool && rest.iter().any(|&b| b > 1) {
        return Err(NpyError::Header {
            path: path.to_string(),
            message: "bool array holds a byte other than 0 or 1".to_string(),
        });
    }
    Ok(HostTensor {
        dtype,
        sizes,
        data: rest.to_vec(),
    })
}

/// Deepest nesting of brackets (`{`, `[`, `(`) an `.npy` header may have. NumPy writes
/// 2 (the dict and the shape tuple); structured dtypes, which etch does not read, nest a
/// few levels more. The parser behind `npyz` takes time exponential in the depth: a
/// 249-byte header of 118 nested `{` kept it busy for more than 25 minutes (found by
/// fuzz/fuzz_targets/npy.rs).
const MAX_NPY_HEADER_NESTING: usize = 8;

/// Checks the header before the parser sees it: the header length the preamble claims
/// must fit in the file (the parser would allocate whatever the preamble claims, up to
/// 4 GiB, before reading it), and brackets must not nest deeper than
/// [`MAX_NPY_HEADER_NESTING`].
fn check_header(bytes: &[u8], path: &str) -> Result<(), NpyError> {
    if !bytes.starts_with(b"\x93NUMPY") {
        return Ok(());
    }
    let (start, claimed) = match (bytes.get(6), bytes.get(8..12)) {
        (Some(1), Some(b)) => (10, u64::from(u16::from_le_bytes([b[0], b[1]])) + 10),
        (Some(_), Some(b)) => (
            12,
            u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])) + 12,
        ),
        _ => return Ok(()),
    };
    let header_error = |message: String| NpyError::Header {
        path: path.to_string(),
        message,
    };
    let end = match usize::try_from(claimed) {
        Ok(end) if end <= bytes.len() => end,
        _ => {
            return Err(header_error(format!(
                "the header claims {claimed} bytes but the file has {}",
                bytes.len()
            )));
        }
    };
    let mut depth = 0usize;
    for &b in bytes.get(start..end).unwrap_or_default() {
        match b {
            b'{' | b'[' | b'(' => {
                depth += 1;
                if depth > MAX_NPY_HEADER_NESTING {
                    return Err(header_error(format!(
                        "the header nests brackets more than {MAX_NPY_HEADER_NESTING} deep"
                    )));
                }
            }
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Like [`read_npy`], then re-labels the dtype: `<u2` data may be read as bf16.
pub fn read_npy_as(bytes: &[u8], path: &str, dtype: ScalarType) -> Result<HostTensor, NpyError> {
    let mut t = read_npy(bytes, path)?;
    if t.dtype != dtype {
        let relabel = t.dtype == ScalarType::UInt16 && dtype == ScalarType::BFloat16;
        if !relabel {
            return Err(NpyError::Dtype {
                path: path.to_string(),
                dtype: format!("{} (expected {})", t.dtype, dtype),
            });
        }
        t.dtype = dtype;
    }
    Ok(t)
}

/// Reads an `.npy` file.
pub fn read_npy_file(path: &Path) -> Result<HostTensor, NpyError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io {
        path: shown.clone(),
        source,
    })?;
    read_npy(&bytes, &shown)
}

/// Serialises a tensor as `.npy` (format 1.0, C order; bf16 as `<u2` bits).
pub fn write_npy(t: &HostTensor) -> Result<Vec<u8>, NpyError> {
    let type_str = type_str_of(t.dtype).ok_or(NpyError::Unwritable {
        path: String::new(),
        dtype: t.dtype,
    })?;
    let shape = match t.sizes.as_slice() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header =
        format!("{{'descr': '{type_str}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&t.data);
    Ok(out)
}

/// Writes a tensor to an `.npy` file.
pub fn write_npy_file(path: &Path, t: &HostTensor) -> Result<(), NpyError> {
    let bytes = write_npy(t).map_err(|e| match e {
        NpyError::Unwritable { dtype, .. } => NpyError::Unwritable {
            path: path.display().to_string(),
            dtype,
        },
        other => other,
    })?;
    std::fs::write(path, bytes).map_err(|source| NpyError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        for t in [
            HostTensor::from_slice(&[2, 2], &[1f32, 2., 3., 4.]),
            HostTensor::from_slice(&[3], &[1i64, -2, 3]),
            HostTensor::from_slice(&[], &[7i32]),
            HostTensor::from_slice(&[0, 4], &[] as &[f64]),
            HostTensor {
                dtype: ScalarType::Bool,
                sizes: vec![3],
                data: vec![1, 0, 1],
            },
        ] {
            let bytes = write_npy(&t).unwrap();
            assert_eq!(read_npy(&bytes, "t").unwrap(), t);
        }
    }

    #[test]
    fn rejects_bad_files() {
        let good = write_npy(&HostTensor::from_slice(&[2], &[1f32, 2.])).unwrap();
        assert!(read_npy(&good[..5], "t").is_err());
        assert!(matches!(
            read_npy(&good[..good.len() - 2], "t"),
            Err(NpyError::Truncated { .. })
        ));
        let mut extra = good.clone();
        extra.push(0);
        assert!(matches!(
            read_npy(&extra, "t"),
            Err(NpyError::TrailingBytes { .. })
        ));
        let patch = |from: &[u8], to: &[u8]| {
            let at = good.windows(from.len()).position(|w| w == from).unwrap();
            let mut v = good.clone();
            v.splice(at..at + from.len(), to.iter().copied());
            v
        };
        assert!(matches!(
            read_npy(&patch(b"(2,)", b"(9,)"), "t"),
            Err(NpyError::Truncated { .. })
        ));
        let huge = patch(b"(2,)", b"(99999999999999,)");
        assert!(read_npy(&huge, "t").is_err());
        assert!(matches!(
            read_npy(&patch(b"<f4", b">f4"), "t"),
            Err(NpyError::Dtype { .. })
        ));
        let mut bad_bool = write_npy(&HostTensor {
            dtype: ScalarType::Bool,
            sizes: vec![1],
            data: vec![1],
        })
        .unwrap();
        *bad_bool.last_mut().unwrap() = 7;
        assert!(read_npy(&bad_bool, "t").is_err());
    }
}
