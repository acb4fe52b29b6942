//! Inputs the fuzzers (fuzz/) found, kept as regression cases.

use std::path::Path;

#[test]
fn an_npy_header_claiming_4_gib_is_an_error_before_allocating() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz_npy_header_4gib.npy");
    let bytes = std::fs::read(&path).expect("regression file");
    let err = etch_runtime::npy::read_npy(&bytes, "x.npy").expect_err("must be rejected");
    assert!(err.to_string().contains("header claims"), "{err}");
}
