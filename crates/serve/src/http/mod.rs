//! `etch serve`: an OpenAI-compatible HTTP server (axum on tokio) over the session
//! engine. Routes: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions`,
//! `POST /v1/completions`, `DELETE /v1/sessions/{id}`, `POST /v1/sessions/{id}/reset`,
//! `GET /metrics`. Conventions are the official ExecuTorch LLM server's (session ids,
//! error codes) and OpenAI's (bodies, SSE chunks, error envelope).

mod engine_thread;
mod error;
mod metrics;
mod prompt;
mod request;
mod tools;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use etch_llm::{
    ChatTemplate, Completion, Engine, FinishReason, JinjaChatTemplate, SamplingDefaults,
    SessionError, Tokenizer, TurnError, TurnRequest,
};
use futures_util::stream::{self, Stream};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

pub use engine_thread::{EngineGone, EngineHandle, SessionOp, TurnEvent};
pub use error::ApiError;
pub use metrics::Metrics;
pub use prompt::Transcripts;
pub use request::{
    MAX_BODY_BYTES, MAX_MESSAGES, MAX_SESSION_ID_BYTES, MAX_STOP_BYTES, MAX_STOP_STRINGS,
};
pub use tools::{ParsedReply, parse_tool_calls};

/// How long answers in flight may take to finish after SIGINT or SIGTERM.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The name `/v1/models` reports.
    pub model_id: String,
    /// Clients must send `Authorization: Bearer KEY` (all routes but `/health`).
    pub api_key: Option<String>,
    /// A chat template file (`.jinja` or `tokenizer_config.json`) instead of the one
    /// beside the tokenizer.
    pub chat_template: Option<PathBuf>,
    /// The tokenizer file (its directory holds `tokenizer_config.json` and
    /// `generation_config.json`).
    pub tokenizer: PathBuf,
    /// Log each request's prompt text (off: logs never hold prompts).
    pub log_prompts: bool,
}

/// What every handler shares.
pub struct AppState {
    engine: EngineHandle,
    tokenizer: Arc<dyn Tokenizer>,
    template: JinjaChatTemplate,
    defaults: SamplingDefaults,
    context: usize,
    vocab: usize,
    max_sessions: usize,
    model_id: String,
    api_key: Option<String>,
    transcripts: Transcripts,
    metrics: Arc<Metrics>,
    created: u64,
    next_id: AtomicU64,
    log_prompts: bool,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl AppState {
    /// Builds the state over an engine (starting its thread).
    pub fn new(engine: Engine, options: &ServeOptions) -> anyhow::Result<Arc<Self>> {
        let template = match &options.chat_template {
            Some(path) => JinjaChatTemplate::from_file(path)?,
            None => match JinjaChatTemplate::beside_tokenizer(&options.tokenizer)? {
                Some(t) => t,
                None => {
                    let format =
                        ChatTemplate::detect(engine.tokenizer()).unwrap_or(ChatTemplate::ChatMl);
                    JinjaChatTemplate::builtin(format)
                }
            },
        };
        eprintln!("etch serve: chat template: {}", template.origin());
        let metrics = Arc::new(Metrics::default());
        let tokenizer = engine.shared_tokenizer();
        let context = engine.metadata().max_context_len;
        let vocab = engine.vocab_size();
        let max_sessions = engine.max_sessions();
        let handle = EngineHandle::spawn(engine, Arc::clone(&metrics))?;
        Ok(Arc::new(Self {
            engine: handle,
            tokenizer,
            template,
            defaults: SamplingDefaults::beside(&options.tokenizer),
            context,
            vocab,
            max_sessions,
            model_id: options.model_id.clone(),
            api_key: options.api_key.clone(),
            transcripts: Transcripts::default(),
            metrics,
            created: unix_now(),
            next_id: AtomicU64::new(1),
            log_prompts: options.log_prompts,
        }))
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:016x}{n:016x}", self.created)
    }
}

/// The router over a state.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/sessions/{id}", delete(close_session))
        .route("/v1/sessions/{id}/reset", post(reset_session))
        .route("/metrics", get(metrics_text))
        .fallback(|| async { ApiError::not_found("No such route.") })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            authorize,
        ))
        .with_state(state)
}

/// Serves until SIGINT or SIGTERM; prints the address it listens on.
pub async fn serve(engine: Engine, options: ServeOptions) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", options.addr))?;
    serve_on(listener, engine, options).await
}

