//! Bundled programs (`.bpte`): the fixture made with ExecuTorch's own `BundledProgram`
//! API parses to the suites, cases and tensors it was written with, and truncated or
//! mutated bytes give a typed error or a usable file, never a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use etch_format::{BundledProgramFile, BundledValue, FormatError, ScalarType, is_bundled_program};
use etch_memory::SharedBytes;

fn fixture_bytes() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/bundled_two_methods.bpte");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(bytes: Vec<u8>) -> Result<BundledProgramFile, FormatError> {
    BundledProgramFile::from_bytes(SharedBytes::from_vec_aligned(bytes).expect("alloc"))
}

#[test]
fn fixture_parses_to_its_suites_and_program() {
    let bytes = fixture_bytes();
    assert!(is_bundled_program(&bytes));
    let file = load(bytes).unwrap();
    let suites = file.method_test_suites();
    let names: Vec<_> = suites.iter().map(|s| s.method_name.as_str()).collect();
    // The official writer orders the suites by method name.
    assert_eq!(names, ["affine", "forward"]);
    assert_eq!(suites[0].test_cases.len(), 2);
    assert_eq!(suites[1].test_cases.len(), 3);
    for case in &suites[1].test_cases {
        assert_eq!(case.inputs.len(), 2);
        assert_eq!(case.expected_outputs.len(), 2);
        let BundledValue::Tensor(t) = &case.expected_outputs[0] else {
            panic!("a tensor output")
        };
        assert_eq!(
            (t.scalar_type, t.sizes.as_slice()),
            (ScalarType::Float, &[3, 4][..])
        );
        assert_eq!(t.dim_order, [0, 1]);
        assert_eq!(file.tensor_data(t).len(), 48);
    }
    let BundledValue::Tensor(t) = &suites[0].test_cases[0].inputs[0] else {
        panic!("a tensor input")
    };
    assert_eq!(
        (t.scalar_type, t.sizes.as_slice()),
        (ScalarType::Int, &[2, 5][..])
    );

    // The wrapped program is the plain .pte, byte for byte.
    let pte = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/bundled_two_methods.pte"),
    )
    .unwrap();
    assert_eq!(file.program_bytes(), pte.as_slice());
    let program = file.program_file().unwrap();
    let mut methods: Vec<_> = program.method_names().collect();
    methods.sort();
    assert_eq!(methods, ["affine", "forward"]);
}

#[test]
fn a_pte_is_not_a_bundled_program() {
    let pte = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/bundled_two_methods.pte"),
    )
    .unwrap();
    assert!(!is_bundled_program(&pte));
    let err = load(pte).unwrap_err();
    assert!(matches!(err, FormatError::BadIdentifier { .. }), "{err}");
}

/// Loads `bytes` and, if they load, touches everything a verifier reads.
fn exercise(bytes: Vec<u8>) {
    let Ok(file) = load(bytes) else { return };
    for suite in file.method_test_suites() {
        for case in &suite.test_cases {
            for v in case.inputs.iter().chain(&case.expected_outputs) {
                if let BundledValue::Tensor(t) = v {
                    let n = t.numel() * t.scalar_type.element_size();
                    assert_eq!(file.tensor_data(t).len(), n, "tensor data outside the file");
                }
            }
        }
    }
    let _ = file.program_file();
}

/// A cut file loads only when what was cut is the writer's trailing zero padding.
#[test]
fn every_truncation_is_a_typed_error() {
    let bytes = fixture_bytes();
    for len in 0..bytes.len() {
        let cut = bytes[..len].to_vec();
        let result = catch_unwind(AssertUnwindSafe(|| load(cut)));
        match result {
            Ok(Err(_)) => {}
            Ok(Ok(_)) => assert!(
                bytes[len..].iter().all(|b| *b == 0),
                "truncated to {len} bytes, the file still loads"
            ),
            Err(_) => panic!("truncated to {len} bytes: panic"),
        }
    }
}

#[test]
fn mutations_never_panic() {
    let bytes = fixture_bytes();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut errors = 0;
    for round in 0..4000 {
        let mut m = bytes.clone();
        for _ in 0..1 + round % 4 {
            let at = (next() % m.len() as u64) as usize;
            m[at] = match next() % 4 {
                0 => 0xff,
                1 => 0,
                2 => m[at].wrapping_add(1),
                _ => next() as u8,
            };
        }
        errors += usize::from(load(m.clone()).is_err());
        catch_unwind(AssertUnwindSafe(|| exercise(m)))
            .unwrap_or_else(|_| panic!("mutation round {round}: panic"));
    }
    assert!(errors > 0, "no mutation was rejected");
}

#[test]
fn bad_fields_name_their_path() {
    let bytes = fixture_bytes();
    let file = load(bytes.clone()).unwrap();
    // Make the first expected output's scalar type unknown: find its byte by
    // scanning for a mutation that yields an UnknownTag at that path.
    let mut found = false;
    for at in 0..bytes.len() {
        if file.program_range().offset <= at && at < file.program_range().end() {
            continue;
        }
        let mut m = bytes.clone();
        m[at] = 99;
        if let Err(FormatError::UnknownTag { path, what, .. }) = load(m)
            && what == "ScalarType"
        {
            assert!(path.starts_with("method_test_suites["), "{path}");
            assert!(path.ends_with(".val.scalar_type"), "{path}");
            found = true;
            break;
        }
    }
    assert!(found, "no byte holds a tensor's scalar type");
}
