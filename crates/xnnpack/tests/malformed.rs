//! Malformed payloads give typed errors, never panics: truncations, a mutation loop over
//! the real payload, bad ids, and missing named data.

mod common;

use common::*;
use etch_kernels::backend::NoNamedData;
use etch_kernels::{Backend, BackendError};
use etch_xnnpack::XnnpackBackend;

#[test]
fn truncations_fail_cleanly() {
    let file = linear_program();
    let named = FileNamedData(&file);
    let bytes = payload(&file);
    for len in 0..bytes.len() {
        // Must not panic; most lengths fail.
        let _ = XnnpackBackend.init(&bytes[..len], &init_ctx(&named));
    }
    assert!(
        XnnpackBackend
            .init(&bytes[..40], &init_ctx(&named))
            .is_err()
    );
}

#[test]
fn mutations_never_panic() {
    let file = linear_program();
    let named = FileNamedData(&file);
    let bytes = payload(&file);
    let mut next = xorshift(0x9e3779b97f4a7c15);
    let mut errors = 0;
    for _ in 0..3000 {
        let mut m = bytes.clone();
        for _ in 0..1 + next() % 3 {
            let at = (next() as usize) % m.len();
            m[at] = match next() % 4 {
                0 => 0,
                1 => 0xff,
                2 => m[at].wrapping_add(1),
                _ => next() as u8,
            };
        }
        if XnnpackBackend.init(&m, &init_ctx(&named)).is_err() {
            errors += 1;
        }
    }
    assert!(errors > 0);
}

#[test]
fn missing_named_data_is_named() {
    let file = linear_program();
    let err = XnnpackBackend
        .init(&payload(&file), &init_ctx(&NoNamedData))
        .err()
        .unwrap();
    assert!(
        matches!(err, BackendError::MissingNamedData { ref key } if key.len() == 64),
        "{err}"
    );
}

#[test]
fn bad_identifier_and_header() {
    let file = linear_program();
    let named = FileNamedData(&file);
    let mut bytes = payload(&file);
    let fb = u32::from_le_bytes(bytes[10..14].try_into().unwrap()) as usize;
    bytes[fb + 4..fb + 8].copy_from_slice(b"ZZ99");
    let err = XnnpackBackend
        .init(&bytes, &init_ctx(&named))
        .err()
        .unwrap();
    assert!(
        matches!(err, BackendError::InvalidPayload { ref field, .. } if field == "identifier"),
        "{err}"
    );
    let mut bytes = payload(&file);
    bytes[14..18].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = XnnpackBackend
        .init(&bytes, &init_ctx(&named))
        .err()
        .unwrap();
    assert!(
        matches!(err, BackendError::InvalidPayload { ref field, .. } if field.starts_with("header.")),
        "{err}"
    );
}
