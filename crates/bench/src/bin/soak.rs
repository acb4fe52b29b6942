//! Soak test: loads an LLM once and decodes a large number of tokens across context
//! resets and chat turns, printing one JSON line of memory figures every `--every`
//! tokens, so a long run shows whether resident memory and the temp cache stay flat.
//!
//! ```text
//! cargo run --release -p etch-bench --bin soak -- --model model.pte \
//!     --tokenizer tokenizer.json [--tokens 20000] [--every 500] [--threads 0] \
//!     [--temp-cache-bytes 16777216] [--load huge-pages|read|mmap]
//! ```
//!
//! The run alternates two phases until `--tokens` tokens are decoded:
//!
//! * **chat**: a new [`Conversation`] (the KV cache is reset) and eight user turns,
//!   sampled at temperature 0.8 with a new seed each turn, replies of at most 200 tokens,
//!   old turns dropped when the context is full ([`OnFull::DropOldest`]);
//! * **generate**: the cache is reset, stop tokens are ignored, and a plain prompt is
//!   continued in calls of at most 256 tokens until the context is full.
//!
//! Each line: `tokens` decoded so far, `phase`, `context_resets`, `chat_turns`,
//! `rss_bytes` (`VmRSS`) and `peak_rss_bytes` (`VmHWM`) from `/proc/self/status`,
//! the temp allocator's `temp_cached_bytes` (free blocks it keeps, bounded by
//! `temp_cache_budget_bytes`), `temp_live_peak_bytes` (most scratch live at once) and
//! `temp_hits`/`temp_misses`, `tok_per_s` over the interval (wall clock, prefill
//! included) and `decode_tok_per_s` (decode steps only, over the whole run).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use etch_llm::{
    ChatTemplate, Conversation, DEFAULT_TEMP_CACHE_BYTES, Generation, JinjaChatTemplate, OnFull,
    Runner, RunnerOptions, SamplingConfig, StopReason,
};
use etch_runtime::LoadMode;

/// User messages of the chat phase, in turn.
const USER_TURNS: [&str; 8] = [
    "Tell me a short story about a lighthouse keeper.",
    "What happens next in the story?",
    "Explain how a lighthouse lens works.",
    "Write a poem about the sea at night.",
    "List ten things to pack for a sailing trip, with a reason for each.",
    "Summarise our conversation so far.",
    "What is the difference between a brig and a schooner?",
    "Give me a recipe for fish soup.",
];

/// The prompt the generate phase continues until the context is full.
const GENERATE_PROMPT: &str = "The history of navigation at sea begins with";

/// Tokens per `generate` call of the generate phase.
const GENERATE_CHUNK: usize = 256;

/// Longest reply of a chat turn.
const REPLY_TOKENS: usize = 200;

struct Args {
    model: PathBuf,
    tokenizer: PathBuf,
    tokens: usize,
    every: usize,
    threads: usize,
    temp_cache_bytes: usize,
    load_mode: LoadMode,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        model: PathBuf::new(),
        tokenizer: PathBuf::new(),
        tokens: 20_000,
        every: 500,
        threads: 0,
        temp_cache_bytes: DEFAULT_TEMP_CACHE_BYTES,
        load_mode: LoadMode::HugePages,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = value()?.into(),
            "--tokenizer" => args.tokenizer = value()?.into(),
            "--tokens" => args.tokens = value()?.parse().context("--tokens")?,
            "--every" => args.every = value()?.parse().context("--every")?,
            "--threads" => args.threads = value()?.parse().context("--threads")?,
            "--temp-cache-bytes" => {
                args.temp_cache_bytes = value()?.parse().context("--temp-cache-bytes")?
            }
            "--load" => {
                args.load_mode = match value()?.as_str() {
                    "read" => LoadMode::Read,
                    "mmap" => LoadMode::Mmap,
                    "huge-pages" => LoadMode::HugePages,
                    other => bail!("--load {other}: use read, mmap or huge-pages"),
                }
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if args.model.as_os_str().is_empty() || args.tokenizer.as_os_str().is_empty() {
        bail!("usage: soak --model FILE.pte --tokenizer FILE [--tokens N] [--every N] ...");
    }
    args.every = args.every.max(1);
    Ok(args)
}

/// `VmRSS` and `VmHWM` of this process, in bytes.
fn rss() -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").context("/proc/self/status")?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/self/status"))?;
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .with_context(|| format!("{name}: no value"))?
            .parse()
            .with_context(|| format!("{name}: not a number"))?;
        Ok(kb * 1024)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Counters of the run so far.
struct Progress {
    start: Instant,
    tokens: usize,
    decode_steps: usize,
    decode_ms: f64,
    context_resets: usize,
    chat_turns: usize,
    every: usize,
    next_report: usize,
    last_report: (Instant, usize),
}

impl Progress {
    fn add(&mut self, generation_tokens: usize, decode_ms: f64) {
        self.tokens += generation_tokens;
        self.decode_steps += generation_tokens.saturating_sub(1);
        self.decode_ms += decode_ms;
    }