/// Serves on a bound listener until SIGINT or SIGTERM.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    engine: Engine,
    options: ServeOptions,
) -> anyhow::Result<()> {
    let state = AppState::new(engine, &options)?;
    eprintln!(
        "etch serve: listening on http://{} (model {:?}; Ctrl-C stops)",
        listener.local_addr()?,
        options.model_id
    );
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
        shutdown_signal().await;
        let _ = stopping.send(());
    });
    // After a signal, answers in flight get SHUTDOWN_GRACE to finish; then the server
    // stops without them (a long generation must not hold a shutdown).
    let grace = async move {
        if stopped.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        served = server => served?,
        () = grace => eprintln!(
            "etch serve: answers still in flight after {} s; stopping without them",
            SHUTDOWN_GRACE.as_secs()
        ),
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    eprintln!("etch serve: shutting down");
}

/// Compares in time independent of where the strings differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key
        && request.uri().path() != "/health"
    {
        let sent = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(sent.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.engine.named_sessions().await {
        Ok(_) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "unavailable"})),
        )
            .into_response(),
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "etch",
            "meta": {"context_length": state.context, "max_sessions": state.max_sessions},
        }],
    }))
    .into_response()
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(state.max_sessions),
    )
        .into_response()
}

async fn session_op(state: &AppState, op: SessionOp, id: &str) -> Result<(), ApiError> {
    request::check_session_id(id)?;
    match state.engine.session(op, id).await {
        Err(EngineGone) => Err(ApiError::unavailable()),
        Ok(Err(SessionError::Unsupported)) => Err(ApiError::unsupported_session()),
        Ok(Err(_)) => Err(ApiError::capacity_exhausted()),
        Ok(Ok(_)) => Ok(()),
    }
}

