//! `.ptd` (FlatTensor) loading: a file written by ExecuTorch's own serializer,
//! builder-made files for each rule, and corrupt variants.

mod common;

use std::path::PathBuf;

use common::data_file::*;
use etch_format::{DataFile, FormatError, ScalarType};
use etch_memory::SharedBytes;

fn load(bytes: Vec<u8>) -> Result<DataFile, FormatError> {
    DataFile::from_bytes(SharedBytes::from_vec_aligned(bytes).unwrap())
}

#[track_caller]
fn expect_err(d: &DataFileB, path: &str) -> FormatError {
    match load(d.to_bytes()) {
        Ok(_) => panic!("expected an error at {path}"),
        Err(e) => {
            assert_eq!(e.path(), Some(path), "wrong path; error: {e}");
            e
        }
    }
}

fn modified(f: impl FnOnce(&mut DataFileB)) -> DataFileB {
    let mut d = sample_data_file();
    f(&mut d);
    d
}

fn sample_ptd() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/sample.ptd")
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `tests/data/sample.ptd` was written by ExecuTorch 1.5.1's FlatTensorSerializer
/// (see `make_sample_ptd.py`).
#[test]
fn reads_executorch_written_file() {
    for file in [
        DataFile::read(sample_ptd()).unwrap(),
        DataFile::map(sample_ptd(), false).unwrap(),
    ] {
        assert_eq!(file.header().header_length, 40);
        assert_eq!(
            file.keys().collect::<Vec<_>>(),
            ["linear.weight", "linear.bias", "weight_alias", "opaque"]
        );
        // Two keys share buffer 0, so there are 3 segments.
        assert_eq!(file.segments().len(), 3);
        let (range, layout) = file.get("linear.weight").unwrap();
        let layout = layout.unwrap();
        assert_eq!(layout.scalar_type, ScalarType::Float);
        assert_eq!(layout.sizes, [2, 3]);
        assert_eq!(layout.dim_order, [0, 1]);
        assert_eq!(layout.nbytes(), 24);
        assert_eq!(
            f32s(file.slice(range).unwrap()),
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
        let (alias, alias_layout) = file.get("weight_alias").unwrap();
        assert_eq!(alias, range);
        assert_eq!(alias_layout.unwrap().dim_order, [1, 0]);
        let (bias, layout) = file.get("linear.bias").unwrap();
        assert_eq!(layout.unwrap().scalar_type, ScalarType::Long);
        let longs: Vec<i64> = file
            .slice(bias)
            .unwrap()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(longs, [7, 8, 9]);
        let (opaque, layout) = file.get("opaque").unwrap();
        assert!(layout.is_none());
        assert_eq!(file.slice(opaque).unwrap(), (0..10).collect::<Vec<u8>>());
        assert_eq!(opaque.offset % 64, 0, "alignment 64 requested");
        assert!(file.get("missing").is_none());
    }
}

#[test]
fn builder_file_parses() {
    let file = load(sample_data_file().to_bytes()).unwrap();
    let (w, layout) = file.get("w").unwrap();
    assert_eq!(f32s(file.slice(w).unwrap()), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(layout.unwrap().sizes, [2, 3]);
    assert_eq!(file.slice(file.get("blob").unwrap().0).unwrap(), [1, 2, 3]);
    assert_eq!(file.entries().len(), 2);
    assert_eq!(file.version(), 0);
}

#[test]
fn header_rules() {
    let bytes = sample_data_file().to_bytes();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = bytes.clone();
        f(&mut b);
        load(b).unwrap_err()
    };
    let e = with(&|b| b[4..8].copy_from_slice(b"FT02"));
    assert!(matches!(e, FormatError::IncompatibleVersion { .. }), "{e}");
    let e = with(&|b| b[4..8].copy_from_slice(b"ET12"));
    assert!(matches!(e, FormatError::BadIdentifier { .. }), "{e}");
    assert_eq!(
        with(&|b| b[8..12].copy_from_slice(b"FH02")).path(),
        Some("header.magic")
    );
    assert_eq!(
        with(&|b| b[12..16].copy_from_slice(&32u32.to_le_bytes())).path(),
        Some("header.header_length")
    );
    assert_eq!(
        with(&|b| b[24..32].copy_from_slice(&u64::MAX.to_le_bytes())).path(),
        Some("header.flatbuffer_size")
    );
    assert_eq!(
        with(&|b| b[40..48].copy_from_slice(&(1u64 << 20).to_le_bytes())).path(),
        Some("header.segment_data_size")
    );
    assert_eq!(
        with(&|b| b.truncate(30)).path(),
        Some("header.header_length")
    );
    assert_eq!(with(&|b| b.truncate(6)).path(), Some("header.identifier"));
}

#[test]
fn table_rules() {
    expect_err(
        &modified(|d| d.entries[1].segment_index = 2),
        "named_data[1].segment_index",
    );
    expect_err(
        &modified(|d| d.segment_table = Some(vec![(0, 24), (32, 100)])),
        "segments[1]",
    );
    expect_err(
        &modified(|d| d.entries[0].layout = Some((9, vec![2, 3], vec![0, 1]))),
        "named_data[0].tensor_layout.scalar_type",
    );
    expect_err(
        &modified(|d| d.entries[0].layout = Some((6, vec![2, -3], vec![0, 1]))),
        "named_data[0].tensor_layout.sizes[1]",
    );
    expect_err(
        &modified(|d| d.entries[0].layout = Some((6, vec![2, 3], vec![1, 1]))),
        "named_data[0].tensor_layout.dim_order[1]",
    );
    expect_err(
        &modified(|d| d.entries[0].layout = Some((6, vec![2, 3], vec![0]))),
        "named_data[0].tensor_layout.dim_order",
    );
    let e = expect_err(
        &modified(|d| d.entries[0].layout = Some((6, vec![2, 4], vec![0, 1]))),
        "named_data[0].tensor_layout",
    );
    assert!(matches!(e, FormatError::OutOfBounds { .. }), "{e}");
}

#[test]
fn corrupt_variants_never_panic() {
    let mut originals = vec![sample_data_file().to_bytes()];
    originals.push(std::fs::read(sample_ptd()).unwrap());
    let mut count = 0;
    for original in originals {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for len in 0..original.len() {
            let _ = load(original[..len].to_vec());
            count += 1;
        }
        for pos in (0..original.len().saturating_sub(3)).step_by(2) {
            let old = u32::from_le_bytes(original[pos..pos + 4].try_into().unwrap());
            for v in [
                0,
                u32::MAX,
                0x8000_0000,
                old.wrapping_add(4),
                old.wrapping_sub(4),
            ] {
                let mut b = original.clone();
                b[pos..pos + 4].copy_from_slice(&v.to_le_bytes());
                if let Ok(file) = load(b) {
                    for key in file.keys().map(str::to_owned).collect::<Vec<_>>() {
                        let (range, layout) = file.get(&key).expect("listed key");
                        assert!(file.slice(range).is_some());
                        if let Some(l) = layout {
                            assert!(l.nbytes() <= range.len);
                        }
                    }
                }
                count += 1;
            }
        }
        for _ in 0..2000 {
            let mut b = original.clone();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let pos = (seed % b.len() as u64) as usize;
            b[pos] ^= 1 << (seed >> 61);
            let _ = load(b);
            count += 1;
        }
    }
    assert!(count > 5000);
}
