//! tiktoken-style byte-level BPE files (`base64-token rank` per line), as Llama 3 ships,
//! with Llama 3's special tokens after the ranked vocabulary.

use std::collections::HashMap;

use base64::Engine;

use super::{TokenBytes, Tokenizer, tokenizer_error};
use crate::LlmError;

/// Llama 3's pre-tokenisation pattern.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Number of special tokens Llama 3 appends.
const LLAMA3_SPECIAL_COUNT: usize = 256;

/// Most ranked tokens a file may define.
const MAX_RANKS: usize = 1 << 22;

fn llama3_special(i: usize) -> String {
    match i {
        0 => "<|begin_of_text|>".into(),
        1 => "<|end_of_text|>".into(),
        2 => "<|reserved_special_token_0|>".into(),
        3 => "<|reserved_special_token_1|>".into(),
        4 => "<|finetune_right_pad_id|>".into(),
        5 => "<|reserved_special_token_2|>".into(),
        6 => "<|start_header_id|>".into(),
        7 => "<|end_header_id|>".into(),
        8 => "<|eom_id|>".into(),
        9 => "<|eot_id|>".into(),
        10 => "<|python_tag|>".into(),
        n => format!("<|reserved_special_token_{}|>", n - 8),
    }
}

/// A tiktoken tokenizer with Llama 3 special tokens.
pub struct TiktokenTokenizer {
    ranks: HashMap<Vec<u8>, u32>,
    tokens: Vec<Vec<u8>>,
    specials: Vec<(String, u32)>,
    pattern: fancy_regex::Regex,
}

impl TiktokenTokenizer {
    /// True when the first line looks like `base64 rank`.
    pub fn looks_like(bytes: &[u8]) -> bool {
        let first = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
        let Ok(line) = std::str::from_utf8(first) else {
            return false;
        };
        let mut parts = line.split(' ');
        matches!(
            (parts.next(), parts.next(), parts.next()),
            (Some(tok), Some(rank), None)
                if !tok.is_empty()
                    && base64::engine::general_purpose::STANDARD.decode(tok).is_ok()
                    && rank.trim().parse::<u32>().is_ok()
        )
    }

    /// Parses a tiktoken file; `name` labels errors.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Self, LlmError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| tokenizer_error(name, format!("not UTF-8: {e}")))?;
        let mut ranks = HashMap::new();
        let mut max_rank = 0u32;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let bad = |what: &str| tokenizer_error(name, format!("line {}: {what}", n + 1));
            let (tok, rank) = line
                .split_once(' ')
                .ok_or_else(|| bad("expected `base64 rank`"))?;
            let tok = base64::engine::general_purpose::STANDARD
                .decode(tok)
                .map_err(|e| bad(&format!("bad base64: {e}")))?;
            let rank: u32 = rank.trim().parse().map_err(|_| bad("bad rank"))?;
            if rank as usize >= MAX_RANKS {
                return Err(bad("rank too large"));
            }
            max_rank = max_rank.max(rank);
            ranks.insert(tok, rank);
        }
        if ranks.is_empty() {
            return Err(tokenizer_error(name, "no tokens"));
        }
        let n = max_rank as usize + 1;
        let mut tokens = vec![Vec::new(); n];
        for (tok, &rank) in &ranks {
            tokens[rank as usize] = tok.clone();
        }
        let specials = (0..LLAMA3_SPECIAL_COUNT)
            .map(|i| (llama3_special(i), (n + i) as u32))
            .collect();
        let pattern = fancy_regex::Regex::new(LLAMA3_PATTERN)
            .map_err(|e| tokenizer_error(name, format!("pattern: {e}")))?;
        Ok(Self {
            ranks,
            tokens,
            specials,
            pattern,
        })
    }

    fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if let Some(&r) = self.ranks.get(piece) {
            out.push(r);
            return;
        }
        // Byte-pair merging: repeatedly merge the adjacent pair of lowest rank.
        let mut parts: Vec<(usize, usize)> = (0..piece.len()).map(|i| (i, i + 1)).collect();
        loop {
            let mut best: Option<(u32, usize)> = None;
            for i in 0..parts.len().saturating_sub(1) {
                if let Some(&r) = self.ranks.get(&piece[parts[i].0..parts[i + 1].1])
                    && best.is_none_or(|(b, _)| r < b)
                {
                    best = Some((r, i));
                }
            }
            let Some((_, i)) = best else { break };
            parts[i].1 = parts[i + 1].1;
            parts.remove(i + 1);
        }
        for (a, b) in parts {
            match self.ranks.get(&piece[a..b]) {
                Some(&r) => out.push(r),
                None => out.extend(
                    piece[a..b]
                        .iter()
                        .filter_map(|byte| self.ranks.get(&[*byte][..]).copied()),
                ),
            }
        }
    }

    fn encode_ordinary(&self, text: &str, out: &mut Vec<u32>) -> Result<(), LlmError> {
        for m in self.pattern.find_iter(text) {
            let m = m.map_err(|e| tokenizer_error("tiktoken", format!("pattern: {e}")))?;
            self.encode_piece(m.as_str().as_bytes(), out);
        }
        Ok(())
    }
}

