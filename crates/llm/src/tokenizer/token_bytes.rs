//! The bytes each token id stands for, in one table built when the tokenizer loads, so
//! that streaming detokenisation is a table look-up and never a decode call.

use crate::LlmError;

/// The bytes of every token id, packed: `bytes[ends[id - 1]..ends[id]]`.
///
/// Special tokens (BOS, EOS, chat markers) have no bytes: streamed text leaves them out,
/// as `Tokenizer::decode` does.
#[derive(Debug, Clone, Default)]
pub struct TokenBytes {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    longest: usize,
}

impl TokenBytes {
    /// A table with room for `tokens` ids.
    pub fn with_capacity(tokens: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(tokens * 4),
            ends: Vec::with_capacity(tokens),
            longest: 0,
        }
    }

    /// Appends the next id's bytes.
    pub fn push(&mut self, token: &[u8]) {
        self.bytes.extend_from_slice(token);
        self.ends.push(self.bytes.len());
        self.longest = self.longest.max(token.len());
    }

    /// A table built by decoding each id alone (for tokenizers without a direct
    /// table; exact for tokenizers whose pieces do not depend on their neighbours).
    pub fn by_decoding_each(
        vocab: usize,
        decode: impl Fn(u32) -> Result<String, LlmError>,
    ) -> Result<Self, LlmError> {
        let mut table = Self::with_capacity(vocab);
        for id in 0..vocab {
            table.push(decode(id as u32)?.as_bytes());
        }
        Ok(table)
    }

    /// The bytes of `id`, or `None` outside the table.
    pub fn get(&self, id: u32) -> Option<&[u8]> {
        let id = id as usize;
        let end = *self.ends.get(id)?;
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        self.bytes.get(start..end)
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when the table has no ids.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The most bytes one token has.
    pub fn longest(&self) -> usize {
        self.longest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_looks_up() {
        let mut t = TokenBytes::with_capacity(3);
        t.push(b"ab");
        t.push(b"");
        t.push(b"\xE2\x82");
        assert_eq!(t.get(0), Some(&b"ab"[..]));
        assert_eq!(t.get(1), Some(&b""[..]));
        assert_eq!(t.get(2), Some(&b"\xE2\x82"[..]));
        assert_eq!(t.get(3), None);
        assert_eq!((t.len(), t.longest()), (3, 2));
    }
}
