//! The session engine: named sessions on one loaded program (weights once, a KV cache
//! and mutable buffers each) plus an anonymous scratch session, and turns -- one
//! request's prefill then decode -- stepped one token at a time, so that a server can
//! interleave them and stop any between steps.
//!
//! Anonymous requests run in scratch sessions, which start over every time: the first
//! always exists; while the capacity is not taken by named sessions, more are made so
//! that anonymous requests run side by side too (an idle one gives its room back to a
//! named session that needs it).
//!
//! Token accounting follows the official LLM server's worker: a turn's prompt is
//! prefilled (only its new suffix when it extends the session's resident tokens), then
//! every generated token that is not an end-of-sequence token is emitted *and* stepped
//! through the model, so that after a turn the session holds the prompt and the reply:
//! the next prompt, which repeats both, resumes warm. An end-of-sequence token is
//! neither counted nor stepped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use etch_runtime::{Batch, MAX_BATCH};

use crate::runner::{LoadedModel, sample};
use crate::{
    LlmError, LlmMetadata, PrefillPlan, ResumeReason, Runner, Sampler, SamplingConfig, Session,
    StopStrings, StreamDecoder, Tokenizer,
};

/// End-of-turn tokens of the common chat formats: generation ends at any of them that
/// the tokenizer has as a token of its own, as it does at end-of-sequence.
pub const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<|end|>",
    "<end_of_turn>",
    "</s>",
];

/// Why a session could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The engine keeps no named sessions (capacity 1: the scratch session only).
    #[error("this engine hosts a single session; omit the session id")]
    Unsupported,
    /// Every named session slot is taken, or the memory budget has no room for another.
    #[error("session capacity exhausted ({named} named sessions open): {reason}")]
    CapacityExhausted { named: usize, reason: String },
    /// The session is running a turn.
    #[error("session {0:?} is busy with another request")]
    Busy(String),
}

/// Why a turn could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The prompt leaves no room to generate in the context.
    #[error(
        "the prompt has {prompt_tokens} tokens and the model's context holds {context}: no room to generate"
    )]
    ContextExceeded {
        prompt_tokens: usize,
        context: usize,
    },
    #[error(transparent)]
    Llm(#[from] LlmError),
}

/// How an engine is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Sessions in all, the scratch session included: named sessions get the rest.
    pub max_sessions: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self { max_sessions: 4 }
    }
}

/// One request for a turn.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    /// The named session to run in (opened if needed); `None`: the scratch session,
    /// which starts over every time.
    pub session: Option<String>,
    /// The whole prompt's token ids (a named session prefills only what extends its
    /// resident tokens).
    pub prompt: Vec<u64>,
    /// Most tokens to generate; `None` (or more than the context has room for): as
    /// many as fit.
    pub max_new_tokens: Option<usize>,
    pub sampling: SamplingConfig,
    /// Text that ends the turn where it appears (it is not emitted).
    pub stop: Vec<String>,
    /// Go on past end-of-sequence tokens (fixed-length benchmarks).
    pub ignore_eos: bool,
}

/// Why a turn ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End of sequence, a stop string, or a cancel.
    Stop,
    /// `max_new_tokens` (or the context) ran out.
    Length,
}

/// The result of a finished turn.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Completion {
    pub prompt_tokens: usize,
    /// Tokens generated, end-of-sequence not counted.
    pub completion_tokens: usize,
    pub finish_reason: FinishReason,
    pub reused_prompt_tokens: usize,
    pub prefilled_prompt_tokens: usize,
    pub session_reset_reason: ResumeReason,
    /// The generated tokens; `None` when a stop string or a cancel cut the turn (the
    /// session is then dirty).
    pub generated_token_ids: Option<Vec<u64>>,
    pub cancelled: bool,
    /// A stop string ended the turn.
    pub stopped_by_string: bool,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub total_ms: f64,
}

impl Completion {
    /// Prefilled tokens per second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        per_second(self.prefilled_prompt_tokens, self.prefill_ms)
    }

    /// Generated tokens per second.
    pub fn decode_tokens_per_second(&self) -> f64 {
        per_second(self.completion_tokens, self.decode_ms)
    }
}

fn per_second(count: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        count as f64 * 1e3 / ms
    } else {
        0.0
    }
}

/// Memory the engine's sessions hold (`Engine::memory`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineMemory {
    /// Planned memory (KV caches, activations) of every loaded session.
    pub planned_bytes: usize,
    /// Free kernel scratch the sessions' temp allocators keep for reuse.
    pub temp_cached_bytes: usize,
}

