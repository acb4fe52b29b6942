//! Fuzzes `etch-worker`'s request lines (the JSONL the official server writes on its
//! stdin) and its cancel-frame reader: any bytes must parse into a request or a
//! `BadRequest` message, never a panic.

#![no_main]

use etch_serve::worker::{CancelBook, FrameReader, parse};
use libfuzzer_sys::fuzz_target;

#[path = "common/quiet_panics.rs"]
mod quiet_panics;

fuzz_target!(init: quiet_panics::install(), |data: &[u8]| {
    quiet_panics::run(|| {
        if let Ok(line) = std::str::from_utf8(data) {
            let _ = parse(line);
        }
        let book = CancelBook::default();
        let mut frames = FrameReader::default();
        frames.feed(data, &mut |id| book.on_frame(id));
    });
});
