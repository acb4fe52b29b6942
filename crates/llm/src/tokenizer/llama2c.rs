//! The llama2.c binary tokenizer (`tokenizer.bin`): scored pieces merged greedily,
//! with byte fallback tokens `<0x00>`..`<0xFF>` at ids 3..259.

use std::collections::HashMap;

use super::{TokenBytes, Tokenizer, tokenizer_error};
use crate::LlmError;

/// Most tokens a llama2.c tokenizer may define.
const MAX_VOCAB: usize = 1 << 20;

/// A llama2.c tokenizer.
pub struct Llama2cTokenizer {
    pieces: Vec<Vec<u8>>,
    scores: Vec<f32>,
    lookup: HashMap<Vec<u8>, u32>,
    bos: u32,
    eos: u32,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    name: &'a str,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], LlmError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                tokenizer_error(
                    self.name,
                    format!("truncated at byte {} (wanted {n} more)", self.at),
                )
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, LlmError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn parse_pieces(
    r: &mut Reader<'_>,
    count: Option<usize>,
    max_len: usize,
) -> Result<(Vec<Vec<u8>>, Vec<f32>), LlmError> {
    let mut pieces = Vec::new();
    let mut scores = Vec::new();
    while count.map_or(r.at < r.bytes.len(), |c| pieces.len() < c) {
        if pieces.len() >= MAX_VOCAB {
            return Err(tokenizer_error(r.name, "more than 2^20 tokens"));
        }
        let score = f32::from_bits(r.u32()?);
        let len = r.u32()? as usize;
        if len > max_len {
            return Err(tokenizer_error(
                r.name,
                format!(
                    "token {} has length {len}, above the declared maximum {max_len}",
                    pieces.len()
                ),
            ));
        }
        pieces.push(r.take(len)?.to_vec());
        scores.push(score);
    }
    Ok((pieces, scores))
}

impl Llama2cTokenizer {
    /// Parses either layout: ExecuTorch's (`vocab_size, bos, eos, max_token_length`
    /// header) or karpathy's original (`max_token_length`, then tokens to the end).
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Self, LlmError> {
        let header = |at| Reader { bytes, at, name };
        // ExecuTorch layout: the declared vocabulary must consume the file exactly.
        let mut r = header(0);
        if let (Ok(vocab), Ok(bos), Ok(eos), Ok(max_len)) = (r.u32(), r.u32(), r.u32(), r.u32()) {
            let (vocab, max_len) = (vocab as usize, max_len as usize);
            if (1..=MAX_VOCAB).contains(&vocab)
                && (bos as usize) < vocab
                && (eos as usize) < vocab
                && let Ok((pieces, scores)) = parse_pieces(&mut r, Some(vocab), max_len)
                && r.at == bytes.len()
            {
                return Ok(Self::build(pieces, scores, bos, eos));
            }
        }
        let mut r = header(0);
        let max_len = r.u32()? as usize;
        let (pieces, scores) = parse_pieces(&mut r, None, max_len)?;
        if pieces.len() < 3 {
            return Err(tokenizer_error(name, "fewer than 3 tokens"));
        }
        Ok(Self::build(pieces, scores, 1, 2))
    }

    fn build(pieces: Vec<Vec<u8>>, scores: Vec<f32>, bos: u32, eos: u32) -> Self {
        let mut lookup = HashMap::with_capacity(pieces.len());
        for (i, p) in pieces.iter().enumerate() {
            lookup.entry(p.clone()).or_insert(i as u32);
        }
        Self {
            pieces,
            scores,
            lookup,
            bos,
            eos,
        }
    }

    fn byte_piece(piece: &[u8]) -> Option<u8> {
        let s = std::str::from_utf8(piece).ok()?;
        let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
        if hex.len() == 2 {
            u8::from_str_radix(hex, 16).ok()
        } else {
            None
        }
    }
}

