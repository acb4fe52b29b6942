//! The engine's own thread: it owns the [`Engine`] (sessions, weights, tokenizer), takes
//! requests from HTTP handlers through a channel, and steps every running turn together
//! (continuous batching): each engine step decodes one token of every generating turn
//! in one batched pass over the weights ([`Engine::step_batch`]), and a turn whose
//! prompt is still being prefilled advances one chunk, so a new long prompt does not
//! stall the others for more than a chunk. Turns join and leave between steps;
//! cancellation and stop strings act per turn. Requests wait in arrival order for their
//! session to be free (the scratch session serves anonymous requests one at a time).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use etch_llm::{ActiveTurn, Completion, Engine, SessionError, TurnError, TurnRequest};
use tokio::sync::{mpsc as tmpsc, oneshot};

use super::metrics::Metrics;

/// What a generation sends back, in order: text pieces, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum TurnEvent {
    /// The turn has started (its prompt is prefilled).
    Started,
    Text(String),
    Done(Box<Completion>),
    Failed(TurnError),
}

/// A session operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOp {
    Open,
    Close,
    Reset,
}

/// How often, in engine steps, a busy engine publishes its session and memory gauges
/// (an idle one publishes each time it goes idle): often enough for a scrape every few
/// seconds, rare enough that summing the sessions' allocator counters costs nothing.
const OBSERVE_EVERY_STEPS: usize = 64;

/// Where a session operation's answer goes.
type SessionReply = oneshot::Sender<Result<bool, SessionError>>;

/// A session operation waiting its turn.
struct Deferred {
    seq: u64,
    op: SessionOp,
    id: String,
    reply: SessionReply,
}

enum Command {
    Generate {
        request: TurnRequest,
        events: tmpsc::UnboundedSender<TurnEvent>,
        cancel: Arc<AtomicBool>,
    },
    Session {
        op: SessionOp,
        id: String,
        reply: oneshot::Sender<Result<bool, SessionError>>,
    },
    Count {
        reply: oneshot::Sender<usize>,
    },
}

/// A handle on the engine thread; cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
}

/// The engine thread has stopped (it failed or the server is shutting down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the model engine has stopped")]
pub struct EngineGone;

impl EngineHandle {
    /// Starts the engine thread over `engine`.
    pub fn spawn(engine: Engine, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("etch-engine".into())
            .spawn(move || EngineLoop::new(engine, metrics, rx).run())?;
        Ok(Self { commands: tx })
    }

    /// Queues a turn; its events arrive on the returned receiver. Setting `cancel`
    /// stops it at its next step (or before it starts).
    pub fn generate(
        &self,
        request: TurnRequest,
        cancel: Arc<AtomicBool>,
    ) -> Result<tmpsc::UnboundedReceiver<TurnEvent>, EngineGone> {
        let (events, rx) = tmpsc::unbounded_channel();
        self.commands
            .send(Command::Generate {
                request,
                events,
                cancel,
            })
            .map_err(|_| EngineGone)?;
        Ok(rx)
    }

    /// Opens, closes or resets a named session; `Ok(false)` when close or reset found no
    /// such session.
    pub async fn session(
        &self,
        op: SessionOp,
        id: &str,
    ) -> Result<Result<bool, SessionError>, EngineGone> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Session {
                op,
                id: id.to_string(),
                reply,
            })
            .map_err(|_| EngineGone)?;
        rx.await.map_err(|_| EngineGone)
    }

    /// Named sessions open now.
    pub async fn named_sessions(&self) -> Result<usize, EngineGone> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Count { reply })
            .map_err(|_| EngineGone)?;
        rx.await.map_err(|_| EngineGone)
    }
}

struct Waiting {
    /// Arrival order among requests and session operations.
    seq: u64,
    request: TurnRequest,
    events: tmpsc::UnboundedSender<TurnEvent>,
    cancel: Arc<AtomicBool>,
}

struct EngineLoop {
    commands: mpsc::Receiver<Command>,
    engine: Engine,
    metrics: Arc<Metrics>,
    waiting: VecDeque<Waiting>,
    /// The running turns, and beside each (same index) where its events go.
    running: Vec<ActiveTurn>,
    streams: Vec<tmpsc::UnboundedSender<TurnEvent>>,
    /// The turns that ended in the last step (reused).
    finished: Vec<(usize, Result<Completion, TurnError>)>,
    /// Session operations that wait: a close or reset for the turns that arrived
    /// before it on its session, an open for room.
    deferred: Vec<Deferred>,
    /// The next arrival number.
    next_seq: u64,
    /// Engine steps since the session and memory gauges were last published.
    steps_since_observed: usize,
}

impl EngineLoop {
    fn new(engine: Engine, metrics: Arc<Metrics>, commands: mpsc::Receiver<Command>) -> Self {
        Self {
            commands,
            engine,
            metrics,
            waiting: VecDeque::new(),
            running: Vec::new(),
            streams: Vec::new(),
            finished: Vec::new(),
            deferred: Vec::new(),
            next_seq: 0,
            steps_since_observed: 0,
        }
    }