async fn close_session(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match session_op(&state, SessionOp::Close, &id).await {
        Ok(()) => {
            state.transcripts.forget(&id);
            axum::Json(json!({"closed": true, "session_id": id})).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn reset_session(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match session_op(&state, SessionOp::Reset, &id).await {
        Ok(()) => {
            state.transcripts.forget(&id);
            axum::Json(json!({"reset": true, "session_id": id})).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// The session id: the body's `session_id` if given, else the first non-empty header of
/// `X-ExecuTorch-Session-ID`, `session_id`, `x-session-affinity` (the official server's
/// precedence).
fn session_id(body: &Map<String, Value>, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let id = match body.get("session_id") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Null) | None => [
            "x-executorch-session-id",
            "session_id",
            "x-session-affinity",
        ]
        .iter()
        .find_map(|h| {
            headers
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        }),
        Some(_) => {
            return Err(ApiError::invalid_session_id(
                "Invalid session_id: must be a string",
            ));
        }
    };
    if let Some(id) = &id {
        request::check_session_id(id)?;
    }
    Ok(id)
}

async fn read_body(body: Body) -> Result<Map<String, Value>, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::too_large(MAX_BODY_BYTES))?;
    parse_body(&bytes)
}

fn parse_body(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if bytes.len() > MAX_BODY_BYTES {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid_request("The body must be a JSON object.")),
        Err(e) => Err(ApiError::invalid_request(format!(
            "The body is not valid JSON: {e}"
        ))),
    }
}

/// Runs every check of a chat request body that needs no model -- parameters, sampling
/// fields, messages, session id -- then renders the messages with `template` and parses
/// tool calls out of their text, as a request would; for fuzzing and tests.
pub fn check_chat_body(bytes: &[u8], template: &JinjaChatTemplate) -> Result<String, ApiError> {
    let body = parse_body(bytes)?;
    request::refuse_unsupported(&body)?;
    request::generation(&body, SamplingDefaults::default(), || 1)?;
    let messages = request::messages(&body)?;
    session_id(&body, &HeaderMap::new())?;
    let tools = body.get("tools").cloned().unwrap_or(Value::Null);
    for m in &messages {
        if let Some(text) = m.get("content").and_then(Value::as_str) {
            let _ = parse_tool_calls(text, &tools, &mut || "call".into());
        }
    }
    template
        .render(&Value::Array(messages), body.get("tools"), true, None)
        .map_err(|e| ApiError::invalid_request(e.to_string()))
}

/// Which endpoint a request came in by: it decides the response's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

/// A request ready for the engine.
struct Prepared {
    endpoint: Endpoint,
    turn: TurnRequest,
    generation: request::Generation,
    tools: Option<Value>,
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(&state, &headers, body, Endpoint::Chat).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(&state, &headers, body, Endpoint::Completion).await
}

/// Checks a request, runs it, and answers (an error in OpenAI's envelope if it fails).
async fn answer(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
    endpoint: Endpoint,
) -> Response {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let response = match prepare(state, headers, body, endpoint).await {
        Ok(p) => run(state, p).await,
        Err(e) => Err(e),
    };
    respond(state, response)
}

fn respond(state: &AppState, response: Result<Response, ApiError>) -> Response {
    match response {
        Ok(r) => r,
        Err(e) => {
            state
                .metrics
                .requests_failed
                .fetch_add(1, Ordering::Relaxed);
            eprintln!("etch serve: {} {}", e.status.as_u16(), e.message);
            e.into_response()
        }
    }
}

async fn prepare(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    endpoint: Endpoint,
) -> Result<Prepared, ApiError> {
    let body = read_body(body).await?;
    request::refuse_unsupported(&body)?;
    let generation = request::generation(&body, state.defaults, crate::worker::random_seed)?;
    let session = session_id(&body, headers)?;
    let (prompt, tools) = match endpoint {
        Endpoint::Chat => {
            let messages = request::messages(&body)?;
            let tools = body
                .get("tools")
                .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
                .cloned();
            let hide_tools = body.get("tool_choice").and_then(Value::as_str) == Some("none");
            let tools = tools.filter(|_| !hide_tools);
            let extra = body.get("chat_template_kwargs").and_then(Value::as_object);
            let ids = prompt::prompt_ids(
                &state.template,
                &*state.tokenizer,
                &state.transcripts,
                session.as_deref(),
                &messages,
                tools.as_ref(),
                extra,
            )
            .map_err(|e| ApiError::invalid_request(e.to_string()))?;
            if state.log_prompts {
                eprintln!("etch serve: chat prompt: {messages:?}");
            }
            (ids, tools)
        }
        Endpoint::Completion => {
            let ids = match body.get("prompt") {
                Some(Value::String(text)) => state
                    .tokenizer
                    .encode(text)
                    .map_err(|e| ApiError::invalid_request(e.to_string()))?
                    .into_iter()
                    .map(u64::from)
                    .collect(),
                Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
                    items.iter().filter_map(Value::as_u64).collect()
                }
                Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => state
                    .tokenizer
                    .encode(items[0].as_str().unwrap_or_default())
                    .map_err(|e| ApiError::invalid_request(e.to_string()))?
                    .into_iter()
                    .map(u64::from)
                    .collect(),
                _ => {
                    return Err(ApiError::invalid_request(
                        "prompt must be a string or a list of token ids (one prompt per request).",
                    ));
                }
            };
            (ids, None)
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid_request("The prompt is empty."));
    }
    if let Some(bad) = prompt.iter().find(|&&id| id >= state.vocab as u64) {
        return Err(ApiError::invalid_request(format!(
            "Token id {bad} is outside the model's vocabulary of {}.",
            state.vocab
        )));
    }
    let n = prompt.len();
    if n >= state.context {
        return Err(ApiError::context_length(format!(
            "This model's maximum context length is {} tokens, but the request has {n} prompt tokens.",
            state.context
        )));
    }
    if let Some(max) = generation.max_tokens
        && n + max > state.context
    {
        return Err(ApiError::context_length(format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens ({n} in the messages, {max} in the completion). Please reduce the length of the messages or completion.",
            state.context,
            n + max
        )));
    }
    if let Some(id) = &session {
        session_op(state, SessionOp::Open, id).await?;
    }
    Ok(Prepared {
        endpoint,
        turn: TurnRequest {
            session,
            prompt,
            max_new_tokens: generation.max_tokens,
            sampling: generation.sampling,
            stop: generation.stop.clone(),
            ignore_eos: generation.ignore_eos,
        },
        generation,
        tools,
    })
}

/// Sets a turn's cancel flag when dropped (the client went away), unless disarmed.
struct CancelOnDrop {
    flag: Arc<AtomicBool>,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::Relaxed);
        }
    }
}

