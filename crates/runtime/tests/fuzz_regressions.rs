//! Inputs the fuzzers (fuzz/) found, kept as regression cases.

use std::path::Path;

#[test]
fn an_npy_header_claiming_4_gib_is_an_error_before_allocating() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz_npy_header_4gib.npy");
    let bytes = std::fs::read(&path).expect("regression file");
    let err = etch_runtime::npy::read_npy(&bytes, "x.npy").expect_err("must be rejected");
    assert!(err.to_string().contains("header claims"), "{err}");
}

#[test]
fn an_npy_header_of_deeply_nested_brackets_is_an_error_at_once() {
    // 118 nested `{`: the header parser behind npyz took more than 25 minutes on it.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz_npy_nested_braces.npy");
    let bytes = std::fs::read(&path).expect("regression file");
    let err = etch_runtime::npy::read_npy(&bytes, "x.npy").expect_err("must be rejected");
    assert!(err.to_string().contains("nests brackets"), "{err}");
}

/// A version-1 `.npy` file of one f32 whose header's `shape` is `inner`.
fn npy_with_shape(inner: &str) -> Vec<u8> {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {inner}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.0f32.to_le_bytes());
    bytes
}

#[test]
fn npy_headers_nested_up_to_the_limit_still_reach_the_parser() {
    let t = etch_runtime::npy::read_npy(&npy_with_shape("(1,)"), "x.npy").expect("a plain header");
    assert_eq!(t.sizes, vec![1]);
    // The dict and 7 tuples: 8 levels, the most allowed; the parser then refuses the shape.
    let err = etch_runtime::npy::read_npy(&npy_with_shape("(((((((1,),),),),),),)"), "x.npy")
        .expect_err("a nested shape is not a shape");
    assert!(!err.to_string().contains("nests brackets"), "{err}");
    let err = etch_runtime::npy::read_npy(&npy_with_shape("((((((((1,),),),),),),),)"), "x.npy")
        .expect_err("9 levels");
    assert!(err.to_string().contains("nests brackets"), "{err}");
}

#[test]
fn an_npy_shape_whose_size_overflows_u64_is_an_error() {
    // 'shape': (7192828238425955439, 2, 7, 8): npyz's unchecked product panicked with
    // overflow checks on.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz_npy_shape_overflow.npy");
    let bytes = std::fs::read(&path).expect("regression file");
    assert!(etch_runtime::npy::read_npy(&bytes, "x.npy").is_err());
}
