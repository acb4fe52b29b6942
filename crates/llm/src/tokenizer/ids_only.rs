//! A stand-in tokenizer for running a model on token ids alone (benchmarks): it knows
//! the vocabulary's size and nothing else.

use super::{TokenBytes, Tokenizer, tokenizer_error};
use crate::LlmError;

/// A tokenizer with `vocab` ids and no text: encoding fails, every id decodes to
/// nothing. For `etch bench` and other runs that feed token ids directly.
#[derive(Debug, Clone, Copy)]
pub struct IdsOnlyTokenizer {
    vocab: usize,
}

impl IdsOnlyTokenizer {
    /// A stand-in for a vocabulary of `vocab` ids.
    pub fn new(vocab: usize) -> Self {
        Self { vocab }
    }
}

impl Tokenizer for IdsOnlyTokenizer {
    fn encode(&self, _text: &str) -> Result<Vec<u32>, LlmError> {
        Err(tokenizer_error(
            "(none)",
            "no tokenizer was loaded: only token ids can be given",
        ))
    }
    fn decode(&self, _ids: &[u32]) -> Result<String, LlmError> {
        Ok(String::new())
    }
    fn token_id(&self, _token: &str) -> Option<u32> {
        None
    }
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn bos_id(&self) -> Option<u32> {
        None
    }
    fn eos_ids(&self) -> Vec<u32> {
        Vec::new()
    }
    fn kind(&self) -> &'static str {
        "ids only"
    }
    fn token_bytes(&self) -> Result<TokenBytes, LlmError> {
        let mut table = TokenBytes::with_capacity(self.vocab);
        for _ in 0..self.vocab {
            table.push(&[]);
        }
        Ok(table)
    }
}