impl Tokenizer for Llama2cTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        let mut ids: Vec<u32> = Vec::with_capacity(text.len() + 1);
        if text.is_empty() {
            return Ok(ids);
        }
        if let Some(&space) = self.lookup.get(b" ".as_slice()) {
            ids.push(space);
        }
        let mut buf = [0u8; 4];
        for c in text.chars() {
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            match self.lookup.get(bytes) {
                Some(&id) => ids.push(id),
                None => ids.extend(bytes.iter().map(|&b| b as u32 + 3)),
            }
        }
        let mut merged = Vec::new();
        loop {
            let mut best: Option<(f32, usize, u32)> = None;
            for i in 0..ids.len().saturating_sub(1) {
                let (Some(a), Some(b)) = (
                    self.pieces.get(ids[i] as usize),
                    self.pieces.get(ids[i + 1] as usize),
                ) else {
                    continue;
                };
                merged.clear();
                merged.extend_from_slice(a);
                merged.extend_from_slice(b);
                if let Some(&id) = self.lookup.get(&merged) {
                    let score = self.scores[id as usize];
                    if best.is_none_or(|(s, _, _)| score > s) {
                        best = Some((score, i, id));
                    }
                }
            }
            let Some((_, i, id)) = best else { break };
            ids[i] = id;
            ids.remove(i + 1);
        }
        Ok(ids)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, LlmError> {
        let mut out = Vec::new();
        let mut prev: Option<u32> = None;
        for &id in ids {
            if id == self.bos || id == self.eos {
                prev = Some(id);
                continue;
            }
            let piece = self
                .pieces
                .get(id as usize)
                .ok_or(LlmError::TokenOutOfRange {
                    id: id as u64,
                    vocab: self.pieces.len(),
                })?;
            let piece = match (prev, piece.first()) {
                (Some(p), Some(b' ')) if p == self.bos => &piece[1..],
                _ => piece.as_slice(),
            };
            match Self::byte_piece(piece) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(piece),
            }
            prev = Some(id);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        self.lookup.get(token.as_bytes()).copied()
    }

    fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    fn bos_id(&self) -> Option<u32> {
        Some(self.bos)
    }

    fn eos_ids(&self) -> Vec<u32> {
        vec![self.eos]
    }

    fn kind(&self) -> &'static str {
        "llama2.c tokenizer.bin"
    }

    fn token_bytes(&self) -> Result<TokenBytes, LlmError> {
        let mut table = TokenBytes::with_capacity(self.pieces.len());
        for (id, piece) in self.pieces.iter().enumerate() {
            let id = id as u32;
            if id == self.bos || id == self.eos {
                table.push(&[]);
            } else {
                match Self::byte_piece(piece) {
                    Some(b) => table.push(&[b]),
                    None => table.push(piece),
                }
            }
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny ExecuTorch-layout tokenizer: specials, 256 byte pieces, letters, merges.
    pub(crate) fn tiny() -> Vec<u8> {
        let mut pieces: Vec<(Vec<u8>, f32)> = vec![
            (b"<unk>".to_vec(), 0.0),
            (b"<s>".to_vec(), 0.0),
            (b"</s>".to_vec(), 0.0),
        ];
        for b in 0..=255u8 {
            pieces.push((format!("<0x{b:02X}>").into_bytes(), 0.0));
        }
        for (p, s) in [
            (" ", -1.0),
            ("h", -2.0),
            ("i", -2.0),
            ("hi", -0.5),
            (" hi", -0.1),
        ] {
            pieces.push((p.as_bytes().to_vec(), s));
        }
        let mut out = Vec::new();
        for v in [pieces.len() as u32, 1, 2, 8] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for (p, s) in &pieces {
            out.extend_from_slice(&s.to_bits().to_le_bytes());
            out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    #[test]
    fn encodes_with_merges_and_byte_fallback() {
        let t = Llama2cTokenizer::from_bytes(&tiny(), "tiny").unwrap();
        let ids = t.encode("hi\u{e9}").unwrap();
        let hi = t.token_id(" hi").unwrap();
        assert_eq!(ids, vec![hi, 0xC3 + 3, 0xA9 + 3]);
        assert_eq!(t.decode(&ids).unwrap(), " hi\u{e9}");
        assert_eq!(t.decode(&[1, hi]).unwrap(), "hi");
        let table = t.token_bytes().unwrap();
        assert_eq!(table.get(hi), Some(&b" hi"[..]));
        assert_eq!(table.get(0xC3 + 3), Some(&[0xC3u8][..]));
        assert_eq!(table.get(1), Some(&[][..]), "BOS has no text");
    }

    #[test]
    fn rejects_garbage() {
        let bytes = tiny();
        for cut in [0, 3, 17, bytes.len() - 1] {
            let _ = Llama2cTokenizer::from_bytes(&bytes[..cut], "cut");
        }
        let mut huge = bytes.clone();
        huge[16..24].copy_from_slice(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f]);
        // Must not panic or allocate wildly; either layout may reject it.
        let _ = Llama2cTokenizer::from_bytes(&huge, "huge");
    }
}
