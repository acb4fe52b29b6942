//! Fuzzes the bundled-program (`.bpte`) loader: any input must load or fail with a
//! `FormatError`; whatever loads is walked (every test value's tensor bytes, their
//! conversion to row-major host tensors, a comparison of each expected output with
//! itself, the wrapped program's load) and must not panic either.

#![no_main]

use etch_format::{BundledProgramFile, BundledValue};
use etch_memory::SharedBytes;
use etch_runtime::bundled::{Tolerance, compare_output, host_value};
use libfuzzer_sys::fuzz_target;

fn exercise(file: &BundledProgramFile) {
    for suite in file.method_test_suites() {
        for case in &suite.test_cases {
            for v in case.inputs.iter().chain(&case.expected_outputs) {
                if let BundledValue::Tensor(t) = v {
                    let n = t.numel() * t.scalar_type.element_size();
                    assert_eq!(file.tensor_data(t).len(), n);
                }
                let host = host_value(file, v);
                let _ = compare_output(&host, &host, Tolerance::OFFICIAL);
            }
        }
    }
    let _ = file.program_file();
}

fuzz_target!(|data: &[u8]| {
    let Ok(bytes) = SharedBytes::from_vec_aligned(data.to_vec()) else {
        return;
    };
    if let Ok(file) = BundledProgramFile::from_bytes(bytes) {
        exercise(&file);
    }
});