struct Slot {
    /// Stable while other slots come and go (turns name their slot by it).
    id: usize,
    /// `None`: a scratch session (slot 0, and any made for anonymous requests).
    name: Option<String>,
    session: Session,
    busy: bool,
}

/// Named sessions and a scratch session over one loaded model.
pub struct Engine {
    model: LoadedModel,
    slots: Vec<Slot>,
    max_sessions: usize,
    eos_ids: Vec<u64>,
    next_slot_id: usize,
    sessions_opened: u64,
    sessions_closed: u64,
}

/// A turn in progress: started by [`Engine::start`], advanced by [`Engine::step`].
pub struct ActiveTurn {
    /// The id of its session's slot.
    slot: usize,
    /// The named session's id (`None`: the scratch session).
    session: Option<String>,
    sampler: Sampler,
    stream: StreamDecoder,
    stops: StopStrings,
    max_new: usize,
    generated: Vec<u64>,
    ignore_eos: bool,
    cancel: Arc<AtomicBool>,
    plan: PrefillPlan,
    prompt_tokens: usize,
    started: Instant,
    decode_started: Instant,
    prefill_ms: f64,
    /// The whole prompt, and how much of it the session holds: a long prompt is
    /// prefilled one chunk per step, so that other turns decode in between.
    prompt: Vec<u64>,
    prefilled: usize,
}

impl ActiveTurn {
    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated.len()
    }

    /// The named session the turn runs in (`None`: the scratch session).
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// The flag that cancels this turn at its next step.
    pub fn cancel_flag(&self) -> &Arc<AtomicBool> {
        &self.cancel
    }
}

impl Engine {
    /// An engine over a loaded runner: its session becomes the scratch session; the
    /// template end-of-turn tokens the tokenizer has end turns as end-of-sequence does.
    pub fn new(mut runner: Runner, options: EngineOptions) -> Self {
        runner.add_end_of_turn_tokens();
        let (model, scratch) = runner.into_parts();
        let mut eos_ids = model.eos_ids.clone();
        eos_ids.extend(model.tokenizer.eos_ids().into_iter().map(u64::from));
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Self {
            model,
            slots: vec![Slot {
                id: 0,
                name: None,
                session: scratch,
                busy: false,
            }],
            max_sessions: options.max_sessions.max(1),
            eos_ids,
            next_slot_id: 1,
            sessions_opened: 0,
            sessions_closed: 0,
        }
    }

    /// The model's metadata.
    pub fn metadata(&self) -> &LlmMetadata {
        &self.model.metadata
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &dyn Tokenizer {
        &*self.model.tokenizer
    }

    /// The tokenizer, shared (to tokenise prompts on other threads).
    pub fn shared_tokenizer(&self) -> Arc<dyn Tokenizer> {
        Arc::clone(&self.model.tokenizer)
    }

    /// The module the sessions run on (its program, thread pool, memory budget).
    pub fn module(&self) -> &etch_runtime::Module {
        &self.model.module
    }

    /// Tokenises text as given (no BOS added; special tokens written in it recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u64>, LlmError> {
        Ok(self
            .model
            .tokenizer
            .encode(text)?
            .into_iter()
            .map(u64::from)
            .collect())
    }

    /// Token ids that end a turn.
    pub fn eos_ids(&self) -> &[u64] {
        &self.eos_ids
    }

    /// Ids the model's logits cover (a prompt's ids must be below it).
    pub fn vocab_size(&self) -> usize {
        self.model.vocab
    }

    /// Sessions in all (the scratch session included).
    pub fn max_sessions(&self) -> usize {
        self.max_sessions
    }

    /// Named sessions the engine can hold.
    pub fn max_named_sessions(&self) -> usize {
        self.max_sessions - 1
    }

    /// Named sessions open now.
    pub fn named_sessions(&self) -> usize {
        self.slots.iter().filter(|s| s.name.is_some()).count()
    }

    /// Named sessions opened since the engine started.
    pub fn sessions_opened(&self) -> u64 {
        self.sessions_opened
    }

    /// Named sessions closed since the engine started.
    pub fn sessions_closed(&self) -> u64 {
        self.sessions_closed
    }

    /// Sessions holding state now: named ones and scratch ones together.
    pub fn loaded_sessions(&self) -> usize {
        self.slots.len()
    }

