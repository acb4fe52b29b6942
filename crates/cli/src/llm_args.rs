//! Options shared by the LLM commands (`generate`, `chat`): the model files and how to
//! load them, and sampling.

use std::path::PathBuf;

use anyhow::bail;
use etch_llm::{JinjaChatTemplate, Runner, RunnerOptions, SamplingConfig, SamplingDefaults};

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

/// How the next token is chosen. Unset fields take the defaults of the mode: greedy for
/// plain text; for chat, the model's generation_config.json beside the tokenizer, else
/// llama.cpp's: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05.
#[derive(clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy (default: 0, or the chat default with --chat
    /// and in `etch chat`).
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    /// Sample only among the K most likely tokens (0: off).
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities sum to P (1: off).
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Penalise tokens already in the context (1: off).
    #[arg(long, value_name = "R")]
    pub repetition_penalty: Option<f32>,
    /// Sample only among tokens at least M times as likely as the most likely (0: off).
    #[arg(long, value_name = "M")]
    pub min_p: Option<f32>,
    /// Seed for sampling (same seed, same text on the same machine).
    #[arg(long, default_value_t = 42, value_name = "S")]
    pub seed: u64,
}

impl SamplingArgs {
    /// The sampling settings: what was given, else `defaults`.
    pub fn config_over(&self, defaults: SamplingDefaults) -> SamplingConfig {
        SamplingConfig {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            repetition_penalty: self
                .repetition_penalty
                .unwrap_or(defaults.repetition_penalty),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            seed: self.seed,
        }
    }

    /// Greedy unless told otherwise (plain text generation).
    pub fn config(&self) -> SamplingConfig {
        self.config_over(SamplingDefaults {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            min_p: 0.0,
        })
    }

    /// The chat defaults of the model beside `tokenizer`, under what was given.
    pub fn chat_config(&self, tokenizer: &std::path::Path) -> SamplingConfig {
        self.config_over(SamplingDefaults::beside(tokenizer))
    }
}

/// The chat template for `--chat-template` (chatml, llama3, or a template file), else the
/// model's own beside the tokenizer, else the built-in format the tokenizer shows.
pub fn jinja_template(
    runner: &Runner,
    name_or_file: Option<&str>,
    tokenizer: &std::path::Path,
) -> anyhow::Result<JinjaChatTemplate> {
    Ok(JinjaChatTemplate::select(
        name_or_file,
        tokenizer,
        runner.tokenizer(),
    )?)
}
