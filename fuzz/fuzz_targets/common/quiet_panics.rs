//! Panics that etch catches itself must not end a fuzz run; a panic that escapes etch
//! must. Shared by the targets whose code under test catches panics of a dependency.
//!
//! libfuzzer-sys's panic hook aborts at once, before unwinding, so a panic that etch
//! deliberately catches (`read_npy` turns a panic of the `npyz` header parser into an
//! error; `HfTokenizer` does the same for the `tokenizers` crate) would still end the run
//! as a crash. [`install`] replaces the hook with one that only remembers the panic;
//! [`run`] prints it and re-raises it if it escapes etch, and libfuzzer-sys's
//! `catch_unwind` around the target then aborts.

use std::cell::RefCell;

thread_local! {
    /// The message and place of the latest panic on this thread, kept by the hook.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs the hook that only remembers a panic (the target's `init`).
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        let text = info.to_string();
        LAST_PANIC.with(|last| *last.borrow_mut() = Some(text));
    }));
}

/// Runs one input; a panic that escapes it is reported, then re-raised.
pub fn run(one_input: impl FnOnce() + std::panic::UnwindSafe) {
    if let Err(payload) = std::panic::catch_unwind(one_input) {
        // Escaped etch: a real finding. Say what it was, then let libfuzzer-sys abort.
        let text = LAST_PANIC.with(|last| last.borrow_mut().take());
        eprintln!("panic escaped etch: {}", text.as_deref().unwrap_or("(no message)"));
        std::panic::resume_unwind(payload);
    }
}