    /// What the loaded sessions' memory holds now: planned bytes and the temp
    /// allocators' counters, added up over sessions.
    pub fn memory(&self) -> EngineMemory {
        let mut memory = EngineMemory::default();
        for slot in &self.slots {
            let method = slot.session.method();
            memory.planned_bytes += method.planned_bytes();
            memory.temp_cached_bytes += method.temp_allocator_stats().bytes_cached;
        }
        memory
    }

    /// Whether a named session is open.
    pub fn has_session(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// Whether the session a request would run in is free now.
    pub fn is_free(&self, session: Option<&str>) -> bool {
        match session {
            None => self.free_scratch().is_some() || self.slots.len() < self.max_sessions,
            Some(name) => match self.find(name) {
                Some(i) => !self.slots[i].busy,
                // Opening it needs a slot: a free one, or an idle scratch session's (while
                // busy scratch sessions hold every slot, the request waits); past the
                // named capacity it is refused at once.
                None => {
                    self.named_sessions() >= self.max_named_sessions()
                        || self.slots.len() < self.max_sessions
                        || self.idle_extra_scratch().is_some()
                }
            },
        }
    }

    fn new_slot_id(&mut self) -> usize {
        self.next_slot_id += 1;
        self.next_slot_id - 1
    }

    /// The slot of a turn (a slot running a turn is never removed).
    fn slot_of(&mut self, turn: &ActiveTurn) -> Result<&mut Slot, LlmError> {
        self.slots
            .iter_mut()
            .find(|s| s.id == turn.slot)
            .ok_or_else(|| LlmError::Model("the turn's session is gone".into()))
    }

    /// A scratch session that is not running a turn.
    fn free_scratch(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.name.is_none() && !s.busy)
    }

