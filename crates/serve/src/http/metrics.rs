//! Counters behind `GET /metrics` (Prometheus text format).

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use etch_llm::Completion;

/// What the server has done since it started.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub requests_failed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub prefilled_tokens: AtomicU64,
    pub reused_prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    /// Named sessions open.
    pub sessions_in_use: AtomicUsize,
    /// Requests waiting for their session.
    pub queued: AtomicUsize,
    /// Sessions holding state, scratch ones included.
    pub sessions_loaded: AtomicUsize,
    /// Planned bytes of the loaded sessions.
    pub planned_bytes: AtomicUsize,
    /// Free kernel scratch the sessions' temp allocators keep.
    pub temp_cached_bytes: AtomicUsize,
    /// Named sessions opened and closed since the start.
    pub sessions_opened: AtomicU64,
    pub sessions_closed: AtomicU64,
    /// Engine steps that decoded several turns in one batched pass over the weights,
    /// and the turns' tokens those steps decoded.
    pub batched_steps: AtomicU64,
    pub batched_tokens: AtomicU64,
    /// Milliseconds spent prefilling and decoding, summed over turns.
    times: Mutex<(f64, f64)>,
}

impl Metrics {
    /// Publishes what the engine's sessions hold now.
    pub fn observe(&self, engine: &etch_llm::Engine) {
        let memory = engine.memory();
        let store = |a: &AtomicUsize, v: usize| a.store(v, Ordering::Relaxed);
        store(&self.sessions_in_use, engine.named_sessions());
        store(&self.sessions_loaded, engine.loaded_sessions());
        store(&self.planned_bytes, memory.planned_bytes);
        store(&self.temp_cached_bytes, memory.temp_cached_bytes);
        self.sessions_opened
            .store(engine.sessions_opened(), Ordering::Relaxed);
        self.sessions_closed
            .store(engine.sessions_closed(), Ordering::Relaxed);
    }

    /// Adds a finished turn.
    pub fn record(&self, c: &Completion) {
        self.prompt_tokens
            .fetch_add(c.prompt_tokens as u64, Ordering::Relaxed);
        self.prefilled_tokens
            .fetch_add(c.prefilled_prompt_tokens as u64, Ordering::Relaxed);
        self.reused_prompt_tokens
            .fetch_add(c.reused_prompt_tokens as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(c.completion_tokens as u64, Ordering::Relaxed);
        if c.cancelled {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        let mut t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        t.0 += c.prefill_ms;
        t.1 += c.decode_ms;
    }

    /// The Prometheus exposition of every counter.
    pub fn render(&self, max_sessions: usize) -> String {
        let (prefill_ms, decode_ms) = *self.times.lock().unwrap_or_else(|e| e.into_inner());
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rate = |tokens: u64, ms: f64| {
            if ms > 0.0 {
                tokens as f64 * 1e3 / ms
            } else {
                0.0
            }
        };
        let prefilled = load(&self.prefilled_tokens);
        let completion = load(&self.completion_tokens);
        let gauge = |a: &AtomicUsize| a.load(Ordering::Relaxed) as f64;
        let rows: [(&str, &str, &str, f64); 19] = [
            (
                "etch_requests_total",
                "counter",
                "Chat and completion requests received.",
                load(&self.requests) as f64,
            ),
            (
                "etch_requests_failed_total",
                "counter",
                "Requests answered with an error.",
                load(&self.requests_failed) as f64,
            ),
            (
                "etch_requests_cancelled_total",
                "counter",
                "Turns cancelled (the client went away).",
                load(&self.cancelled) as f64,
            ),
            (
                "etch_prompt_tokens_total",
                "counter",
                "Prompt tokens of finished turns.",
                load(&self.prompt_tokens) as f64,
            ),
            (
                "etch_prefilled_tokens_total",
                "counter",
                "Prompt tokens prefilled (not reused).",
                prefilled as f64,
            ),
            (
                "etch_reused_prompt_tokens_total",
                "counter",
                "Prompt tokens reused from a session's cache.",
                load(&self.reused_prompt_tokens) as f64,
            ),
            (
                "etch_completion_tokens_total",
                "counter",
                "Tokens generated.",
                completion as f64,
            ),
            (
                "etch_prefill_tokens_per_second",
                "gauge",
                "Prefilled tokens per second of prefill time, all turns.",
                rate(prefilled, prefill_ms),
            ),
            (
                "etch_decode_tokens_per_second",
                "gauge",
                "Generated tokens per second of decode time, all turns.",
                rate(completion, decode_ms),
            ),
            (
                "etch_sessions_in_use",
                "gauge",
                "Named sessions open.",
                gauge(&self.sessions_in_use),
            ),
            (
                "etch_sessions_opened_total",
                "counter",
                "Named sessions opened.",
                load(&self.sessions_opened) as f64,
            ),
            (
                "etch_sessions_closed_total",
                "counter",
                "Named sessions closed.",
                load(&self.sessions_closed) as f64,
            ),
            (
                "etch_sessions_max",
                "gauge",
                "Named sessions the engine can hold.",
                max_sessions.saturating_sub(1) as f64,
            ),
            (
                "etch_requests_queued",
                "gauge",
                "Requests waiting for their session.",
                gauge(&self.queued),
            ),
            (
                "etch_sessions_loaded",
                "gauge",
                "Sessions holding state, scratch sessions for anonymous requests included.",
                gauge(&self.sessions_loaded),
            ),
            (
                "etch_planned_bytes",
                "gauge",
                "Planned memory (KV caches, activations) of the loaded sessions.",
                gauge(&self.planned_bytes),
            ),
            (
                "etch_temp_cached_bytes",
                "gauge",
                "Free kernel scratch the sessions' temp allocators keep for reuse.",
                gauge(&self.temp_cached_bytes),
            ),
            (
                "etch_batched_decode_steps_total",
                "counter",
                "Decode steps that ran several turns in one pass over the weights.",
                load(&self.batched_steps) as f64,
            ),
            (
                "etch_batched_decode_tokens_total",
                "counter",
                "Tokens decoded in those steps, all turns together.",
                load(&self.batched_tokens) as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        out
    }
}