fn usage(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.reused_prompt_tokens},
    })
}

fn finish_reason(c: &Completion, has_calls: bool) -> &'static str {
    if has_calls {
        "tool_calls"
    } else {
        match c.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

fn turn_error(e: TurnError) -> ApiError {
    match e {
        TurnError::Session(SessionError::Unsupported) => ApiError::unsupported_session(),
        TurnError::Session(_) => ApiError::capacity_exhausted(),
        TurnError::ContextExceeded {
            prompt_tokens,
            context,
        } => ApiError::context_length(format!(
            "This model's maximum context length is {context} tokens, but the request has {prompt_tokens} prompt tokens."
        )),
        other => ApiError::server(other.to_string()),
    }
}

async fn run(state: &Arc<AppState>, p: Prepared) -> Result<Response, ApiError> {
    let cancel = Arc::new(AtomicBool::new(false));
    let mut events = state
        .engine
        .generate(p.turn.clone(), Arc::clone(&cancel))
        .map_err(|_| ApiError::unavailable())?;
    let guard = CancelOnDrop {
        flag: cancel,
        armed: true,
    };
    if p.generation.stream {
        // The status line waits until the turn has started, so that a request refused
        // on the way (its session lost to capacity while it queued, say) gets its HTTP
        // error, not a 200 stream holding one.
        let first = match events.recv().await {
            Some(TurnEvent::Started) => None,
            Some(TurnEvent::Failed(e)) => return Err(turn_error(e)),
            None => return Err(ApiError::unavailable()),
            Some(other) => Some(other),
        };
        Ok(stream_response(Arc::clone(state), p, first, events, guard))
    } else {
        whole_response(state, p, events, guard).await
    }
}

async fn whole_response(
    state: &AppState,
    p: Prepared,
    mut events: UnboundedReceiver<TurnEvent>,
    mut guard: CancelOnDrop,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let done = loop {
        match events.recv().await {
            Some(TurnEvent::Started) => {}
            Some(TurnEvent::Text(t)) => text.push_str(&t),
            Some(TurnEvent::Done(c)) => break c,
            Some(TurnEvent::Failed(e)) => return Err(turn_error(e)),
            None => return Err(ApiError::unavailable()),
        }
    };
    guard.armed = false;
    remember(state, &p, &done, &text);
    let id_prefix = if p.endpoint == Endpoint::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let id = state.new_id(id_prefix);
    let body = match p.endpoint {
        Endpoint::Chat => {
            let parsed = reply(state, &p, &text);
            let mut message = json!({"role": "assistant", "content": parsed.content});
            if !parsed.tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(parsed.tool_calls.clone());
            }
            json!({
                "id": id,
                "object": "chat.completion",
                "created": unix_now(),
                "model": state.model_id,
                "choices": [{
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason(&done, !parsed.tool_calls.is_empty()),
                }],
                "usage": usage(&done),
            })
        }
        Endpoint::Completion => json!({
            "id": id,
            "object": "text_completion",
            "created": unix_now(),
            "model": state.model_id,
            "choices": [{"index": 0, "text": text, "finish_reason": finish_reason(&done, false)}],
            "usage": usage(&done),
        }),
    };
    Ok(axum::Json(body).into_response())
}

fn reply(state: &AppState, p: &Prepared, text: &str) -> ParsedReply {
    match &p.tools {
        Some(tools) => parse_tool_calls(text, tools, &mut || state.new_id("call")),
        None => ParsedReply {
            content: Some(text.to_string()),
            tool_calls: Vec::new(),
        },
    }
}

/// Remembers a named session's reply (as the client will send it back) with its ids.
fn remember(state: &AppState, p: &Prepared, done: &Completion, text: &str) {
    if let (Some(session), Some(ids)) = (&p.turn.session, &done.generated_token_ids)
        && p.endpoint == Endpoint::Chat
        && !(p.tools.is_some() && text.contains("<tool_call>"))
    {
        state.transcripts.remember(session, text, ids);
    }
}

/// The state of a streamed answer between chunks.
struct Streaming {
    state: Arc<AppState>,
    prepared: Prepared,
    /// An event read before the stream began, to be handled first.
    first: Option<TurnEvent>,
    events: UnboundedReceiver<TurnEvent>,
    guard: CancelOnDrop,
    id: String,
    created: u64,
    /// Text so far (all of it when tools are on: calls are parsed at the end).
    text: String,
    pending: std::collections::VecDeque<Event>,
    finished: bool,
}

