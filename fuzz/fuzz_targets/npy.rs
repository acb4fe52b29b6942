//! Fuzzes the `.npy` reader that `etch run --input` and the conformance tests use:
//! any bytes must read as a tensor or fail with an `NpyError` (never a panic that escapes
//! etch); whatever reads is converted to every dtype etch reads inputs as and written
//! back out.

#![no_main]

use etch_base::ScalarType;
use etch_runtime::npy::{read_npy, read_npy_as, write_npy};
use libfuzzer_sys::fuzz_target;

thread_local! {
    /// The message and place of the latest panic on this thread, kept by the hook.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// libfuzzer-sys's panic hook aborts at once, before unwinding, so a panic that etch
/// deliberately catches (`read_npy` turns a panic of the `npyz` header parser into an
/// error) would still end the run as a crash. This hook only remembers the panic; the
/// target prints it and re-raises it if it escapes etch, and libfuzzer-sys's
/// `catch_unwind` then aborts.
fn install_quiet_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let text = info.to_string();
        LAST_PANIC.with(|last| *last.borrow_mut() = Some(text));
    }));
}

fn one_input(data: &[u8]) {
    if let Ok(t) = read_npy(data, "fuzz.npy") {
        let _ = write_npy(&t);
    }
    for dtype in [ScalarType::Float, ScalarType::Long, ScalarType::Bool] {
        let _ = read_npy_as(data, "fuzz.npy", dtype);
    }
}

fuzz_target!(init: install_quiet_panic_hook(), |data: &[u8]| {
    if let Err(payload) = std::panic::catch_unwind(|| one_input(data)) {
        // Escaped etch: a real finding. Say what it was, then let libfuzzer-sys abort.
        let text = LAST_PANIC.with(|last| last.borrow_mut().take());
        eprintln!("panic escaped etch: {}", text.as_deref().unwrap_or("(no message)"));
        std::panic::resume_unwind(payload);
    }
});
