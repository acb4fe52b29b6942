//! A byte-level `tokenizer.json` with one token per byte: a real Hugging Face tokenizer
//! that drives the tiny test models (vocabularies of 256 ids) in tests and examples.

/// GPT-2's printable stand-in for each byte, as byte-level BPE tokenizers spell them.
fn byte_char(b: u8) -> char {
    let keeps = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if keeps(b) {
        return char::from(b);
    }
    let shifted = (0..b).filter(|&x| !keeps(x)).count() as u32;
    char::from_u32(256 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The JSON of a byte-level BPE `tokenizer.json` with ids 0..256 (one per byte, no
/// merges) and then `extra` word tokens `extra0`, `extra1`, ...
///
/// ```
/// let json = etch_llm::tokenizer::byte_level_tokenizer_json(0);
/// let t = etch_llm::load_tokenizer_bytes(json.to_string().as_bytes(), "bytes").unwrap();
/// assert_eq!(t.encode("hi").unwrap(), [104, 105]);
/// ```
pub fn byte_level_tokenizer_json(extra: usize) -> serde_json::Value {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), (b as u64).into());
    }
    for i in 0..extra {
        vocab.insert(format!("extra{i}"), (256 + i as u64).into());
    }
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": []}
    })
}