impl Tokenizer for TiktokenTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let next = self
                .specials
                .iter()
                .filter_map(|(s, id)| rest.find(s.as_str()).map(|at| (at, s.len(), *id)))
                .min_by_key(|&(at, len, _)| (at, usize::MAX - len));
            match next {
                Some((at, len, id)) => {
                    self.encode_ordinary(&rest[..at], &mut out)?;
                    out.push(id);
                    rest = &rest[at + len..];
                }
                None => {
                    self.encode_ordinary(rest, &mut out)?;
                    break;
                }
            }
        }
        Ok(out)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, LlmError> {
        let mut bytes = Vec::new();
        for &id in ids {
            match self.tokens.get(id as usize) {
                Some(t) => bytes.extend_from_slice(t),
                None if (id as usize) < self.vocab_size() => {}
                None => {
                    return Err(LlmError::TokenOutOfRange {
                        id: id as u64,
                        vocab: self.vocab_size(),
                    });
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        self.specials
            .iter()
            .find(|(s, _)| s == token)
            .map(|(_, id)| *id)
            .or_else(|| self.ranks.get(token.as_bytes()).copied())
    }

    fn vocab_size(&self) -> usize {
        self.tokens.len() + self.specials.len()
    }

    fn bos_id(&self) -> Option<u32> {
        self.token_id("<|begin_of_text|>")
    }

    fn eos_ids(&self) -> Vec<u32> {
        ["<|end_of_text|>", "<|eot_id|>"]
            .iter()
            .filter_map(|t| self.token_id(t))
            .collect()
    }

    fn kind(&self) -> &'static str {
        "tiktoken"
    }

    fn token_bytes(&self) -> Result<TokenBytes, LlmError> {
        // Ranked tokens are raw bytes; the special tokens after them have no text.
        let mut table = TokenBytes::with_capacity(self.vocab_size());
        for token in &self.tokens {
            table.push(token);
        }
        for _ in &self.specials {
            table.push(&[]);
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Vec<u8> {
        let mut lines = Vec::new();
        let mut rank = 0;
        for b in 0..=255u8 {
            lines.push(format!(
                "{} {rank}",
                base64::engine::general_purpose::STANDARD.encode([b])
            ));
            rank += 1;
        }
        for t in ["he", "ll", "hell", "hello", " w", "or", " wor", " world"] {
            lines.push(format!(
                "{} {rank}",
                base64::engine::general_purpose::STANDARD.encode(t)
            ));
            rank += 1;
        }
        lines.join("\n").into_bytes()
    }

    #[test]
    fn merges_and_specials() {
        let bytes = tiny();
        assert!(TiktokenTokenizer::looks_like(&bytes));
        let t = TiktokenTokenizer::from_bytes(&bytes, "tiny").unwrap();
        let ids = t.encode("<|begin_of_text|>hello world!").unwrap();
        let bos = t.bos_id().unwrap();
        assert_eq!(ids[0], bos);
        assert_eq!(ids[1], t.token_id("hello").unwrap());
        assert_eq!(ids[2], t.token_id(" world").unwrap());
        assert_eq!(ids[3], b'!' as u32);
        assert_eq!(t.decode(&ids[1..]).unwrap(), "hello world!");
        assert!(t.decode(&[u32::MAX]).is_err());
        let table = t.token_bytes().unwrap();
        assert_eq!(
            table.get(t.token_id(" world").unwrap()),
            Some(&b" world"[..])
        );
        assert_eq!(table.get(bos), Some(&[][..]));
        assert_eq!(table.len(), t.vocab_size());
    }

    #[test]
    fn rejects_bad_lines() {
        assert!(TiktokenTokenizer::from_bytes(b"!!! 1", "bad").is_err());
        assert!(TiktokenTokenizer::from_bytes(b"aGk= x", "bad").is_err());
        assert!(TiktokenTokenizer::from_bytes(b"", "bad").is_err());
    }
}
