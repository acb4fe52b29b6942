//! `etch generate`: text generation with an exported LLM.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use etch_llm::{ChatTemplate, Runner, RunnerOptions, SamplingConfig};

/// Arguments of `etch generate`.
#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The exported LLM (.pte with a KV cache, as ExecuTorch's export_llama writes it).
    #[arg(long, value_name = "FILE.pte")]
    model: PathBuf,
    /// tokenizer.json (Hugging Face), a tiktoken file, or a llama2.c tokenizer.bin.
    #[arg(long, value_name = "FILE")]
    tokenizer: PathBuf,
    /// The prompt (read from stdin when absent). Tokenised as given: no BOS is added.
    #[arg(long, short)]
    prompt: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128, value_name = "N")]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, value_name = "T")]
    temperature: f32,
    /// Sample only among the K most likely tokens (0: off).
    #[arg(long, default_value_t = 0, value_name = "K")]
    top_k: usize,
    /// Sample only among the most likely tokens whose probabilities sum to P (1: off).
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    top_p: f32,
    /// Penalise tokens already in the context (1: off).
    #[arg(long, default_value_t = 1.0, value_name = "R")]
    repetition_penalty: f32,
    /// Seed for sampling (same seed, same text).
    #[arg(long, default_value_t = 42, value_name = "S")]
    seed: u64,
    /// Wrap the prompt in the model's chat template (detected from the tokenizer).
    #[arg(long)]
    chat: bool,
    /// Chat template to use with --chat: chatml or llama3 (default: detected).
    #[arg(long, value_name = "NAME")]
    chat_template: Option<String>,
    /// System message for --chat (default: the one the model's chat template adds, read
    /// from chat_template.jinja or tokenizer_config.json beside the tokenizer).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Kernel threads (0: one per available core).
    #[arg(long, default_value_t = 0, value_name = "N")]
    threads: usize,
    /// How to bring the .pte into memory (huge-pages: decode streams every weight per
    /// token, and 2 MiB pages spare the TLB).
    #[arg(long, value_enum, default_value_t = crate::load::LoadArg::HugePages, value_name = "MODE")]
    load: crate::load::LoadArg,
    /// Cache budget of the caching temp allocator, in MiB.
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    temp_cache_mib: usize,
    /// Print one JSON object (token ids, text, stats) instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Use these token ids as the prompt (comma-separated) instead of text; for
    /// benchmarks and exact comparisons.
    #[arg(long, value_name = "IDS", conflicts_with_all = ["prompt", "chat"])]
    prompt_token_ids: Option<String>,
    /// Keep generating past end-of-sequence tokens (fixed-length benchmarks).
    #[arg(long)]
    ignore_eos: bool,
}

/// The default system message of the chat template stored beside the tokenizer
/// (`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`), if any.
fn default_system(tokenizer: &std::path::Path) -> Option<String> {
    let dir = tokenizer.parent()?;
    let template = std::fs::read_to_string(dir.join("chat_template.jinja"))
        .ok()
        .or_else(|| {
            let config = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?;
            let v: serde_json::Value = serde_json::from_str(&config).ok()?;
            v.get("chat_template")?.as_str().map(str::to_string)
        })?;
    ChatTemplate::default_system_prompt(&template)
}

fn parse_ids(text: &str) -> anyhow::Result<Vec<u64>> {
    text.split(',')
        .map(|t| {
            t.trim()
                .parse::<u64>()
                .with_context(|| format!("--prompt-token-ids: {t:?} is not a token id"))
        })
        .collect()
}

pub fn main(args: GenerateArgs) -> anyhow::Result<()> {
    let prompt = match (&args.prompt, &args.prompt_token_ids) {
        (_, Some(_)) => String::from("(token ids)"),
        (Some(p), None) => p.clone(),
        (None, None) => {
            if std::io::stdin().is_terminal() {
                eprintln!("reading the prompt from stdin (end with Ctrl-D); or pass --prompt TEXT");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("cannot read the prompt from stdin")?;
            s
        }
    };
    if prompt.trim().is_empty() {
        bail!("the prompt is empty: pass --prompt TEXT or write it to stdin");
    }
    let options = RunnerOptions {
        threads: args.threads,
        temp_cache_bytes: args.temp_cache_mib.saturating_mul(1024 * 1024),
        load_mode: args.load.into(),
        ..Default::default()
    };
    if !args.model.exists() {
        bail!("model file {} does not exist", args.model.display());
    }
    if !args.tokenizer.exists() {
        bail!("tokenizer file {} does not exist", args.tokenizer.display());
    }
    let mut runner = crate::load::naming_file(
        Runner::load(&args.model, &args.tokenizer, &options),
        &args.model,
        &[&args.tokenizer],
    )?;
    let text = if args.chat {
        let template = match &args.chat_template {
            Some(name) => ChatTemplate::from_name(name)
                .with_context(|| format!("unknown chat template {name:?} (use chatml or llama3)"))?,
            None => ChatTemplate::detect(runner.tokenizer()).context(
                "--chat: the tokenizer has neither ChatML nor Llama 3 special tokens; pass --chat-template",
            )?,
        };
        for stop in template.stop_tokens() {
            if let Some(id) = runner.tokenizer().token_id(stop) {
                runner.add_eos_id(id as u64);
            }
        }
        let system = args
            .system
            .clone()
            .or_else(|| default_system(&args.tokenizer));
        template.render(system.as_deref(), &prompt)
    } else {
        prompt
    };
    let ids = match &args.prompt_token_ids {
        Some(list) => parse_ids(list)?,
        None => runner.encode(&text)?,
    };
    if args.ignore_eos {
        runner.clear_eos_ids();
    }
    let sampling = SamplingConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
    };
    let stream = !args.json;
    let mut out = std::io::stdout();
    let mut on_text = |piece: &str| {
        if stream {
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    };
    let generation = runner.generate(&ids, args.max_new_tokens, sampling, &mut on_text)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&generation)?);
        return Ok(());
    }
    println!();
    let s = &generation.stats;
    eprintln!(
        "[{} prompt tokens, {} generated, stop: {:?}] load {:.0} ms, first token {:.0} ms, prefill {:.1} tok/s, decode {:.1} tok/s, {} threads",
        s.prompt_tokens,
        s.generated_tokens,
        generation.stop_reason,
        s.load_ms,
        s.time_to_first_token_ms,
        s.prefill_tokens_per_second,
        s.decode_tokens_per_second,
        s.threads
    );
    if generation.stop_reason == etch_llm::StopReason::ContextFull {
        eprintln!(
            "stopped: the model's context ({} tokens) is full",
            runner.metadata().max_context_len
        );
    }
    eprintln!(
        "memory: planned {} bytes, peak RSS {}, temp allocator {} hits / {} misses, heap allocations per decoded token: {}",
        s.planned_bytes,
        s.peak_rss_bytes
            .map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
        s.temp_allocator_hits,
        s.temp_allocator_misses,
        s.heap_allocations_per_decoded_token
            .map_or("?".into(), |a| format!("{a:.2}"))
    );
    Ok(())
}
