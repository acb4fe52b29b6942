//! Inputs the fuzzers (fuzz/) found, kept as regression cases.

use std::path::Path;

#[test]
fn a_tokenizer_json_the_tokenizers_crate_panics_on_is_an_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz_hf_decoder_panic.json");
    let bytes = std::fs::read(&path).expect("regression file");
    let err = etch_llm::tokenizer::HfTokenizer::from_bytes(&bytes, "fuzz.json")
        .err()
        .expect("must be rejected");
    assert!(err.to_string().contains("invalid tokenizer.json"), "{err}");
}