    /// Waits for work (the pool's workers asleep), then serves until idle again with
    /// the workers polling for the kernels' parallel loops. A panic while serving (a
    /// bug) ends the turns in flight with an error and the engine goes on serving.
    fn run(mut self) {
        let pool = Arc::clone(self.engine.module().pool());
        loop {
            if self.is_idle() {
                match self.commands.recv() {
                    Ok(c) => self.command(c),
                    Err(_) => return,
                }
            }
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.install_hot(|| self.serve_until_idle())
            }));
            match served {
                Ok(true) => {}
                Ok(false) => return,
                Err(panic) => self.recover(&crate::panic_message(&*panic)),
            }
        }
    }

    /// After a panic unwound through the running turns: each ends with an error, their
    /// sessions are freed and left dirty (they start over), waiting requests stay.
    fn recover(&mut self, what: &str) {
        eprintln!(
            "etch serve: internal error in the engine: {what}; {} turn(s) in flight end \
             with it, their sessions start over",
            self.running.len()
        );
        for events in self.streams.drain(..) {
            let e = etch_llm::LlmError::Model(format!("internal error: {what}"));
            let _ = events.send(TurnEvent::Failed(TurnError::Llm(e)));
        }
        self.running.clear();
        self.finished.clear();
        self.engine.abandon_all();
        self.metrics.observe(&self.engine);
    }

    fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty() && self.deferred.is_empty()
    }

    /// Serves commands and steps turns until nothing is left to do; `false` when the
    /// handles are all gone.
    fn serve_until_idle(&mut self) -> bool {
        loop {
            loop {
                match self.commands.try_recv() {
                    Ok(c) => self.command(c),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        if self.running.is_empty() && self.waiting.is_empty() {
                            return false;
                        }
                        break;
                    }
                }
            }
            self.settle_deferred();
            self.admit();
            self.step_all();
            self.steps_since_observed += 1;
            let idle = self.is_idle();
            if idle || self.steps_since_observed >= OBSERVE_EVERY_STEPS {
                self.metrics.observe(&self.engine);
                self.steps_since_observed = 0;
            }
            if idle {
                return true;
            }
        }
    }

    fn command(&mut self, command: Command) {
        let seq = self.next_seq;
        self.next_seq += 1;
        match command {
            Command::Generate {
                request,
                events,
                cancel,
            } => {
                self.metrics.queued.fetch_add(1, Ordering::Relaxed);
                self.waiting.push_back(Waiting {
                    seq,
                    request,
                    events,
                    cancel,
                });
            }
            Command::Session { op, id, reply } => self.session_op(Deferred { seq, op, id, reply }),
            Command::Count { reply } => {
                let _ = reply.send(self.engine.named_sessions());
            }
        }
    }

    /// Whether a session operation must wait: a close or reset for a turn running in
    /// its session or a request for it that arrived earlier (operations on a session
    /// take effect in arrival order, as the official server's per-worker lock orders
    /// them: a close never cuts another client's turn short), an open for room while
    /// scratch sessions running anonymous turns hold every slot.
    fn must_wait(&self, d: &Deferred) -> bool {
        if self.deferred.iter().any(|e| e.seq < d.seq && e.id == d.id) {
            return true;
        }
        match d.op {
            SessionOp::Open => !self.engine.has_session(&d.id) && !self.engine.is_free(Some(&d.id)),
            SessionOp::Close | SessionOp::Reset => {
                self.running
                    .iter()
                    .any(|t| t.session() == Some(d.id.as_str()))
                    || self.waiting.iter().any(|w| {
                        w.seq < d.seq && w.request.session.as_deref() == Some(d.id.as_str())
                    })
            }
        }
    }

    fn session_op(&mut self, d: Deferred) {
        if self.must_wait(&d) {
            self.deferred.push(d);
            return;
        }
        let id = d.id.as_str();
        let result = match d.op {
            SessionOp::Open => self.engine.open(id).map(|()| true),
            SessionOp::Close => self.engine.close(id),
            SessionOp::Reset => match self.engine.reset(id) {
                Ok(found) => Ok(found),
                Err(TurnError::Session(e)) => Err(e),
                Err(e) => {
                    eprintln!("etch serve: resetting session {id:?} failed: {e}");
                    Ok(true)
                }
            },
        };
        // Published before the answer, so that a client reading /metrics after it sees
        // the session gone.
        self.metrics.observe(&self.engine);
        let _ = d.reply.send(result);
    }

    /// Runs the waiting session operations that may run now, in arrival order.
    fn settle_deferred(&mut self) {
        let deferred = std::mem::take(&mut self.deferred);
        for d in deferred {
            self.session_op(d);
        }
    }

    /// Starts every waiting request whose session is free, oldest first.
    fn admit(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &self.waiting[i];
            if w.cancel.load(Ordering::Relaxed) || w.events.is_closed() {
                if let Some(w) = self.waiting.remove(i) {
                    self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                    self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    let _ = w.events.send(TurnEvent::Failed(TurnError::Llm(
                        etch_llm::LlmError::Cancelled,
                    )));
                }
                continue;
            }
            let session = w.request.session.as_deref();
            let blocked_by_earlier = self
                .waiting
                .iter()
                .take(i)
                .any(|e| e.request.session.as_deref() == session)
                || (session.is_some()
                    && self
                        .deferred
                        .iter()
                        .any(|d| d.seq < w.seq && Some(d.id.as_str()) == session));
            if blocked_by_earlier || !self.engine.is_free(session) {
                i += 1;
                continue;
            }
            let Some(w) = self.waiting.remove(i) else {
                break;
            };
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            match self.engine.start(&w.request, Arc::clone(&w.cancel)) {
                Ok(turn) => {
                    let _ = w.events.send(TurnEvent::Started);
                    self.running.push(turn);
                    self.streams.push(w.events);
                }
                Err(e) => {
                    let _ = w.events.send(TurnEvent::Failed(e));
                }
            }
        }
    }

    /// One step of every running turn, their model steps batched.
    fn step_all(&mut self) {
        for (turn, events) in self.running.iter().zip(&self.streams) {
            if events.is_closed() {
                // The client is gone: stop at this step.
                turn.cancel_flag().store(true, Ordering::Relaxed);
            }
        }
        let streams = &self.streams;
        let finished = &mut self.finished;
        let decoded = self.engine.step_batch(
            &mut self.running,
            &mut |i, text| {
                if let Some(events) = streams.get(i) {
                    let _ = events.send(TurnEvent::Text(text.to_string()));
                }
            },
            &mut |i, result| finished.push((i, result)),
        );
        if decoded > 1 {
            self.metrics.batched_steps.fetch_add(1, Ordering::Relaxed);
            self.metrics
                .batched_tokens
                .fetch_add(decoded as u64, Ordering::Relaxed);
        }
        // Highest index first: each swap_remove moves a turn that is not among the rest.
        self.finished.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, result) in self.finished.drain(..) {
            if i >= self.running.len() {
                continue;
            }
            self.running.swap_remove(i);
            let events = self.streams.swap_remove(i);
            let event = match result {
                Ok(done) => {
                    self.metrics.record(&done);
                    TurnEvent::Done(Box::new(done))
                }
                Err(e) => TurnEvent::Failed(e),
            };
            let _ = events.send(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etch_llm::{Runner, RunnerOptions, SamplingConfig};

    fn engine_loop(dir: &std::path::Path) -> (EngineLoop, mpsc::Sender<Command>) {
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let tokenizer = dir.join("tokenizer.json");
        let json = etch_llm::tokenizer::byte_level_tokenizer_json(0);
        std::fs::write(&tokenizer, json.to_string()).unwrap();
        let options = RunnerOptions {
            threads: 1,
            ..Default::default()
        };
        let runner =
            Runner::load(&fixtures.join("tiny_llama_fp32.pte"), &tokenizer, &options).unwrap();
        let engine = Engine::new(runner, etch_llm::EngineOptions { max_sessions: 2 });
        let (tx, rx) = mpsc::channel();
        (
            EngineLoop::new(engine, Arc::new(Metrics::default()), rx),
            tx,
        )
    }

    fn generate(session: Option<&str>) -> (Command, tmpsc::UnboundedReceiver<TurnEvent>) {
        let (events, rx) = tmpsc::unbounded_channel();
        let request = TurnRequest {
            session: session.map(str::to_string),
            prompt: vec![5, 6, 7],
            max_new_tokens: Some(4),
            sampling: SamplingConfig::default(),
            stop: Vec::new(),
            ignore_eos: true,
        };
        let cancel = Arc::new(AtomicBool::new(false));
        (
            Command::Generate {
                request,
                events,
                cancel,
            },
            rx,
        )
    }

    /// What a panic mid-step leaves (`run` catches it and calls `recover`): the turns in
    /// flight end with an error, and the next request in the same session is served.
    #[test]
    fn after_a_panic_the_turns_in_flight_fail_and_the_engine_serves_on() {
        let dir = std::env::temp_dir().join(format!("etch-engine-recover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut engine, _commands) = engine_loop(&dir);
        let (command, mut first) = generate(Some("s"));
        engine.command(command);
        engine.admit();
        assert_eq!(engine.running.len(), 1);
        engine.recover("injected");
        assert!(matches!(first.try_recv(), Ok(TurnEvent::Started)));
        assert!(matches!(first.try_recv(), Ok(TurnEvent::Failed(_))));
        assert!(engine.is_idle());
        let (command, mut second) = generate(Some("s"));
        engine.command(command);
        assert!(engine.serve_until_idle());
        let mut done = None;
        while let Ok(event) = second.try_recv() {
            if let TurnEvent::Done(c) = event {
                done = Some(c);
            }
        }
        let done = done.expect("the next turn completes");
        assert_eq!(done.completion_tokens, 4);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
