//! `etch-worker`: the model worker ExecuTorch's own LLM server (`executorch 1.5.1`,
//! `examples/llm_server/python`) spawns with `--worker-bin`, speaking its JSONL protocol
//! on stdin and stdout (`docs/worker-protocol.md`): a ready line, then one request at a
//! time -- generate requests answered with `{"token"}` lines and a terminal `done` or
//! `error`, and session ops answered with acknowledgements. Cancel frames arrive on a
//! control pipe ([`cancel`]). Nothing but protocol JSON is written to the output; logs
//! go to stderr.

mod cancel;
mod request;

use std::io::{BufRead, Write};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use etch_llm::{Completion, Engine, SamplingConfig, SessionError, TurnError, TurnRequest};
use serde_json::{Value, json};

pub use cancel::{
    ActiveRequest, CONTROL_FD_VARIABLE, CancelBook, CancelIdError, FRAME_BYTES, FrameReader,
    listen_for_cancels, read_frames,
};
pub use request::{
    BadRequest, Generate, MAX_LINE_BYTES, MAX_STOP_BYTES, MAX_STOP_STRINGS, Op, Request, Segment,
    parse,
};

/// A session-capacity error's protocol code.
fn session_code(e: &SessionError) -> &'static str {
    match e {
        SessionError::Unsupported => "unsupported_session",
        SessionError::CapacityExhausted { .. } | SessionError::Busy(_) => "capacity_exhausted",
    }
}

/// An error line.
fn error_line(message: &str, code: Option<&str>, session_id: Option<&str>) -> Value {
    let mut line = json!({ "error": message });
    if let Some(code) = code {
        line["code"] = json!(code);
    }
    if let Some(id) = session_id {
        line["session_id"] = json!(id);
    }
    line
}

/// The terminal line of a finished turn.
pub fn done_line(c: &Completion) -> Value {
    let mut line = json!({
        "done": true,
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "finish_reason": c.finish_reason,
        "reused_prompt_tokens": c.reused_prompt_tokens,
        "prefilled_prompt_tokens": c.prefilled_prompt_tokens,
        "session_reset_reason": c.session_reset_reason,
        "prefill_ms": c.prefill_ms,
        "decode_ms": c.decode_ms,
        "total_ms": c.total_ms,
        "prefill_tok_s": c.prefill_tokens_per_second(),
        "decode_tok_s": c.decode_tokens_per_second(),
    });
    if let Some(ids) = &c.generated_token_ids {
        line["generated_token_ids"] = json!(ids);
    }
    if c.cancelled {
        line["cancelled"] = json!(true);
    }
    line
}

/// A seed for a request that asks for a random one.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish() | 1
}

/// The protocol loop over one engine.
pub struct Worker<'a, W: Write> {
    engine: &'a mut Engine,
    output: W,
    cancels: CancelBook,
    supports_cancel: bool,
}

impl<'a, W: Write> Worker<'a, W> {
    /// A worker writing protocol lines to `output`; cancel frames reach it through
    /// `cancels` when `supports_cancel`.
    pub fn new(
        engine: &'a mut Engine,
        output: W,
        cancels: CancelBook,
        supports_cancel: bool,
    ) -> Self {
        Self {
            engine,
            output,
            cancels,
            supports_cancel,
        }
    }