    /// Prints a line if `--every` more tokens were decoded since the last one (or
    /// `force`).
    fn report(
        &mut self,
        runner: &mut Runner,
        phase: &str,
        budget: usize,
        force: bool,
    ) -> anyhow::Result<()> {
        if !force && self.tokens < self.next_report {
            return Ok(());
        }
        while self.next_report <= self.tokens {
            self.next_report += self.every;
        }
        let (rss, peak) = rss()?;
        let temp = runner.session_mut().temp_allocator_stats();
        let now = Instant::now();
        let (then, then_tokens) = self.last_report;
        let interval = now.duration_since(then).as_secs_f64();
        self.last_report = (now, self.tokens);
        println!(
            "{}",
            serde_json::json!({
                "tokens": self.tokens,
                "elapsed_s": self.start.elapsed().as_secs_f64(),
                "phase": phase,
                "context_resets": self.context_resets,
                "chat_turns": self.chat_turns,
                "rss_bytes": rss,
                "peak_rss_bytes": peak,
                "temp_cached_bytes": temp.bytes_cached,
                "temp_live_peak_bytes": temp.peak_bytes_live,
                "temp_cache_budget_bytes": budget,
                "temp_hits": temp.hits,
                "temp_misses": temp.misses,
                "tok_per_s": (self.tokens - then_tokens) as f64 / interval.max(1e-9),
                "decode_tok_per_s": self.decode_steps as f64 / (self.decode_ms / 1e3).max(1e-9),
            })
        );
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let options = RunnerOptions {
        threads: args.threads,
        temp_cache_bytes: args.temp_cache_bytes,
        load_mode: args.load_mode,
        ..Default::default()
    };
    let mut runner = Runner::load(&args.model, &args.tokenizer, &options)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let template = ChatTemplate::detect(runner.tokenizer())
        .context("the tokenizer has neither ChatML nor Llama 3 special tokens")?;
    let model_eos = runner.eos_ids().to_vec();
    let context = runner.metadata().max_context_len;
    let (rss_loaded, _) = rss()?;
    eprintln!(
        "soak: {} loaded ({} MB resident), context {context}, {} threads, temp cache budget {} bytes",
        args.model.display(),
        rss_loaded >> 20,
        runner.module_mut().pool().threads(),
        args.temp_cache_bytes
    );
    let mut progress = Progress {
        start: Instant::now(),
        tokens: 0,
        decode_steps: 0,
        decode_ms: 0.0,
        context_resets: 0,
        chat_turns: 0,
        every: args.every,
        next_report: args.every,
        last_report: (Instant::now(), 0),
    };
    let mut seed = 0u64;
    let mut quiet = |_: &str| {};
    while progress.tokens < args.tokens {
        // Chat phase: a fresh conversation (cache reset), eight turns.
        runner.clear_eos_ids();
        for &id in &model_eos {
            runner.add_eos_id(id);
        }
        let mut chat = Conversation::new(&mut runner, JinjaChatTemplate::builtin(template), None)?;
        progress.context_resets += 1;
        for user in USER_TURNS {
            seed += 1;
            let sampling = soak_sampling(seed);
            let turn = chat.turn(
                &mut runner,
                user,
                REPLY_TOKENS,
                sampling,
                OnFull::DropOldest,
                &mut quiet,
            )?;
            progress.chat_turns += 1;
            if turn.dropped_turns > 0 {
                progress.context_resets += 1;
            }
            progress.add(turn.generated_token_ids.len(), turn.stats.decode_ms);
            progress.report(&mut runner, "chat", args.temp_cache_bytes, false)?;
            if progress.tokens >= args.tokens {
                break;
            }
        }
        if progress.tokens >= args.tokens {
            break;
        }
        // Generate phase: cache reset, no stop tokens, continue until the context is full.
        runner.reset()?;
        runner.clear_eos_ids();
        progress.context_resets += 1;
        let mut prompt = runner.encode(GENERATE_PROMPT)?;
        loop {
            seed += 1;
            let sampling = soak_sampling(seed);
            let Generation {
                generated_token_ids,
                stop_reason,
                stats,
                ..
            } = runner.generate(&prompt, GENERATE_CHUNK, sampling, &mut quiet)?;
            progress.add(generated_token_ids.len(), stats.decode_ms);
            progress.report(&mut runner, "generate", args.temp_cache_bytes, false)?;
            if progress.tokens >= args.tokens
                || stop_reason == StopReason::ContextFull
                || runner.position() + 1 >= context
            {
                break;
            }
            // The last token had no model step: the next call starts with it.
            prompt.clear();
            prompt.extend(generated_token_ids.last().copied());
            if prompt.is_empty() {
                break;
            }
        }
    }
    progress.report(&mut runner, "end", args.temp_cache_bytes, true)?;
    Ok(())
}

/// The soak's sampling: varied text (temperature 0.8, top-p 0.9), a new seed per call.
fn soak_sampling(seed: u64) -> SamplingConfig {
    SamplingConfig {
        temperature: 0.8,
        top_p: 0.9,
        seed,
        ..Default::default()
    }
}
