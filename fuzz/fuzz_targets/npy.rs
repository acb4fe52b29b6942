//! Fuzzes the `.npy` reader that `etch run --input` and the conformance tests use:
//! any bytes must read as a tensor or fail with an `NpyError` (never a panic that escapes
//! etch); whatever reads is converted to every dtype etch reads inputs as and written
//! back out.

#![no_main]

use etch_base::ScalarType;
use etch_runtime::npy::{read_npy, read_npy_as, write_npy};
use libfuzzer_sys::fuzz_target;

#[path = "common/quiet_panics.rs"]
mod quiet_panics;

fn one_input(data: &[u8]) {
    if let Ok(t) = read_npy(data, "fuzz.npy") {
        let _ = write_npy(&t);
    }
    for dtype in [ScalarType::Float, ScalarType::Long, ScalarType::Bool] {
        let _ = read_npy_as(data, "fuzz.npy", dtype);
    }
}

fuzz_target!(init: quiet_panics::install(), |data: &[u8]| {
    quiet_panics::run(|| one_input(data));
});
