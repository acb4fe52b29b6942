//! Streaming detokenisation: text is released only when it forms whole UTF-8
//! characters, so a character split over several tokens is never printed in halves.

use super::TokenBytes;
use crate::LlmError;

/// Longest UTF-8 character.
const MAX_CHAR_BYTES: usize = 4;

/// Turns token ids into text increments from a [`TokenBytes`] table, without
/// allocating once built: the bytes of an incomplete character wait in a buffer reserved
/// for the longest token, and released text goes through a reused string.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    ready: String,
}

impl StreamDecoder {
    /// A decoder whose buffers fit any token of `table`.
    pub fn new(table: &TokenBytes) -> Self {
        let most = table.longest() + MAX_CHAR_BYTES;
        Self {
            pending: Vec::with_capacity(most),
            // Each invalid byte becomes U+FFFD (3 bytes).
            ready: String::with_capacity(3 * most),
        }
    }

    /// Adds a token; returns the text that became final (possibly empty). Invalid bytes
    /// come out as U+FFFD, as a lossy decode writes them.
    pub fn push(&mut self, table: &TokenBytes, id: u32) -> Result<&str, LlmError> {
        let bytes = table.get(id).ok_or(LlmError::TokenOutOfRange {
            id: id as u64,
            vocab: table.len(),
        })?;
        self.pending.extend_from_slice(bytes);
        self.ready.clear();
        let mut used = 0;
        loop {
            match std::str::from_utf8(&self.pending[used..]) {
                Ok(s) => {
                    self.ready.push_str(s);
                    used = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid_up_to` bytes are UTF-8: this cannot fail.
                    if let Ok(s) = std::str::from_utf8(&self.pending[used..used + valid]) {
                        self.ready.push_str(s);
                    }
                    used += valid;
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => break,
                        Some(bad) => {
                            self.ready.push(char::REPLACEMENT_CHARACTER);
                            used += bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..used);
        Ok(&self.ready)
    }

    /// Text still held back at the end (an incomplete character, as U+FFFD); the
    /// decoder is then empty.
    pub fn finish(&mut self) -> &str {
        self.ready.clear();
        if !self.pending.is_empty() {
            self.ready.push(char::REPLACEMENT_CHARACTER);
            self.pending.clear();
        }
        &self.ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> TokenBytes {
        let mut t = TokenBytes::with_capacity(4);
        for piece in [&b"a"[..], b"\xE2\x82", b"\xAC", b"\xFF"] {
            t.push(piece);
        }
        t
    }

    #[test]
    fn holds_split_characters_and_replaces_invalid_bytes() {
        let t = table();
        let mut s = StreamDecoder::new(&t);
        assert_eq!(s.push(&t, 0).unwrap(), "a");
        assert_eq!(s.push(&t, 1).unwrap(), "");
        assert_eq!(s.push(&t, 2).unwrap(), "\u{20AC}");
        assert_eq!(s.push(&t, 3).unwrap(), "\u{FFFD}");
        assert_eq!(s.push(&t, 1).unwrap(), "");
        assert_eq!(s.finish(), "\u{FFFD}");
        assert_eq!(s.finish(), "");
        assert!(s.push(&t, 9).is_err());
    }
}
