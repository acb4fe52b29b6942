//! Shared helpers of the tiny-llama runner tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use etch_llm::tokenizer::TokenBytes;
use etch_llm::{LlmError, Runner, Tokenizer};
use etch_runtime::{LoadMode, Module};

/// One id per byte: enough to drive a 256-token model.
pub struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, LlmError> {
        Ok(String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned())
    }
    fn token_id(&self, _: &str) -> Option<u32> {
        None
    }
    fn vocab_size(&self) -> usize {
        256
    }
    fn bos_id(&self) -> Option<u32> {
        None
    }
    fn eos_ids(&self) -> Vec<u32> {
        Vec::new()
    }
    fn kind(&self) -> &'static str {
        "bytes"
    }
    fn token_bytes(&self) -> Result<TokenBytes, LlmError> {
        let mut table = TokenBytes::with_capacity(256);
        for b in 0..=255u8 {
            table.push(&[b]);
        }
        Ok(table)
    }
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

pub fn tokens(file: &Path) -> Vec<u64> {
    let t = etch_runtime::npy::read_npy_file(file).expect("fixture npy");
    t.as_slice::<i64>()
        .expect("i64 tokens")
        .into_iter()
        .map(|v| v as u64)
        .collect()
}

pub fn runner(threads: usize) -> Runner {
    fixture_runner("tiny_llama_fp32", threads)
}

/// A runner on fixture `name` (`tests/fixtures/<name>.pte`) with the byte tokenizer.
pub fn fixture_runner(name: &str, threads: usize) -> Runner {
    let module = Module::from_path(fixtures().join(format!("{name}.pte")))
        .load_mode(LoadMode::Read)
        .threads(threads)
        .build()
        .expect("fixture loads");
    Runner::from_parts(module, Box::new(ByteTokenizer), "forward", Instant::now()).expect("runner")
}
