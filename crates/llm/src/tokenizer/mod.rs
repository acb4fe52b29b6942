//! Tokenizers: Hugging Face `tokenizer.json`, tiktoken-style BPE files (Llama 3) and the
//! llama2.c binary format, behind one trait, plus streaming detokenisation.

mod byte_level;
mod hf;
mod ids_only;
mod llama2c;
mod stream;
mod tiktoken;
mod token_bytes;

use std::path::Path;

pub use byte_level::byte_level_tokenizer_json;
pub use hf::HfTokenizer;
pub use ids_only::IdsOnlyTokenizer;
pub use llama2c::Llama2cTokenizer;
pub use stream::StreamDecoder;
pub use tiktoken::TiktokenTokenizer;
pub use token_bytes::TokenBytes;

use crate::LlmError;

/// Text to token ids and back.
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) are
    /// recognised; nothing (no BOS) is added.
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError>;
    /// The text of `ids` (special tokens left out).
    fn decode(&self, ids: &[u32]) -> Result<String, LlmError>;
    /// The id of a token given by its text, if the vocabulary has it.
    fn token_id(&self, token: &str) -> Option<u32>;
    /// Number of ids.
    fn vocab_size(&self) -> usize;
    /// Beginning-of-sequence id, if the tokenizer defines one.
    fn bos_id(&self) -> Option<u32>;
    /// End-of-sequence ids the tokenizer defines.
    fn eos_ids(&self) -> Vec<u32>;
    /// A short name of the format, for messages.
    fn kind(&self) -> &'static str;
    /// The bytes of every id, for streaming without decode calls: special tokens have
    /// none. The default decodes each id alone; formats override it with their table.
    fn token_bytes(&self) -> Result<TokenBytes, LlmError> {
        TokenBytes::by_decoding_each(self.vocab_size(), |id| self.decode(&[id]))
    }
}

/// Most bytes a tokenizer file may have (a guard against reading something huge).
pub const MAX_TOKENIZER_BYTES: u64 = 512 * 1024 * 1024;

pub(crate) fn tokenizer_error(path: &str, message: impl Into<String>) -> LlmError {
    LlmError::Tokenizer {
        path: path.to_string(),
        message: message.into(),
    }
}

/// Loads a tokenizer, recognising its format from the contents: a JSON object is a
/// Hugging Face `tokenizer.json`; lines of `base64 rank` are tiktoken; anything else is
/// tried as a llama2.c `tokenizer.bin`.
pub fn load_tokenizer(path: &Path) -> Result<Box<dyn Tokenizer>, LlmError> {
    let shown = path.display().to_string();
    let len = std::fs::metadata(path)
        .map_err(|e| tokenizer_error(&shown, e.to_string()))?
        .len();
    if len > MAX_TOKENIZER_BYTES {
        return Err(tokenizer_error(
            &shown,
            format!("{len} bytes is too large for a tokenizer"),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| tokenizer_error(&shown, e.to_string()))?;
    load_tokenizer_bytes(&bytes, &shown)
}

/// Like [`load_tokenizer`], from bytes; `name` labels errors.
pub fn load_tokenizer_bytes(bytes: &[u8], name: &str) -> Result<Box<dyn Tokenizer>, LlmError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first == Some(b'{') {
        return Ok(Box::new(HfTokenizer::from_bytes(bytes, name)?));
    }
    if TiktokenTokenizer::looks_like(bytes) {
        return Ok(Box::new(TiktokenTokenizer::from_bytes(bytes, name)?));
    }
    Llama2cTokenizer::from_bytes(bytes, name)
        .map(|t| Box::new(t) as Box<dyn Tokenizer>)
        .map_err(|e| match e {
            LlmError::Tokenizer { path, message } => LlmError::Tokenizer {
                path,
                message: format!(
                    "not a tokenizer.json, a tiktoken file, or a llama2.c tokenizer.bin ({message})"
                ),
            },
            other => other,
        })
}
