//! Options shared by the LLM commands (`generate`, `chat`): the model files and how to
//! load them, and sampling.

use std::path::PathBuf;

use anyhow::bail;
use etch_llm::{ChatTemplate, Runner, RunnerOptions, SamplingConfig};

/// The model, its tokenizer, and how to load them.
#[derive(clap::Args)]
pub struct ModelArgs {
    /// The exported LLM (.pte with a KV cache, as ExecuTorch's export_llama writes it).
    #[arg(long, value_name = "FILE.pte")]
    pub model: PathBuf,
    /// tokenizer.json (Hugging Face), a tiktoken file, or a llama2.c tokenizer.bin.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: PathBuf,
    /// Kernel threads (0: one per available core). A pool with one per core pins each to
    /// its core; the environment variable ETCH_PIN_THREADS=0 (never) or 1 (always)
    /// overrides that.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub threads: usize,
    /// How to bring the .pte into memory (huge-pages: decode streams every weight per
    /// token, and 2 MiB pages spare the TLB).
    #[arg(long, value_enum, default_value_t = crate::load::LoadArg::Auto, value_name = "MODE")]
    pub load: crate::load::LoadArg,
    /// Cache budget of the caching temp allocator, in MiB.
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    pub temp_cache_mib: usize,
    /// The most memory the model may hold (default: what the system has available).
    #[arg(long, value_name = "BYTES", value_parser = crate::load::parse_max_memory,
          long_help = crate::load::MAX_MEMORY_HELP)]
    pub max_memory: Option<u64>,
    /// Run the instructions as they are, without folding constant work at load.
    #[arg(long, long_help = crate::load::NO_FOLD_HELP)]
    pub no_fold: bool,
}

impl ModelArgs {
    /// Loads the runner, every failure naming the file at fault.
    pub fn load(&self) -> anyhow::Result<Runner> {
        if !self.model.exists() {
            bail!("model file {} does not exist", self.model.display());
        }
        if !self.tokenizer.exists() {
            bail!("tokenizer file {} does not exist", self.tokenizer.display());
        }
        let options = RunnerOptions {
            threads: self.threads,
            temp_cache_bytes: self.temp_cache_mib.saturating_mul(1024 * 1024),
            load_mode: self.load.into(),
            max_memory: self.max_memory,
            fold_constants: !self.no_fold,
            ..Default::default()
        };
        let runner = crate::progress::while_loading(&self.model, || {
            Runner::load(&self.model, &self.tokenizer, &options).map_err(anyhow::Error::from)
        });
        crate::load::naming_file(runner, &self.model, &[&self.tokenizer])
    }
}

/// How the next token is chosen.
#[derive(clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, value_name = "T")]
    pub temperature: f32,
    /// Sample only among the K most likely tokens (0: off).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Sample only among the most likely tokens whose probabilities sum to P (1: off).
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    pub top_p: f32,
    /// Penalise tokens already in the context (1: off).
    #[arg(long, default_value_t = 1.0, value_name = "R")]
    pub repetition_penalty: f32,
    /// Seed for sampling (same seed, same text).
    #[arg(long, default_value_t = 42, value_name = "S")]
    pub seed: u64,
}

impl SamplingArgs {
    /// The runner's sampling settings.
    pub fn config(&self) -> SamplingConfig {
        SamplingConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
        }
    }
}

/// The chat template called `name`, or the one the tokenizer's special tokens show.
pub fn chat_template(runner: &Runner, name: Option<&str>) -> anyhow::Result<ChatTemplate> {
    use anyhow::Context;
    match name {
        Some(name) => ChatTemplate::from_name(name)
            .with_context(|| format!("unknown chat template {name:?} (use chatml or llama3)")),
        None => ChatTemplate::detect(runner.tokenizer()).context(
            "the tokenizer has neither ChatML nor Llama 3 special tokens; pass --chat-template",
        ),
    }
}