impl Streaming {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Event {
        let object = match self.prepared.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        let mut body = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.state.model_id,
            "choices": choices,
        });
        if let Some(u) = usage {
            body["usage"] = u;
        }
        Event::default().data(body.to_string())
    }

    fn delta(&self, delta: Value, finish: Option<&str>) -> Event {
        let choice = match self.prepared.endpoint {
            Endpoint::Chat => json!({"index": 0, "delta": delta, "finish_reason": finish}),
            Endpoint::Completion => json!({
                "index": 0,
                "text": delta.get("content").and_then(Value::as_str).unwrap_or(""),
                "finish_reason": finish,
            }),
        };
        self.chunk(json!([choice]), None)
    }

    /// Turns the next engine event into SSE events; `false` once the stream is over.
    async fn advance(&mut self) -> bool {
        if self.finished {
            return false;
        }
        let event = match self.first.take() {
            Some(e) => Some(e),
            None => self.events.recv().await,
        };
        match event {
            Some(TurnEvent::Started) => {}
            Some(TurnEvent::Text(t)) => {
                self.text.push_str(&t);
                if self.prepared.tools.is_none() {
                    let e = self.delta(json!({"content": t}), None);
                    self.pending.push_back(e);
                }
            }
            Some(TurnEvent::Done(done)) => {
                self.guard.armed = false;
                remember(&self.state, &self.prepared, &done, &self.text);
                let mut has_calls = false;
                if self.prepared.tools.is_some() {
                    let parsed = reply(&self.state, &self.prepared, &self.text);
                    if let Some(content) = &parsed.content {
                        let e = self.delta(json!({"content": content}), None);
                        self.pending.push_back(e);
                    }
                    for (i, call) in parsed.tool_calls.iter().enumerate() {
                        let mut call = call.clone();
                        call["index"] = json!(i);
                        let e = self.delta(json!({"tool_calls": [call]}), None);
                        self.pending.push_back(e);
                    }
                    has_calls = !parsed.tool_calls.is_empty();
                }
                let e = self.delta(json!({}), Some(finish_reason(&done, has_calls)));
                self.pending.push_back(e);
                if self.prepared.generation.include_usage {
                    let e = self.chunk(json!([]), Some(usage(&done)));
                    self.pending.push_back(e);
                }
                self.pending.push_back(Event::default().data("[DONE]"));
                self.finished = true;
            }
            Some(TurnEvent::Failed(e)) => {
                let e = turn_error(e);
                eprintln!("etch serve: {} {}", e.status.as_u16(), e.message);
                self.state
                    .metrics
                    .requests_failed
                    .fetch_add(1, Ordering::Relaxed);
                self.pending
                    .push_back(Event::default().data(e.body().to_string()));
                self.pending.push_back(Event::default().data("[DONE]"));
                self.finished = true;
            }
            None => {
                let e = ApiError::unavailable();
                self.pending
                    .push_back(Event::default().data(e.body().to_string()));
                self.pending.push_back(Event::default().data("[DONE]"));
                self.finished = true;
            }
        }
        true
    }
}

fn stream_response(
    state: Arc<AppState>,
    prepared: Prepared,
    first: Option<TurnEvent>,
    events: UnboundedReceiver<TurnEvent>,
    guard: CancelOnDrop,
) -> Response {
    let prefix = if prepared.endpoint == Endpoint::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let mut s = Streaming {
        id: state.new_id(prefix),
        created: unix_now(),
        state,
        prepared,
        first,
        events,
        guard,
        text: String::new(),
        pending: std::collections::VecDeque::new(),
        finished: false,
    };
    if s.prepared.endpoint == Endpoint::Chat {
        let e = s.delta(json!({"role": "assistant", "content": ""}), None);
        s.pending.push_back(e);
    }
    let events: std::pin::Pin<
        Box<dyn Stream<Item = Result<Event, std::convert::Infallible>> + Send>,
    > = Box::pin(stream::unfold(s, |mut s| async move {
        loop {
            if let Some(e) = s.pending.pop_front() {
                return Some((Ok(e), s));
            }
            if !s.advance().await {
                return None;
            }
        }
    }));
    Sse::new(events).into_response()
}
