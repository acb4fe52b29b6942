//! Hugging Face `tokenizer.json`, through the `tokenizers` crate.

use super::{TokenBytes, Tokenizer, tokenizer_error};
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
        // The `tokenizers` crate panics on some malformed files (an `expect` in its
        // decoder deserialisation, found by fuzzing): that is an invalid file too.
        let parsed = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes))
            .map_err(|_| {
                tokenizer_error(
                    name,
                    "invalid tokenizer.json: the tokenizers crate rejected it",
                )
            })?;
        let inner =
            parsed.map_err(|e| tokenizer_error(name, format!("invalid tokenizer.json: {e}")))?;
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

    fn token_bytes(&self) -> Result<TokenBytes, LlmError> {
        let vocab = self.vocab_size();
        let steps = decoder_steps(&self.inner);
        let has = |name: &str| steps.iter().any(|s| s == name);
        let byte_level = has("ByteLevel");
        if !byte_level && !has("Metaspace") && !has("Replace") && !has("ByteFallback") {
            // WordPiece, CTC, ...: pieces depend on neighbours; decode each alone.
            return TokenBytes::by_decoding_each(vocab, |id| self.decode(&[id]));
        }
        let added = self.inner.get_added_tokens_decoder();
        let chars = byte_level.then(gpt2_char_bytes);
        let mut table = TokenBytes::with_capacity(vocab);
        let mut piece = Vec::new();
        for id in 0..vocab as u32 {
            piece.clear();
            if let Some(token) = added.get(&id) {
                // Decoding skips special tokens; other added tokens are their text.
                if !token.special {
                    piece.extend_from_slice(token.content.as_bytes());
                }
            } else if let Some(token) = self.inner.id_to_token(id) {
                match &chars {
                    Some(chars) => byte_level_bytes(&token, chars, &mut piece),
                    None => sentencepiece_bytes(&token, has("ByteFallback"), &mut piece),
                }
            }
            table.push(&piece);
        }
        Ok(table)
    }
}

/// The `type` of the tokenizer's decoder and of every decoder in its sequence.
fn decoder_steps(inner: &tokenizers::Tokenizer) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        if let Some(t) = v.get("type").and_then(|t| t.as_str()) {
            out.push(t.to_string());
        }
        if let Some(list) = v.get("decoders").and_then(|d| d.as_array()) {
            list.iter().for_each(|d| walk(d, out));
        }
    }
    let mut out = Vec::new();
    if let Some(v) = inner
        .get_decoder()
        .and_then(|d| serde_json::to_value(d).ok())
    {
        walk(&v, &mut out);
    }
    out
}

/// Byte-level BPE's printable stand-in for each byte (GPT-2's table): printable Latin-1
/// bytes are themselves, the others are U+0100 onwards in byte order. Indexed by char.
fn gpt2_char_bytes() -> std::collections::HashMap<char, u8> {
    let keeps = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut shifted = 0u32;
    let mut map = std::collections::HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if keeps(b) {
            char::from(b)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        map.insert(c, b);
    }
    map
}

/// A byte-level token's bytes; a token with a char outside the table is its UTF-8 text
/// (as the `tokenizers` decoder does).
fn byte_level_bytes(token: &str, chars: &std::collections::HashMap<char, u8>, out: &mut Vec<u8>) {
    let start = out.len();
    for c in token.chars() {
        match chars.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return;
            }
        }
    }
}

/// A SentencePiece token's bytes: `<0xNN>` byte fallback pieces are one byte, and the
/// word marker U+2581 is a space. (A leading space is kept: generated text continues
/// the prompt.)
fn sentencepiece_bytes(token: &str, byte_fallback: bool, out: &mut Vec<u8>) {
    if byte_fallback
        && let Some(hex) = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'))
        && hex.len() == 2
        && let Ok(b) = u8::from_str_radix(hex, 16)
    {
        out.push(b);
        return;
    }
    let mut buf = [0u8; 4];
    for c in token.chars() {
        let c = if c == '\u{2581}' { ' ' } else { c };
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_table_is_a_bijection() {
        let map = gpt2_char_bytes();
        assert_eq!(map.len(), 256);
        assert_eq!(map[&'!'], b'!');
        assert_eq!(map[&'\u{0120}'], b' ', "GPT-2 spells a space as U+0120");
        assert_eq!(map[&'\u{0100}'], 0);
    }

    fn sentencepiece_json() -> Vec<u8> {
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [
                {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 4, "content": "<extra>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}
            ],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}
            ]},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                      "vocab": {"<s>": 0, "\u{2581}hi": 1, "<0xC3>": 2, "<0xA9>": 3, "<extra>": 4}, "merges": []}
        });
        serde_json::to_vec(&json).unwrap()
    }

    #[test]
    fn sentencepiece_table_has_byte_fallback_spaces_and_added_tokens() {
        let t = HfTokenizer::from_bytes(&sentencepiece_json(), "sp").unwrap();
        let table = t.token_bytes().unwrap();
        assert_eq!(table.get(0), Some(&[][..]), "special: no text");
        assert_eq!(table.get(1), Some(&b" hi"[..]));
        assert_eq!(table.get(2), Some(&[0xC3u8][..]));
        assert_eq!(table.get(4), Some(&b"<extra>"[..]));
        // The table agrees with the decoder (which strips the one leading space).
        let ids = [1, 2, 3];
        let mut bytes = Vec::new();
        for id in ids {
            bytes.extend_from_slice(table.get(id).unwrap());
        }
        assert_eq!(
            String::from_utf8(bytes).unwrap().trim_start(),
            t.decode(&ids).unwrap()
        );
    }
}
