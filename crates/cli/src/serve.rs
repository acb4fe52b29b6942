//! `etch serve`: an OpenAI-compatible HTTP server for an exported LLM.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;
use etch_llm::{Engine, EngineOptions};
use etch_serve::http::{ServeOptions, serve};

/// Arguments of `etch serve`.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    etch serve --model models/smollm2-135m-instruct/model_8da4w.pte \\\n      \
    --tokenizer models/smollm2-135m-instruct/tokenizer.json\n\n  \
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n      \
    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"stream\": true}'\n\n\
Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions,\n\
DELETE /v1/sessions/ID, POST /v1/sessions/ID/reset, GET /metrics (Prometheus).\n\
A conversation keeps its KV cache when its requests name a session: the body's\n\
\"session_id\", or the X-ExecuTorch-Session-ID (or x-session-affinity) header; each turn\n\
then prefills only what is new (usage.prompt_tokens_details.cached_tokens says how much\n\
was reused). Sampling defaults come from generation_config.json beside the tokenizer,\n\
else temperature 0.8, top-p 0.95, top-k 40; send \"temperature\": 0 for greedy.")]
pub struct ServeArgs {
    #[command(flatten)]
    model: crate::llm_args::ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDR")]
    host: IpAddr,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000, value_name = "PORT")]
    port: u16,
    /// Sessions in all, one of them the anonymous scratch session: named sessions get
    /// the rest (each holds its own KV cache; the memory budget may allow fewer).
    #[arg(long, default_value_t = 4, value_name = "N")]
    max_sessions: usize,
    /// Require "Authorization: Bearer KEY" on every route but /health (env ETCH_API_KEY).
    #[arg(long, env = "ETCH_API_KEY", value_name = "KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name /v1/models reports (default: the .pte file's name).
    #[arg(long, value_name = "NAME")]
    model_id: Option<String>,
    /// A Jinja chat template (.jinja, or a tokenizer_config.json) instead of the one
    /// beside the tokenizer (chat_template.jinja or tokenizer_config.json); without
    /// either, the built-in ChatML or Llama 3 format the tokenizer's tokens show.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Log each request's messages on stderr (off by default: logs hold no prompts).
    #[arg(long)]
    log_prompts: bool,
}

pub fn main(args: ServeArgs) -> anyhow::Result<()> {
    let runner = args.model.load()?;
    let engine = Engine::new(
        runner,
        EngineOptions {
            max_sessions: args.max_sessions.max(1),
        },
    );
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        args.model
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "etch".into())
    });
    let options = ServeOptions {
        addr: SocketAddr::new(args.host, args.port),
        model_id,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        chat_template: args.chat_template,
        tokenizer: args.model.tokenizer.clone(),
        log_prompts: args.log_prompts,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(engine, options))
}
