//! `etch generate`: text generation with an exported LLM.

use std::io::{IsTerminal, Read, Write};

use anyhow::{Context, bail};

/// Arguments of `etch generate`.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    # chat-formatted prompt, greedy, streamed to stdout (SmolLM2 from tools/models/smollm2.sh)\n  \
    etch generate --model models/smollm2-135m-instruct/model.pte \\\n      \
    --tokenizer models/smollm2-135m-instruct/tokenizer.json \\\n      \
    --chat --prompt \"What is the capital of France?\" --max-new-tokens 64 --stats\n\n  \
    # sampled, with a system message\n  \
    etch generate --model model.pte --tokenizer tokenizer.json --chat --system \"Be brief.\" \\\n      \
    --prompt \"Write a haiku about Rust.\" --temperature 0.7 --top-p 0.9 --seed 1\n\n  \
    # raw prompt from stdin, one JSON object (ids, text, stats) out\n  \
    echo \"Once upon a time\" | etch generate --model model.pte --tokenizer tokenizer.json --json\n\n\
For a conversation over several turns see `etch chat`; for speed, `etch bench`.")]
pub struct GenerateArgs {
    #[command(flatten)]
    model: crate::llm_args::ModelArgs,
    /// The prompt (read from stdin when absent). Tokenised as given: no BOS is added.
    #[arg(long, short)]
    prompt: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128, value_name = "N")]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: crate::llm_args::SamplingArgs,
    /// Wrap the prompt in the model's chat template (chat_template.jinja or
    /// tokenizer_config.json beside the tokenizer, else the ChatML or Llama 3 format its
    /// tokens show) and sample with the model's chat defaults (generation_config.json,
    /// else temperature 0.8, top-p 0.95, top-k 40; --temperature 0 for greedy).
    #[arg(long)]
    chat: bool,
    /// Chat template for --chat: chatml, llama3, or a Jinja file (.jinja, or a
    /// tokenizer_config.json); default: the model's own.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// System message for --chat (default: the one the model's chat template adds).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
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
    /// After the text, figures on stderr: tokens, load time, time to first token,
    /// prefill and decode speed, memory, heap allocations per decoded token (--json
    /// always has them).
    #[arg(long)]
    stats: bool,
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
    let mut runner = args.model.load()?;
    let text = if args.chat {
        let template = crate::llm_args::jinja_template(
            &runner,
            args.chat_template.as_deref(),
            &args.model.tokenizer,
        )
        .context("--chat")?;
        runner.add_end_of_turn_tokens();
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(serde_json::json!({"role": "system", "content": system}));
        }
        messages.push(serde_json::json!({"role": "user", "content": prompt}));
        template.render(&serde_json::Value::Array(messages), None, true, None)?
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
    let sampling = if args.chat {
        args.sampling.chat_config(&args.model.tokenizer)
    } else {
        args.sampling.config()
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
    if generation.stop_reason == etch_llm::StopReason::ContextFull {
        eprintln!(
            "stopped: the model's context ({} tokens) is full",
            runner.metadata().max_context_len
        );
    }
    if !args.stats {
        return Ok(());
    }
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
    eprintln!(
        "memory: planned {} bytes, folded {} bytes, peak RSS {}, temp allocator {} hits / {} misses, heap allocations per decoded token: {}",
        s.planned_bytes,
        s.folded_bytes,
        s.peak_rss_bytes
            .map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
        s.temp_allocator_hits,
        s.temp_allocator_misses,
        s.heap_allocations_per_decoded_token
            .map_or("?".into(), |a| format!("{a:.2}"))
    );
    Ok(())
}
