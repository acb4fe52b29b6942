//! Fuzzes what `etch serve` does with a chat request body before the model sees it:
//! JSON, parameters, sampling fields, messages, session ids, tool-call parsing of the
//! messages' text, and rendering with the built-in chat templates. Any bytes must give
//! a rendered prompt or an `ApiError` (a 4xx), never a panic.

#![no_main]

use etch_llm::{ChatTemplate, JinjaChatTemplate};
use etch_serve::http::check_chat_body;
use libfuzzer_sys::fuzz_target;

#[path = "common/quiet_panics.rs"]
mod quiet_panics;

fuzz_target!(init: quiet_panics::install(), |data: &[u8]| {
    quiet_panics::run(|| {
        for format in [ChatTemplate::ChatMl, ChatTemplate::Llama3] {
            let _ = check_chat_body(data, &JinjaChatTemplate::builtin(format));
        }
    });
});