    /// A scratch session beyond the first that is not running a turn.
    fn idle_extra_scratch(&self) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .skip(1)
            .find(|(_, s)| s.name.is_none() && !s.busy)
            .map(|(i, _)| i)
    }

    /// The scratch session an anonymous request runs in: a free one, or a new one while
    /// there is room.
    fn scratch_slot(&mut self) -> Result<usize, SessionError> {
        if let Some(i) = self.free_scratch() {
            return Ok(i);
        }
        if self.slots.len() >= self.max_sessions {
            return Err(SessionError::Busy(String::new()));
        }
        let session = self
            .model
            .new_session()
            .map_err(|e| SessionError::CapacityExhausted {
                named: self.named_sessions(),
                reason: e.to_string(),
            })?;
        let id = self.new_slot_id();
        self.slots.push(Slot {
            id,
            name: None,
            session,
            busy: false,
        });
        Ok(self.slots.len() - 1)
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.name.as_deref() == Some(name))
    }

    /// Opens a named session (an open one is left as it is). Its planned memory is
    /// allocated now, against the program's memory budget.
    pub fn open(&mut self, name: &str) -> Result<(), SessionError> {
        if self.find(name).is_some() {
            return Ok(());
        }
        if self.max_named_sessions() == 0 {
            return Err(SessionError::Unsupported);
        }
        let named = self.named_sessions();
        if named >= self.max_named_sessions() {
            return Err(SessionError::CapacityExhausted {
                named,
                reason: format!("the engine holds at most {}", self.max_named_sessions()),
            });
        }
        if self.slots.len() >= self.max_sessions {
            // Scratch sessions made for anonymous requests hold the room: an idle one
            // gives it back.
            match self.idle_extra_scratch() {
                Some(i) => drop(self.slots.remove(i)),
                None => {
                    return Err(SessionError::CapacityExhausted {
                        named,
                        reason: "every session is running a turn".into(),
                    });
                }
            }
        }
        let session = self
            .model
            .new_session()
            .map_err(|e| SessionError::CapacityExhausted {
                named,
                reason: e.to_string(),
            })?;
        let id = self.new_slot_id();
        self.slots.push(Slot {
            id,
            name: Some(name.to_string()),
            session,
            busy: false,
        });
        self.sessions_opened += 1;
        Ok(())
    }

    /// Closes a named session, freeing its memory; `false` if it was not open.
    pub fn close(&mut self, name: &str) -> Result<bool, SessionError> {
        match self.find(name) {
            None => Ok(false),
            Some(i) if self.slots[i].busy => Err(SessionError::Busy(name.to_string())),
            Some(i) => {
                self.slots.remove(i);
                self.sessions_closed += 1;
                Ok(true)
            }
        }
    }

    /// Empties a named session (kept open); `false` if it was not open.
    pub fn reset(&mut self, name: &str) -> Result<bool, TurnError> {
        match self.find(name) {
            None => Ok(false),
            Some(i) if self.slots[i].busy => Err(SessionError::Busy(name.to_string()).into()),
            Some(i) => {
                self.slots[i].session.reset()?;
                Ok(true)
            }
        }
    }

    /// The tokens resident in a named session.
    pub fn resident_tokens(&self, name: &str) -> Option<&[u64]> {
        self.find(name)
            .map(|i| self.slots[i].session.resident_tokens())
    }

    /// Starts a turn: takes its session, plans and runs the prefill (checking `cancel`
    /// between chunks). The turn then decodes through [`Engine::step`]; a cancel during
    /// prefill ends it at its first step.
    pub fn start(
        &mut self,
        request: &TurnRequest,
        cancel: Arc<AtomicBool>,
    ) -> Result<ActiveTurn, TurnError> {
        let started = Instant::now();
        if request.prompt.is_empty() {
            return Err(LlmError::EmptyPrompt.into());
        }
        let context = self.metadata().max_context_len;
        let prompt_tokens = request.prompt.len();
        let room = context.saturating_sub(prompt_tokens);
        if room == 0 {
            return Err(TurnError::ContextExceeded {
                prompt_tokens,
                context,
            });
        }
        let max_new = match request.max_new_tokens {
            Some(n) if n > 0 => n.min(room),
            _ => room,
        };
        let sampler = Sampler::new(self.model.vocab, request.sampling)?;
        let slot = match &request.session {
            None => self.scratch_slot()?,
            Some(name) => {
                self.open(name)?;
                self.find(name).unwrap_or(0)
            }
        };
        if self.slots[slot].busy {
            let name = self.slots[slot].name.clone().unwrap_or_default();
            return Err(SessionError::Busy(name).into());
        }
        let scratch = self.slots[slot].name.is_none();
        let session = &mut self.slots[slot].session;
        // A scratch session always starts over.
        let plan = if scratch {
            session.reset()?;
            PrefillPlan {
                reason: ResumeReason::New,
                reused: 0,
            }
        } else {
            session.prepare(&request.prompt)?
        };
        let token_bytes = &self.model.token_bytes;
        let mut turn = ActiveTurn {
            slot: self.slots[slot].id,
            session: request.session.clone(),
            sampler,
            stream: StreamDecoder::new(token_bytes),
            stops: StopStrings::new(&request.stop),
            max_new,
            generated: Vec::with_capacity(max_new.min(context)),
            ignore_eos: request.ignore_eos,
            cancel,
            plan,
            prompt_tokens,
            started,
            decode_started: started,
            prefill_ms: 0.0,
            prompt: request.prompt.clone(),
            prefilled: plan.reused,
        };
        self.prefill_chunk(&mut turn)?;
        self.slots[slot].busy = true;
        Ok(turn)
    }

    /// Prefills the next chunk of the turn's prompt (as many tokens as one forward call
    /// of the program takes); a cancel leaves the session dirty, and the turn ends at
    /// its next step.
    fn prefill_chunk(&mut self, turn: &mut ActiveTurn) -> Result<(), LlmError> {
        let session = &mut self.slot_of(turn)?.session;
        let chunk = session.shape().max_prefill_chunk.max(1);
        let end = (turn.prefilled + chunk).min(turn.prompt.len());
        if end > turn.prefilled {
            match session.prefill(&turn.prompt[turn.prefilled..end], &turn.cancel) {
                // Delivered at the next step, as a cancelled turn.
                Ok(_) | Err(LlmError::Cancelled) => {}
                Err(e) => return Err(e),
            }
        }
        turn.prefilled = end;
        if end == turn.prompt.len() {
            turn.prefill_ms = turn.started.elapsed().as_secs_f64() * 1e3;
            turn.decode_started = Instant::now();
        }
        Ok(())
    }

    /// One decode step of `turn`: samples a token, hands its text (complete UTF-8,
    /// stop strings held back) to `on_text`, and steps it through the model. Returns the
    /// completion once the turn has ended; the turn's session is then free again.
    pub fn step(
        &mut self,
        turn: &mut ActiveTurn,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Option<Completion>, TurnError> {
        let result = self.step_inner(turn, on_text);
        if !matches!(result, Ok(None))
            && let Ok(slot) = self.slot_of(turn)
        {
            slot.busy = false;
            if result.is_err() {
                slot.session.set_dirty(true);
            }
        }
        result
    }

    fn step_inner(
        &mut self,
        turn: &mut ActiveTurn,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Option<Completion>, TurnError> {
        let token = match self.advance(turn, on_text)? {
            Advance::Finished(done) => return Ok(Some(done)),
            Advance::Prefilled => return Ok(None),
            Advance::Decode(token) => token,
        };
        self.slot_of(turn)?.session.decode(token)?;
        Ok(after_decode(turn, on_text))
    }

    /// One decode step of each of `turns`, their model steps run together as one
    /// batched step over the weights ([`Session::decode_batch`]); each turn gets the
    /// tokens it gets stepped alone ([`Engine::step`]). `on_text(i, text)` gets turn
    /// `i`'s text and `on_done(i, result)` each turn that ended (its session is then
    /// free again; the caller drops the turn). At most [`etch_runtime::MAX_BATCH`]
    /// turns step together; more step in several batches. Returns how many turns ran a
    /// model step.
    pub fn step_batch(
        &mut self,
        turns: &mut [ActiveTurn],
        on_text: &mut dyn FnMut(usize, &str),
        on_done: &mut dyn FnMut(usize, Result<Completion, TurnError>),
    ) -> usize {
        let mut decoded = 0;
        for (base, group) in (0..turns.len())
            .step_by(MAX_BATCH)
            .zip(turns.chunks_mut(MAX_BATCH))
        {
            decoded += self.step_group(base, group, on_text, on_done);
        }
        decoded
    }

    fn step_group(
        &mut self,
        base: usize,
        turns: &mut [ActiveTurn],
        on_text: &mut dyn FnMut(usize, &str),
        on_done: &mut dyn FnMut(usize, Result<Completion, TurnError>),
    ) -> usize {
        // Sample each turn; those that go on need a model step.
        let mut tokens = [None::<u64>; MAX_BATCH];
        for (i, turn) in turns.iter_mut().enumerate() {
            let result = self.advance(turn, &mut |t| on_text(base + i, t));
            match result {
                Ok(Advance::Decode(token)) => tokens[i] = Some(token),
                Ok(Advance::Prefilled) => {}
                Ok(Advance::Finished(done)) => self.end_turn(turn, base + i, Ok(done), on_done),
                Err(e) => self.end_turn(turn, base + i, Err(e), on_done),
            }
        }
        let mut steps = Batch::new();
        for slot in self.slots.iter_mut() {
            let turn = turns
                .iter()
                .zip(&tokens)
                .find(|(t, token)| t.slot == slot.id && token.is_some());
            if let Some((_, Some(token))) = turn {
                // At most MAX_BATCH turns, one per slot: `steps` holds them all.
                let _ = steps.push((&mut slot.session, *token));
            }
        }
        let decoded = steps.len();
        let result = Session::decode_batch(&mut steps);
        // Every turn of a failed step ends with its error (the sessions are dirty).
        let failure = result.err().map(|e| e.to_string());
        for (i, turn) in turns.iter_mut().enumerate() {
            if tokens[i].is_none() {
                continue;
            }
            if let Some(message) = &failure {
                let e = LlmError::Model(format!("batched decode step: {message}"));
                self.end_turn(turn, base + i, Err(e.into()), on_done);
                continue;
            }
            if let Some(done) = after_decode(turn, &mut |t| on_text(base + i, t)) {
                self.end_turn(turn, base + i, Ok(done), on_done);
            }
        }
        decoded
    }

    /// Frees a turn's session (dirty after an error) and reports the turn's end.
    fn end_turn(
        &mut self,
        turn: &ActiveTurn,
        i: usize,
        result: Result<Completion, TurnError>,
        on_done: &mut dyn FnMut(usize, Result<Completion, TurnError>),
    ) {
        if let Ok(slot) = self.slot_of(turn) {
            slot.busy = false;
            if result.is_err() {
                slot.session.set_dirty(true);
            }
        }
        on_done(i, result);
    }

    /// A turn's step up to its model step: the cancel check, the next chunk of a prompt
    /// not yet prefilled, or sampling, end of sequence, the token's text and stop
    /// strings. Returns the token to step through the model, or the turn's completion.
    fn advance(
        &mut self,
        turn: &mut ActiveTurn,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Advance, TurnError> {
        let session = &mut self.slot_of(turn)?.session;
        if turn.cancel.load(Ordering::Relaxed) || session.is_dirty() {
            // A cancel (now or during prefill) leaves what was said unsaid.
            flush(turn, on_text);
            session.set_dirty(true);
            return Ok(Advance::Finished(finish(
                turn,
                FinishReason::Stop,
                true,
                false,
            )));
        }
        if turn.prefilled < turn.prompt.len() {
            self.prefill_chunk(turn)?;
            return Ok(Advance::Prefilled);
        }
        let index = self.slots.iter().position(|s| s.id == turn.slot);
        let index = index.ok_or_else(|| LlmError::Model("the turn's session is gone".into()))?;
        let token_bytes = &self.model.token_bytes;
        let session = &mut self.slots[index].session;
        let token = u64::from(sample(&mut turn.sampler, session));
        if !turn.ignore_eos && self.eos_ids.contains(&token) {
            flush(turn, on_text);
            return Ok(Advance::Finished(finish(
                turn,
                FinishReason::Stop,
                false,
                false,
            )));
        }
        turn.generated.push(token);
        let piece = turn.stream.push(token_bytes, token as u32)?;
        let (text, hit) = turn.stops.push(piece);
        if !text.is_empty() {
            on_text(text);
        }
        if hit {
            session.set_dirty(true);
            return Ok(Advance::Finished(finish(
                turn,
                FinishReason::Stop,
                false,
                true,
            )));
        }
        Ok(Advance::Decode(token))
    }

    /// Runs a turn to its end (start, then steps), for callers that serve one request
    /// at a time.
    pub fn run(
        &mut self,
        request: &TurnRequest,
        cancel: Arc<AtomicBool>,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Completion, TurnError> {
        let mut turn = self.start(request, cancel)?;
        loop {
            if let Some(done) = self.step(&mut turn, on_text)? {
                return Ok(done);
            }
        }
    }

    /// Frees every session a turn holds, each left dirty: for after a fault unwound
    /// through the turns in flight (a caught panic), whose `ActiveTurn`s are gone.
    /// Returns how many sessions were busy.
    pub fn abandon_all(&mut self) -> usize {
        let mut freed = 0;
        for slot in self.slots.iter_mut().filter(|s| s.busy) {
            slot.busy = false;
            slot.session.set_dirty(true);
            freed += 1;
        }
        freed
    }

    /// Abandons a turn (its client is gone): the session is free again and dirty.
    pub fn abandon(&mut self, turn: ActiveTurn) {
        if let Ok(slot) = self.slot_of(&turn) {
            slot.busy = false;
            slot.session.set_dirty(true);
        }
    }
}

/// Where a turn's step stands before its model step.
enum Advance {
    /// The turn ended.
    Finished(Completion),
    /// A chunk of the prompt was prefilled (no token this step).
    Prefilled,
    /// Step this token through the model.
    Decode(u64),
}

/// A turn's step after its model step: ends it when it has all its tokens.
fn after_decode(turn: &mut ActiveTurn, on_text: &mut dyn FnMut(&str)) -> Option<Completion> {
    if turn.generated.len() >= turn.max_new {
        flush(turn, on_text);
        return Some(finish(turn, FinishReason::Length, false, false));
    }
    None
}

/// Releases the text held back for an incomplete character or a possible stop string.
fn flush(turn: &mut ActiveTurn, on_text: &mut dyn FnMut(&str)) {
    let tail = turn.stream.finish();
    let (text, _) = turn.stops.push(tail);
    if !text.is_empty() {
        on_text(text);
    }
    let rest = turn.stops.flush();
    if !rest.is_empty() {
        on_text(rest);
    }
}

fn finish(
    turn: &mut ActiveTurn,
    reason: FinishReason,
    cancelled: bool,
    by_string: bool,
) -> Completion {
    let decode_ms = turn.decode_started.elapsed().as_secs_f64() * 1e3;
    let cut = cancelled || by_string;
    Completion {
        prompt_tokens: turn.prompt_tokens,
        completion_tokens: turn.generated.len(),
        finish_reason: reason,
        reused_prompt_tokens: turn.plan.reused,
        prefilled_prompt_tokens: turn.prompt_tokens - turn.plan.reused,
        session_reset_reason: turn.plan.reason,
        generated_token_ids: (!cut).then(|| std::mem::take(&mut turn.generated)),
        cancelled,
        stopped_by_string: by_string,
        prefill_ms: turn.prefill_ms,
        decode_ms,
        total_ms: turn.started.elapsed().as_secs_f64() * 1e3,
    }
}
