//! `etch bench`: prefill and decode speed of an exported LLM, in the manner of
//! `llama-bench` (pp = prompt processing, tg = text generation).

use std::path::PathBuf;

use anyhow::{Context, bail};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use etch_llm::{
    Engine, EngineOptions, GenerationStats, Runner, RunnerOptions, SamplingConfig, TurnRequest,
};

/// Arguments of `etch bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// The exported LLM (.pte with a KV cache; delegated or not).
    #[arg(long, value_name = "FILE.pte")]
    model: PathBuf,
    /// A tokenizer, only to check it matches the model (the benchmark feeds token ids).
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Prompt tokens prefilled per repetition.
    #[arg(
        short = 'p',
        long = "prompt-tokens",
        default_value_t = 128,
        value_name = "P"
    )]
    prompt_tokens: usize,
    /// Tokens decoded after the prompt per repetition (model steps; 0: prefill only).
    #[arg(
        short = 'n',
        long = "decode-tokens",
        default_value_t = 64,
        value_name = "N"
    )]
    decode_tokens: usize,
    /// Timed repetitions per thread count.
    #[arg(
        short = 'r',
        long = "repetitions",
        default_value_t = 5,
        value_name = "R"
    )]
    repetitions: usize,
    /// Untimed warm-up runs before the repetitions (0: the first repetition is cold,
    /// as in a single `etch generate`).
    #[arg(long, default_value_t = 1, value_name = "W")]
    warmup: usize,
    /// Thread counts to measure, comma-separated (default: one per available core).
    #[arg(
        short = 't',
        long = "threads",
        value_delimiter = ',',
        value_name = "T,..."
    )]
    threads: Vec<usize>,
    /// Concurrent sessions to measure, comma-separated (`1,2,4,8`): each prefills its
    /// own prompt, then all decode together, one batched step over the weights per
    /// token (as `etch serve` decodes its requests). Reports aggregate and per-session
    /// decode tokens/s per thread count and session count. Without it: one session
    /// through the text runner.
    #[arg(
        short = 's',
        long = "sessions",
        value_delimiter = ',',
        value_name = "N,..."
    )]
    sessions: Vec<usize>,
    /// How to bring the .pte into memory.
    #[arg(long, value_enum, default_value_t = crate::load::LoadArg::Auto, value_name = "MODE")]
    load: crate::load::LoadArg,
    /// Cache budget of the caching temp allocator, in MiB.
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    temp_cache_mib: usize,
    /// Run the instructions as they are, without folding constant work at load.
    #[arg(long, long_help = crate::load::NO_FOLD_HELP)]
    no_fold: bool,
    /// Print one JSON object instead of a markdown table.
    #[arg(long)]
    json: bool,
}

