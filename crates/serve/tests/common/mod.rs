//! Shared helpers of the serving tests: the tiny llama fixture and a byte-level
//! tokenizer written to a temporary directory.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use etch_llm::{Engine, EngineOptions, Runner, RunnerOptions};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

pub fn tiny_llama() -> PathBuf {
    fixtures().join("tiny_llama_fp32.pte")
}

/// A directory holding `tokenizer.json` (one token per byte), removed when dropped.
pub struct TokenizerDir {
    pub dir: PathBuf,
}

impl TokenizerDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("etch-serve-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = etch_llm::tokenizer::byte_level_tokenizer_json(0);
        std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
        Self { dir }
    }

    pub fn tokenizer(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
}

impl Drop for TokenizerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The tiny llama with a context of 512 tokens (room for chat templates).
pub fn tiny_llama_chat() -> PathBuf {
    fixtures().join("tiny_llama_chat.pte")
}

pub fn engine(tokenizer: &Path, max_sessions: usize) -> Engine {
    engine_for(&tiny_llama(), tokenizer, max_sessions)
}

pub fn engine_for(model: &Path, tokenizer: &Path, max_sessions: usize) -> Engine {
    let options = RunnerOptions {
        threads: 1,
        ..Default::default()
    };
    let runner = Runner::load(model, tokenizer, &options).unwrap();
    Engine::new(runner, EngineOptions { max_sessions })
}
