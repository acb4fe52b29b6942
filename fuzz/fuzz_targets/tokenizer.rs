//! Fuzzes the tokenizer loaders: the first byte picks the format (Hugging Face
//! `tokenizer.json`, tiktoken, llama2.c `tokenizer.bin`, or detection from the
//! contents as `etch generate` does), the rest is the file. Whatever loads encodes
//! and decodes text and ids (out-of-range ones included) and builds its token-bytes
//! table. Every input must end in an `LlmError`, never a panic that escapes etch.

#![no_main]

use etch_llm::tokenizer::{HfTokenizer, Llama2cTokenizer, TiktokenTokenizer};
use etch_llm::{LlmError, StreamDecoder, Tokenizer, load_tokenizer_bytes};
use libfuzzer_sys::fuzz_target;

#[path = "common/quiet_panics.rs"]
mod quiet_panics;

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

fn one_input(data: &[u8]) {
    let Some((&selector, file)) = data.split_first() else {
        return;
    };
    if let Ok(t) = load(selector, file) {
        exercise(t.as_ref(), file);
    }
}

fuzz_target!(init: quiet_panics::install(), |data: &[u8]| {
    quiet_panics::run(|| one_input(data));
});