    fn write(&mut self, line: &Value) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.output, line)?;
        self.output.write_all(b"\n")?;
        self.output.flush()
    }

    /// Writes the ready line, then serves request lines from `input` until it ends.
    /// Returns an error only when the output fails (the server is gone).
    pub fn serve(&mut self, mut input: impl BufRead) -> std::io::Result<()> {
        let max_sessions = self.engine.max_sessions();
        self.write(&json!({
            "ready": true,
            "max_sessions": max_sessions,
            "max_named_sessions": self.engine.max_named_sessions(),
            "supports_cancel": self.supports_cancel,
        }))?;
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = std::io::Read::take(&mut input, MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)?;
            if read == 0 {
                return Ok(());
            }
            if line.len() > MAX_LINE_BYTES && line.last() != Some(&b'\n') {
                // Skip the rest of the overlong line.
                let mut rest = Vec::new();
                while input.read_until(b'\n', &mut rest)? > 0 && rest.last() != Some(&b'\n') {
                    rest.clear();
                }
                self.write(&error_line(
                    &format!("request line longer than {MAX_LINE_BYTES} bytes"),
                    None,
                    None,
                ))?;
                continue;
            }
            let Ok(text) = std::str::from_utf8(&line) else {
                self.write(&error_line("request line is not UTF-8", None, None))?;
                continue;
            };
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let text = text.to_string();
            let handled = std::panic::catch_unwind(AssertUnwindSafe(|| self.handle(&text)));
            match handled {
                Ok(result) => result?,
                Err(panic) => {
                    let what = crate::panic_message(&*panic);
                    let freed = self.engine.abandon_all();
                    eprintln!(
                        "etch-worker: internal error handling a request: {what} \
                         ({freed} session(s) left mid-turn start over)"
                    );
                    self.write(&error_line(&format!("internal error: {what}"), None, None))?;
                }
            }
        }
    }

    /// Handles one request line, writing its reply lines.
    pub fn handle(&mut self, line: &str) -> std::io::Result<()> {
        match parse(line) {
            Err(e) => self.write(&error_line(&e.0, None, None)),
            Ok(Request::Op { op, session_id }) => self.op(op, &session_id),
            Ok(Request::Generate(g)) => self.generate(g),
        }
    }

    fn op(&mut self, op: Op, id: &str) -> std::io::Result<()> {
        let result = match op {
            Op::Open => self.engine.open(id).map_err(|e| {
                eprintln!("etch-worker: cannot open session {id:?}: {e}");
                error_line("cannot open session", Some(session_code(&e)), Some(id))
            }),
            Op::Close => self
                .engine
                .close(id)
                .map(|_| ())
                .map_err(|e| error_line(&e.to_string(), None, Some(id))),
            Op::Reset => self.engine.reset(id).map(|_| ()).map_err(|e| {
                eprintln!("etch-worker: session {id:?} reset failed: {e}");
                error_line("session reset failed", None, Some(id))
            }),
        };
        match result {
            Ok(()) => self.write(&json!({ op.ack_key(): true, "session_id": id })),
            Err(line) => self.write(&line),
        }
    }

    fn generate(&mut self, g: Generate) -> std::io::Result<()> {
        if let Some(id) = g.cancel_request_id {
            let checked = if self.supports_cancel {
                self.cancels.check(id)
            } else {
                Err(CancelIdError::NotSupported)
            };
            if let Err(e) = checked {
                return self.write(&error_line(&e.to_string(), None, None));
            }
        }
        if let Some(id) = &g.session_id
            && let Err(e) = self.engine.open(id)
        {
            eprintln!("etch-worker: cannot open session {id:?}: {e}");
            return self.write(&error_line(
                "cannot open session",
                Some(session_code(&e)),
                Some(id),
            ));
        }
        let mut prompt = Vec::new();
        for segment in &g.prompt {
            match segment {
                Segment::Ids(ids) => prompt.extend_from_slice(ids),
                Segment::Text(text) => match self.engine.encode(text) {
                    Ok(ids) => prompt.extend(ids),
                    Err(e) => {
                        eprintln!("etch-worker: prompt encode failed: {e}");
                        return self.write(&error_line("prompt encode failed", None, None));
                    }
                },
            }
        }
        if prompt.is_empty() {
            return self.write(&error_line("empty prompt", None, None));
        }
        let request = TurnRequest {
            session: g.session_id.clone(),
            prompt,
            max_new_tokens: g.max_new_tokens,
            sampling: SamplingConfig {
                temperature: g.temperature,
                top_k: g.top_k,
                top_p: g.top_p,
                repetition_penalty: 1.0,
                min_p: 0.0,
                seed: g.seed.unwrap_or_else(random_seed),
            },
            stop: g.stop,
            ignore_eos: false,
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let result = {
            // Completed when dropped, so that a panic unwinding through the turn does
            // not leave the id active (every later request would be refused).
            let _active = g
                .cancel_request_id
                .map(|id| self.cancels.active(id, &cancel));
            self.run_turn(&request, cancel)
        };
        match result {
            Ok(Ok(done)) => self.write(&done_line(&done)),
            Ok(Err(e)) => {
                let line = match &e {
                    TurnError::ContextExceeded { .. } => error_line(
                        "prompt fills the context window; no room to generate",
                        None,
                        None,
                    ),
                    TurnError::Session(s) => error_line(
                        "cannot open session",
                        Some(session_code(s)),
                        g.session_id.as_deref(),
                    ),
                    other => error_line(&other.to_string(), None, None),
                };
                self.write(&line)
            }
            Err(io) => Err(io),
        }
    }

    /// Runs a turn, streaming token lines; the outer error is the output's.
    fn run_turn(
        &mut self,
        request: &TurnRequest,
        cancel: Arc<AtomicBool>,
    ) -> std::io::Result<Result<Completion, TurnError>> {
        let mut turn = match self.engine.start(request, cancel) {
            Ok(turn) => turn,
            Err(e) => return Ok(Err(e)),
        };
        loop {
            let output = &mut self.output;
            let mut failed: Option<std::io::Error> = None;
            let step = self.engine.step(&mut turn, &mut |text: &str| {
                if failed.is_none()
                    && let Err(e) = write_token(output, text)
                {
                    failed = Some(e);
                }
            });
            if let Some(e) = failed {
                if matches!(step, Ok(None)) {
                    self.engine.abandon(turn);
                }
                return Err(e);
            }
            match step {
                Ok(None) => {}
                Ok(Some(done)) => return Ok(Ok(done)),
                Err(e) => return Ok(Err(e)),
            }
        }
    }
}

fn write_token(output: &mut impl Write, text: &str) -> std::io::Result<()> {
    serde_json::to_writer(&mut *output, &json!({ "token": text }))?;
    output.write_all(b"\n")?;
    output.flush()
}
