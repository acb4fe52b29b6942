//! Streaming detokenisation: text is released only when it forms whole UTF-8
//! characters, so a character split over several tokens is never printed in halves.

use super::Tokenizer;
use crate::LlmError;

/// Turns a growing list of token ids into text increments.
///
/// It decodes a short window of recent tokens and releases the part that became final,
/// holding back text that ends in an incomplete character (U+FFFD).
#[derive(Debug, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl StreamDecoder {
    /// A decoder with no tokens.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token; returns the text that became final (possibly empty).
    pub fn push(&mut self, tokenizer: &dyn Tokenizer, id: u32) -> Result<String, LlmError> {
        self.ids.push(id);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let text = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        if text.len() > prefix.len()
            && !text.ends_with('\u{FFFD}')
            && text.is_char_boundary(prefix.len())
        {
            let new = text[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(new)
        } else {
            Ok(String::new())
        }
    }

    /// Text still held back at the end (an incomplete character, as U+FFFD).
    pub fn finish(&mut self, tokenizer: &dyn Tokenizer) -> Result<String, LlmError> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let text = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(text.get(prefix.len()..).unwrap_or("").to_string())
    }
}
