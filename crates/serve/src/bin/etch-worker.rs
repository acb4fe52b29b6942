//! `etch-worker`: the model worker for ExecuTorch's own LLM server.
//!
//! ```sh
//! python -m executorch.examples.llm_server.python.server \
//!     --worker-bin "$(which etch-worker)" --model-path model.pte \
//!     --tokenizer-path tokenizer.json --hf-tokenizer path/to/hf/dir
//! ```

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use etch_llm::{Engine, EngineOptions, Runner, RunnerOptions};
use etch_serve::worker::{CancelBook, Worker, listen_for_cancels};

/// The model worker that ExecuTorch's LLM server (executorch.examples.llm_server) spawns
/// with --worker-bin: JSONL requests on stdin, protocol lines on stdout, logs on stderr.
#[derive(Parser)]
#[command(name = "etch-worker", version, about, long_about = None)]
struct Args {
    /// The exported LLM (.pte).
    #[arg(long = "model_path", alias = "model-path", value_name = "FILE.pte")]
    model_path: PathBuf,
    /// tokenizer.json (Hugging Face), a tiktoken file, or a llama2.c tokenizer.bin.
    #[arg(long = "tokenizer_path", alias = "tokenizer-path", value_name = "FILE")]
    tokenizer_path: PathBuf,
    /// Sessions in all, one of them the anonymous scratch session (named sessions get
    /// the rest). The official server passes no flag: set ETCH_WORKER_MAX_SESSIONS to
    /// change it there.
    #[arg(
        long = "max_sessions",
        alias = "max-sessions",
        env = "ETCH_WORKER_MAX_SESSIONS",
        default_value_t = 4,
        value_name = "N"
    )]
    max_sessions: usize,
    /// Kernel threads (0: one per available core); env ETCH_WORKER_THREADS.
    #[arg(
        long,
        env = "ETCH_WORKER_THREADS",
        default_value_t = 0,
        value_name = "N"
    )]
    threads: usize,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("etch-worker: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let options = RunnerOptions {
        threads: args.threads,
        ..Default::default()
    };
    eprintln!("etch-worker: loading {}", args.model_path.display());
    let runner = Runner::load(&args.model_path, &args.tokenizer_path, &options)
        .with_context(|| format!("loading {}", args.model_path.display()))?;
    let mut engine = Engine::new(
        runner,
        EngineOptions {
            max_sessions: args.max_sessions,
        },
    );
    let cancels = CancelBook::default();
    let supports_cancel = listen_for_cancels(&cancels);
    eprintln!(
        "etch-worker: ready ({} sessions, cancellation {})",
        engine.max_sessions(),
        if supports_cancel { "on" } else { "off" }
    );
    let stdin = std::io::stdin().lock();
    let stdout = std::io::stdout().lock();
    Worker::new(&mut engine, stdout, cancels, supports_cancel)
        .serve(stdin)
        .context("writing to stdout")?;
    Ok(())
}