/// Mean and sample standard deviation (0 for one value).
fn mean_stddev(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// The CPU's model name (`/proc/cpuinfo`), or `unknown`.
fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            matches!(key.trim(), "model name" | "Model" | "Hardware").then(|| value.trim())
        })
        .filter(|v| !v.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

/// What the header says about the machine.
#[derive(serde::Serialize)]
struct Machine {
    cpu: String,
    logical_cores: usize,
    /// The best instruction set of this CPU.
    isa: &'static str,
    /// The instruction set each kernel family runs (`ETCH_ISA` caps them).
    dispatch: Dispatch,
}

#[derive(serde::Serialize)]
struct Dispatch {
    gemm: &'static str,
    gemv: &'static str,
    attention: &'static str,
    quant: &'static str,
}

impl Machine {
    fn detect() -> Self {
        let d = etch_linalg::dispatch();
        Self {
            cpu: cpu_model(),
            logical_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            isa: etch_linalg::Isa::best().name(),
            dispatch: Dispatch {
                gemm: d.gemm.name(),
                gemv: d.gemv.name(),
                attention: d.attention.name(),
                quant: d.quant.name(),
            },
        }
    }
}

#[derive(serde::Serialize)]
struct Model {
    path: String,
    bytes: u64,
    method: String,
    max_context_len: usize,
    vocab_size: usize,
}

/// The figures of one thread count.
#[derive(serde::Serialize)]
struct ThreadResult {
    threads: usize,
    load_ms: f64,
    /// Mean over the repetitions.
    prefill_tokens_per_second: f64,
    prefill_tokens_per_second_stddev: f64,
    prefill_runs: Vec<f64>,
    /// Mean over the repetitions (model steps after the prompt per second).
    decode_tokens_per_second: f64,
    decode_tokens_per_second_stddev: f64,
    decode_runs: Vec<f64>,
    /// Heap allocations per decoded token of the last repetition's token loop.
    heap_allocations_per_decoded_token: Option<f64>,
    /// The process's peak resident memory so far (it includes earlier thread counts).
    peak_rss_bytes: Option<u64>,
}

/// The figures of one thread count and session count (`--sessions`).
#[derive(serde::Serialize)]
struct SessionsResult {
    threads: usize,
    sessions: usize,
    /// Decode tokens of all sessions together per second (mean over the repetitions).
    aggregate_decode_tokens_per_second: f64,
    aggregate_decode_tokens_per_second_stddev: f64,
    /// Decode tokens per second each session sees (they step in lockstep).
    per_session_decode_tokens_per_second: f64,
    /// Mean time of one batched step (every session's token), milliseconds.
    step_ms: f64,
    aggregate_runs: Vec<f64>,
    peak_rss_bytes: Option<u64>,
}

#[derive(serde::Serialize)]
struct Report {
    etch_version: &'static str,
    machine: Machine,
    model: Model,
    prompt_tokens: usize,
    decode_tokens: usize,
    repetitions: usize,
    warmup: usize,
    results: Vec<ThreadResult>,
    /// With `--sessions`: one entry per thread count and session count.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    sessions_results: Vec<SessionsResult>,
}

/// Prompt ids that cover the vocabulary without favouring any id.
fn prompt_ids(len: usize, vocab: usize) -> Vec<u64> {
    let vocab = vocab.max(1) as u64;
    (0..len as u64).map(|i| (i * 7919 + 1) % vocab).collect()
}

fn load(args: &BenchArgs, threads: usize) -> anyhow::Result<Runner> {
    let options = RunnerOptions {
        threads,
        temp_cache_bytes: args.temp_cache_mib.saturating_mul(1024 * 1024),
        load_mode: args.load.into(),
        fold_constants: !args.no_fold,
        ..Default::default()
    };
    let runner = crate::progress::while_loading(&args.model, || match &args.tokenizer {
        Some(tok) => Runner::load(&args.model, tok, &options).map_err(anyhow::Error::from),
        None => Runner::load_without_tokenizer(&args.model, &options).map_err(anyhow::Error::from),
    });
    let also: Vec<&std::path::Path> = args.tokenizer.iter().map(|p| p.as_path()).collect();
    crate::load::naming_file(runner, &args.model, &also)
}

/// One prefill of `prompt` and `decode` model steps after it, from position 0.
fn once(runner: &mut Runner, prompt: &[u64], decode: usize) -> anyhow::Result<GenerationStats> {
    runner.reset()?;
    let g = runner.generate(prompt, decode + 1, SamplingConfig::default(), &mut |_| {})?;
    if g.generated_token_ids.len() != decode + 1 {
        bail!(
            "generation stopped after {} tokens ({:?}), not {}",
            g.generated_token_ids.len(),
            g.stop_reason,
            decode + 1
        );
    }
    Ok(g.stats)
}

/// `sessions` named sessions each prefilling its own prompt (`prompt` rotated), then
/// decoding `decode` tokens together through [`Engine::step_batch`]; returns the
/// seconds of the decode.
fn sessions_once(
    engine: &mut Engine,
    prompt: &[u64],
    decode: usize,
    sessions: usize,
) -> anyhow::Result<f64> {
    let cancel = Arc::new(AtomicBool::new(false));
    let mut turns = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let mut ids = prompt.to_vec();
        let shift = i % ids.len().max(1);
        ids.rotate_left(shift);
        let request = TurnRequest {
            session: Some(format!("bench-{i}")),
            prompt: ids,
            max_new_tokens: Some(decode),
            sampling: SamplingConfig::default(),
            stop: Vec::new(),
            ignore_eos: true,
        };
        turns.push(engine.start(&request, Arc::clone(&cancel))?);
    }
    let started = Instant::now();
    let mut failure = None;
    // Reused: the timed loop allocates nothing of its own.
    let mut finished = Vec::with_capacity(sessions);
    while !turns.is_empty() {
        finished.clear();
        engine.step_batch(&mut turns, &mut |_, _| {}, &mut |i, result| {
            if let Err(e) = result {
                failure.get_or_insert(e);
            }
            finished.push(i);
        });
        if let Some(e) = failure.take() {
            bail!("a session's turn failed: {e}");
        }
        for &i in finished.iter().rev() {
            turns.remove(i);
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The `--sessions` measurements of one thread count.
fn measure_sessions(
    args: &BenchArgs,
    threads: usize,
    out: &mut Vec<SessionsResult>,
) -> anyhow::Result<()> {
    let most = args.sessions.iter().copied().max().unwrap_or(1);
    let mut runner = load(args, threads)?;
    runner.clear_eos_ids();
    let prompt = prompt_ids(args.prompt_tokens, runner.vocab_size());
    let mut engine = Engine::new(
        runner,
        EngineOptions {
            max_sessions: most + 1,
        },
    );
    for &n in &args.sessions {
        for w in 0..args.warmup {
            eprintln!(
                "[bench] {threads} thread(s), {n} session(s): warm-up {}/{}",
                w + 1,
                args.warmup
            );
            sessions_once(&mut engine, &prompt, args.decode_tokens, n)?;
        }
        let mut aggregate = Vec::with_capacity(args.repetitions);
        let mut seconds = Vec::with_capacity(args.repetitions);
        for r in 0..args.repetitions {
            eprintln!(
                "[bench] {threads} thread(s), {n} session(s): repetition {}/{}",
                r + 1,
                args.repetitions
            );
            let s = sessions_once(&mut engine, &prompt, args.decode_tokens, n)?;
            aggregate.push((n * args.decode_tokens) as f64 / s);
            seconds.push(s);
        }
        let (mean, stddev) = mean_stddev(&aggregate);
        let (step_s, _) = mean_stddev(&seconds);
        out.push(SessionsResult {
            threads,
            sessions: n,
            aggregate_decode_tokens_per_second: mean,
            aggregate_decode_tokens_per_second_stddev: stddev,
            per_session_decode_tokens_per_second: mean / n as f64,
            step_ms: step_s * 1e3 / args.decode_tokens as f64,
            aggregate_runs: aggregate,
            peak_rss_bytes: etch_llm::peak_rss_bytes(),
        });
    }
    Ok(())
}

pub fn main(args: BenchArgs) -> anyhow::Result<()> {
    if !args.model.exists() {
        bail!("model file {} does not exist", args.model.display());
    }
    if args.prompt_tokens == 0 {
        bail!("-p must be at least 1 (the prompt that is prefilled)");
    }
    if args.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    let machine = Machine::detect();
    let threads = if args.threads.is_empty() {
        vec![machine.logical_cores]
    } else {
        args.threads.clone()
    };
    if threads.contains(&0) {
        bail!("-t: a thread count must be at least 1");
    }
    if args.sessions.contains(&0) {
        bail!("--sessions: a session count must be at least 1");
    }
    if !args.sessions.is_empty() && args.decode_tokens == 0 {
        bail!("--sessions measures decoding: -n must be at least 1");
    }
    let bytes = std::fs::metadata(&args.model)
        .with_context(|| args.model.display().to_string())?
        .len();
    let mut model = None;
    let mut results = Vec::new();
    let mut sessions_results = Vec::new();
    for &t in &threads {
        eprintln!("[bench] {} thread(s): loading {}", t, args.model.display());
        let mut runner = load(&args, t)?;
        runner.clear_eos_ids();
        let context = runner.metadata().max_context_len;
        if args.prompt_tokens + args.decode_tokens >= context {
            bail!(
                "-p {} plus -n {} do not fit the model's context of {context} tokens (need p + n < {context})",
                args.prompt_tokens,
                args.decode_tokens
            );
        }
        let prompt = prompt_ids(args.prompt_tokens, runner.vocab_size());
        model.get_or_insert_with(|| Model {
            path: args.model.display().to_string(),
            bytes,
            method: runner.method_name().to_string(),
            max_context_len: context,
            vocab_size: runner.vocab_size(),
        });
        for w in 0..args.warmup {
            eprintln!("[bench] {t} thread(s): warm-up {}/{}", w + 1, args.warmup);
            once(&mut runner, &prompt, args.decode_tokens)?;
        }
        let mut prefill = Vec::with_capacity(args.repetitions);
        let mut decode = Vec::with_capacity(args.repetitions);
        let mut last = GenerationStats::default();
        for r in 0..args.repetitions {
            eprintln!(
                "[bench] {t} thread(s): repetition {}/{}",
                r + 1,
                args.repetitions
            );
            last = once(&mut runner, &prompt, args.decode_tokens)?;
            prefill.push(last.prefill_tokens_per_second);
            decode.push(last.decode_tokens_per_second);
        }
        let load_ms = last.load_ms;
        let (pm, ps) = mean_stddev(&prefill);
        let (dm, ds) = mean_stddev(&decode);
        results.push(ThreadResult {
            threads: t,
            load_ms,
            prefill_tokens_per_second: pm,
            prefill_tokens_per_second_stddev: ps,
            prefill_runs: prefill,
            decode_tokens_per_second: dm,
            decode_tokens_per_second_stddev: ds,
            decode_runs: decode,
            heap_allocations_per_decoded_token: last.heap_allocations_per_decoded_token,
            peak_rss_bytes: etch_llm::peak_rss_bytes(),
        });
        drop(runner);
        if !args.sessions.is_empty() {
            measure_sessions(&args, t, &mut sessions_results)?;
        }
    }
    let report = Report {
        etch_version: env!("CARGO_PKG_VERSION"),
        machine,
        model: model.context("no thread count to measure")?,
        prompt_tokens: args.prompt_tokens,
        decode_tokens: args.decode_tokens,
        repetitions: args.repetitions,
        warmup: args.warmup,
        results,
        sessions_results,
    };
    let text = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        markdown(&report)
    };
    use std::io::Write;
    let mut out = std::io::stdout();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // A reader that stopped early (`| head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write the report to stdout"),
    }
}

/// The report as a header and a markdown table, one row per thread count and test.
fn markdown(r: &Report) -> String {
    let m = &r.machine;
    let d = &m.dispatch;
    let name = std::path::Path::new(&r.model.path)
        .file_name()
        .map_or(r.model.path.clone(), |n| n.to_string_lossy().into_owned());
    let mib = r.model.bytes as f64 / 1048576.0;
    let mut s = format!(
        "etch {} | CPU: {} | {} logical cores | ISA: {} (gemm {}, gemv {}, attention {}, quant {})\n",
        r.etch_version, m.cpu, m.logical_cores, m.isa, d.gemm, d.gemv, d.attention, d.quant
    );
    s.push_str(&format!(
        "model: {} ({mib:.1} MiB, method {}, context {}, vocab {}); {} repetitions after {} warm-up run(s), mean ± sample standard deviation\n\n",
        r.model.path, r.model.method, r.model.max_context_len, r.model.vocab_size, r.repetitions, r.warmup
    ));
    s.push_str("| model | size | threads | test | t/s | load ms | heap allocs / token |\n");
    s.push_str("|---|---:|---:|---|---:|---:|---:|\n");
    for t in &r.results {
        let allocs = t
            .heap_allocations_per_decoded_token
            .map_or("n/a".to_string(), |a| format!("{a:.2}"));
        s.push_str(&format!(
            "| {name} | {mib:.1} MiB | {} | pp{} | {:.2} ± {:.2} | {:.0} | |\n",
            t.threads,
            r.prompt_tokens,
            t.prefill_tokens_per_second,
            t.prefill_tokens_per_second_stddev,
            t.load_ms
        ));
        if r.decode_tokens > 0 {
            s.push_str(&format!(
                "| {name} | {mib:.1} MiB | {} | tg{} | {:.2} ± {:.2} | {:.0} | {allocs} |\n",
                t.threads,
                r.decode_tokens,
                t.decode_tokens_per_second,
                t.decode_tokens_per_second_stddev,
                t.load_ms
            ));
        }
    }
    if !r.sessions_results.is_empty() {
        s.push_str(&format!(
            "\nconcurrent sessions, decode tg{} each, batched in one step per token:\n\n",
            r.decode_tokens
        ));
        s.push_str("| threads | sessions | aggregate t/s | per session t/s | step ms |\n");
        s.push_str("|---:|---:|---:|---:|---:|\n");
        for x in &r.sessions_results {
            s.push_str(&format!(
                "| {} | {} | {:.2} ± {:.2} | {:.2} | {:.2} |\n",
                x.threads,
                x.sessions,
                x.aggregate_decode_tokens_per_second,
                x.aggregate_decode_tokens_per_second_stddev,
                x.per_session_decode_tokens_per_second,
                x.step_ms
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_stddev() {
        assert_eq!(mean_stddev(&[]), (0.0, 0.0));
        assert_eq!(mean_stddev(&[3.0]), (3.0, 0.0));
        let (m, s) = mean_stddev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((s - 2.138089935).abs() < 1e-6);
    }

    #[test]
    fn prompt_ids_stay_in_the_vocabulary() {
        assert!(prompt_ids(500, 256).iter().all(|&i| i < 256));
        assert_eq!(prompt_ids(3, 1), vec![0, 0, 0]);
    }
}
