//! Fuzzes the tokenizer loaders: the first byte picks the format (Hugging Face
//! `tokenizer.json`, tiktoken, llama2.c `tokenizer.bin`, or detection from the
//! contents as `etch generate` does), the rest is the file. Whatever loads encodes
//! and decodes text and ids (out-of-range ones included) and builds its token-bytes
//! table. Every input must end in an `LlmError`, never a panic that escapes etch.

#![no_main]

use etch_llm::tokenizer::{HfTokenizer, Llama2cTokenizer, TiktokenTokenizer};
use etch_llm::{LlmError, StreamDecoder, Tokenizer, load_tokenizer_bytes};
use libfuzzer_sys::fuzz_target;

fn load(selector: u8, file: &[u8]) -> Result<Box<dyn Tokenizer>, LlmError> {
    const NAME: &str = "fuzz";
    Ok(match selector % 4 {
        0 => Box::new(HfTokenizer::from_bytes(file, NAME)?),
        1 => Box::new(TiktokenTokenizer::from_bytes(file, NAME)?),
        2 => Box::new(Llama2cTokenizer::from_bytes(file, NAME)?),
        _ => load_tokenizer_bytes(file, NAME)?,
    })
}

fn exercise(t: &dyn Tokenizer, file: &[u8]) {
    let vocab = t.vocab_size();
    let tail = String::from_utf8_lossy(&file[file.len().saturating_sub(64)..]);
    for text in ["Hello, world! <|endoftext|> ünïcödé 你好 \n\t  ", &tail] {
        if let Ok(ids) = t.encode(text) {
            let _ = t.decode(&ids);
        }
    }
    let probe = [0, 1, vocab.saturating_sub(1) as u32, vocab as u32, u32::MAX];
    let _ = t.decode(&probe);
    let _ = (t.bos_id(), t.eos_ids(), t.token_id("<s>"), t.kind());
    if let Ok(bytes) = t.token_bytes() {
        let mut stream = StreamDecoder::new(&bytes);
        for id in probe {
            let _ = stream.push(&bytes, id);
        }
        let _ = stream.finish();
    }
}

thread_local! {
    /// The message and place of the latest panic on this thread, kept by the hook.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// libfuzzer-sys's panic hook aborts at once, before unwinding, so a panic that etch
/// deliberately catches (the `tokenizers` crate panics on some malformed tokenizer.json
/// files; `HfTokenizer` turns that into an error) would still end the run as a crash.
/// This hook only remembers the panic; `one_input` prints it and re-raises it if it
/// escapes etch, and libfuzzer-sys's `catch_unwind` around the target then aborts.
fn install_quiet_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let text = info.to_string();
        LAST_PANIC.with(|last| *last.borrow_mut() = Some(text));
    }));
}

fn one_input(data: &[u8]) {
    let Some((&selector, file)) = data.split_first() else {
        return;
    };
    if let Ok(t) = load(selector, file) {
        exercise(t.as_ref(), file);
    }
}

fuzz_target!(init: install_quiet_panic_hook(), |data: &[u8]| {
    let run = std::panic::catch_unwind(|| one_input(data));
    if let Err(payload) = run {
        // Escaped etch: a real finding. Say what it was, then let libfuzzer-sys abort.
        let text = LAST_PANIC.with(|last| last.borrow_mut().take());
        eprintln!("panic escaped etch: {}", text.as_deref().unwrap_or("(no message)"));
        std::panic::resume_unwind(payload);
    }
});
