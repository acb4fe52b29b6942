//! Hugging Face `tokenizer.json`, through the `tokenizers` crate.

use super::{Tokenizer, tokenizer_error};
use crate::LlmError;

/// A Hugging Face tokenizer.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    name: String,
    bos: Option<u32>,
    eos: Vec<u32>,
}

impl HfTokenizer {
    /// Parses `tokenizer.json` bytes; `name` labels errors.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Self, LlmError> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| tokenizer_error(name, format!("invalid tokenizer.json: {e}")))?;
        let find = |candidates: &[&str]| candidates.iter().find_map(|t| inner.token_to_id(t));
        let bos = find(&["<|begin_of_text|>", "<s>", "<bos>"]);
        let eos: Vec<u32> = [
            "<|end_of_text|>",
            "<|eot_id|>",
            "</s>",
            "<eos>",
            "<|endoftext|>",
            "<|im_end|>",
        ]
        .iter()
        .filter_map(|t| inner.token_to_id(t))
        .collect();
        Ok(Self {
            inner,
            name: name.to_string(),
            bos,
            eos,
        })
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| tokenizer_error(&self.name, format!("encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, LlmError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| tokenizer_error(&self.name, format!("decode: {e}")))
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    fn eos_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn kind(&self) -> &'static str {
        "tokenizer.json"
    }
}
