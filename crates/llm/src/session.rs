//! [`Session`]: one conversation's state on a loaded LLM program -- its own planned
//! memory (KV cache and every other mutable buffer), the token ids resident in it, and
//! the buffers one forward call fills -- over weights shared with every other session.

use std::sync::atomic::{AtomicBool, Ordering};

use etch_format::ScalarType;
use etch_runtime::{Batch, Method};
use half::{bf16, f16};

use crate::{LlmError, LlmMetadata};

/// How a model method is fed, read once from the program's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardShape {
    /// Ids the logits cover.
    pub vocab: usize,
    /// Tokens the context (KV cache) holds.
    pub max_context_len: usize,
    /// Most tokens one call takes (1 for programs exported with static shapes, which
    /// are then prefilled token by token).
    pub max_prefill_chunk: usize,
    /// Inputs of the method: 1 (tokens) or 2 (tokens and position).
    pub forward_inputs: usize,
    /// The position input is a `[S]` vector of cache positions, not `[1]`.
    pub position_is_vector: bool,
}

impl ForwardShape {
    /// The shape `metadata` describes, with logits over `vocab` ids.
    pub fn new(metadata: &LlmMetadata, vocab: usize) -> Self {
        Self {
            vocab,
            max_context_len: metadata.max_context_len,
            max_prefill_chunk: metadata.max_prefill_chunk.max(1),
            forward_inputs: metadata.forward_inputs,
            position_is_vector: metadata.position_is_vector,
        }
    }
}

/// Why a prompt was (or was not) continued from a session's resident tokens; the names
/// are those of the official LLM server's worker protocol (`session_reset_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeReason {
    /// The session held nothing (or is the anonymous scratch session).
    New,
    /// The prompt extends the resident tokens: only the suffix is prefilled.
    ExactPrefix,
    /// The prompt equals the resident tokens: prefilled again from the start (the
    /// last position's logits are not kept).
    Equal,
    /// The prompt is shorter than or differs from the resident tokens: started over.
    Mismatch,
    /// The session's last turn was cut (stop string, cancel, error): started over.
    Dirty,
}

/// What a prompt needs prefilled in a session: keep the first `reused` resident tokens
/// and prefill the rest of the prompt after them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillPlan {
    pub reason: ResumeReason,
    /// Resident tokens kept (0 unless `reason` is `ExactPrefix`).
    pub reused: usize,
}

impl PrefillPlan {
    /// The plan for `prompt` in a session holding `resident` (dirty or not).
    ///
    /// ```
    /// use etch_llm::{PrefillPlan, ResumeReason};
    /// let plan = PrefillPlan::new(&[1, 2, 3], false, &[1, 2, 3, 4, 5]);
    /// assert_eq!((plan.reason, plan.reused), (ResumeReason::ExactPrefix, 3));
    /// assert_eq!(PrefillPlan::new(&[1, 2, 3], false, &[1, 2, 3]).reason, ResumeReason::Equal);
    /// assert_eq!(PrefillPlan::new(&[1, 2, 3], false, &[1, 9]).reason, ResumeReason::Mismatch);
    /// assert_eq!(PrefillPlan::new(&[1, 2, 3], true, &[1, 2, 3, 4]).reason, ResumeReason::Dirty);
    /// assert_eq!(PrefillPlan::new(&[], false, &[7]).reason, ResumeReason::New);
    /// assert_eq!(PrefillPlan::new(&[], true, &[7]).reason, ResumeReason::Dirty);
    /// ```
    pub fn new(resident: &[u64], dirty: bool, prompt: &[u64]) -> Self {
        let start_over = |reason| Self { reason, reused: 0 };
        if dirty {
            start_over(ResumeReason::Dirty)
        } else if resident.is_empty() {
            start_over(ResumeReason::New)
        } else if prompt == resident {
            start_over(ResumeReason::Equal)
        } else if prompt.len() > resident.len() && prompt.starts_with(resident) {
            Self {
                reason: ResumeReason::ExactPrefix,
                reused: resident.len(),
            }
        } else {
            start_over(ResumeReason::Mismatch)
        }
    }
}

/// One conversation's state on a model method: planned memory (its KV cache and every
/// mutable buffer) and the token ids resident in it.
///
/// A session's only heap buffers are sized at creation; `prefill` and `decode` allocate
/// nothing once the resident-token list has grown to the context.
pub struct Session {
    method: Method,
    shape: ForwardShape,
    logits: Vec<f32>,
    token_buf: Vec<i64>,
    pos_buf: Vec<i64>,
    /// Token ids whose state is in the cache, in order: the position is its length.
    resident: Vec<u64>,
    /// The last turn was cut short: the resident tokens may not be the conversation.
    dirty: bool,
}

impl Session {
    /// A session over `method` (a fresh method session of the model's program).
    pub fn new(method: Method, shape: ForwardShape) -> Self {
        let chunk = shape.max_prefill_chunk.max(1);
        Self {
            method,
            shape,
            logits: vec![0.0; shape.vocab],
            token_buf: Vec::with_capacity(chunk),
            pos_buf: Vec::with_capacity(chunk),
            resident: Vec::with_capacity(shape.max_context_len + 1),
            dirty: false,
        }
    }

    /// How this session's method is fed.
    pub fn shape(&self) -> &ForwardShape {
        &self.shape
    }

    /// The method session (profiling, inspection).
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The method session, mutably (profiling).
    pub fn method_mut(&mut self) -> &mut Method {
        &mut self.method
    }

    /// Tokens in the cache: the position the next call writes at.
    pub fn position(&self) -> usize {
        self.resident.len()
    }

    /// The token ids resident in the cache, in order.
    pub fn resident_tokens(&self) -> &[u64] {
        &self.resident
    }

    /// Whether the last turn was cut short (the next prompt starts over).
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Marks (or clears) the session as cut short.
    pub fn set_dirty(&mut self, dirty: bool) {
        self.dirty = dirty;
    }

    /// Logits of the last position of the last call.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Logits of the last position of the last call, for a sampler to work in place.
    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }

    /// The logits to sample from, and the resident tokens a repetition penalty reads.
    pub fn logits_and_resident(&mut self) -> (&mut [f32], &[u64]) {
        (&mut self.logits, &self.resident)
    }

    /// Forgets the context: every mutable buffer of the program (not only the KV
    /// cache) returns to its initial contents; the position is 0 and the session clean.
    pub fn reset(&mut self) -> Result<(), LlmError> {
        self.resident.clear();
        self.dirty = false;
        self.method.reset_state()?;
        Ok(())
    }

    /// Makes the session ready for `prompt`: keeps the resident tokens when the prompt
    /// extends them, resets the session otherwise (a cache is never cut back: a
    /// program's recurrent state cannot be). Returns the plan; prefill
    /// `&prompt[plan.reused..]`.
    pub fn prepare(&mut self, prompt: &[u64]) -> Result<PrefillPlan, LlmError> {
        let plan = PrefillPlan::new(&self.resident, self.dirty, prompt);
        if plan.reused == 0 && (!self.resident.is_empty() || self.dirty) {
            self.reset()?;
        }
        Ok(plan)
    }

    /// Prefills `tokens` at the current position in as few calls as the program takes,
    /// checking `stop` before each call: a stop leaves the session dirty and returns
    /// [`LlmError::Cancelled`]. Returns the number of calls.
    pub fn prefill(&mut self, tokens: &[u64], stop: &AtomicBool) -> Result<usize, LlmError> {
        if tokens.is_empty() {
            return Err(LlmError::EmptyPrompt);
        }
        let context = self.shape.max_context_len;
        if self.position() + tokens.len() > context {
            return Err(LlmError::PromptTooLong {
                prompt_tokens: tokens.len(),
                context,
                position: self.position(),
            });
        }
        let mut calls = 0;
        for chunk in tokens.chunks(self.shape.max_prefill_chunk) {
            if stop.load(Ordering::Relaxed) {
                self.dirty = true;
                return Err(LlmError::Cancelled);
            }
            self.forward(chunk).inspect_err(|_| self.dirty = true)?;
            calls += 1;
        }
        Ok(calls)
    }

    /// One decode step: `token` at the current position; its logits replace the last.
    pub fn decode(&mut self, token: u64) -> Result<(), LlmError> {
        if self.position() >= self.shape.max_context_len {
            return Err(LlmError::PromptTooLong {
                prompt_tokens: 1,
                context: self.shape.max_context_len,
                position: self.position(),
            });
        }
        self.forward(&[token]).inspect_err(|_| self.dirty = true)
    }

    /// One decode step for each `(session, token)` of `steps` (sessions of one
    /// program), their forward calls run as one batched step
    /// ([`Method::execute_batch`]: each weight read once for all of them). Each session's
    /// logits are those [`Session::decode`] gives it alone. A failure leaves every
    /// session of the batch dirty.
    pub fn decode_batch(steps: &mut Batch<(&mut Session, u64)>) -> Result<(), LlmError> {
        let result = Self::decode_batch_inner(steps);
        if result.is_err() {
            steps.iter_mut().for_each(|(s, _)| s.dirty = true);
        }
        result
    }

    fn decode_batch_inner(steps: &mut Batch<(&mut Session, u64)>) -> Result<(), LlmError> {
        for (session, token) in steps.iter_mut() {
            if session.position() >= session.shape.max_context_len {
                return Err(LlmError::PromptTooLong {
                    prompt_tokens: 1,
                    context: session.shape.max_context_len,
                    position: session.position(),
                });
            }
            session.set_inputs(&[*token])?;
        }
        let mut methods = Batch::new();
        for (session, _) in steps.iter_mut() {
            // As many as `steps` holds: the same capacity.
            let _ = methods.push(&mut session.method);
        }
        Method::execute_batch(&mut methods)?;
        for (session, token) in steps.iter_mut() {
            read_last_logits(&mut session.method, &mut session.logits)?;
            session.resident.push(*token);
        }
        Ok(())
    }

    /// One forward call on `tokens` at the current position; the last position's logits
    /// land in `self.logits`. Allocates nothing once `resident` has its capacity.
    fn forward(&mut self, tokens: &[u64]) -> Result<(), LlmError> {
        self.set_inputs(tokens)?;
        self.method.execute()?;
        read_last_logits(&mut self.method, &mut self.logits)?;
        self.resident.extend_from_slice(tokens);
        Ok(())
    }

    /// Sets the method's inputs for `tokens` at the current position.
    fn set_inputs(&mut self, tokens: &[u64]) -> Result<(), LlmError> {
        let n = tokens.len();
        let vocab = self.shape.vocab;
        self.token_buf.clear();
        for &t in tokens {
            if t as usize >= vocab {
                return Err(LlmError::TokenOutOfRange { id: t, vocab });
            }
            self.token_buf.push(t as i64);
        }
        let pos = self.position();
        let method = &mut self.method;
        method.set_input_tensor(
            0,
            ScalarType::Long,
            &[1, n],
            bytemuck::cast_slice(&self.token_buf),
        )?;
        if self.shape.forward_inputs > 1 {
            self.pos_buf.clear();
            if self.shape.position_is_vector {
                self.pos_buf.extend((pos..pos + n).map(|p| p as i64));
                method.set_input_tensor(
                    1,
                    ScalarType::Long,
                    &[n],
                    bytemuck::cast_slice(&self.pos_buf),
                )?;
            } else {
                self.pos_buf.push(pos as i64);
                method.set_input_tensor(
                    1,
                    ScalarType::Long,
                    &[1],
                    bytemuck::cast_slice(&self.pos_buf),
                )?;
            }
        }
        Ok(())
    }
}

/// Copies the last row of output 0 (logits of any float dtype) into `logits`.
fn read_last_logits(method: &mut Method, logits: &mut [f32]) -> Result<(), LlmError> {
    let vocab = logits.len();
    let out = method.output_tensor(0)?;
    let sizes = out.tensor.sizes();
    let row = *sizes.last().unwrap_or(&0);
    if row != vocab || out.tensor.numel() < row {
        return Err(LlmError::Model(format!(
            "logits of shape {sizes:?} do not end in the vocabulary size {vocab}"
        )));
    }
    let start = out.tensor.numel() - row;
    let esize = out.tensor.dtype().element_size();
    let bytes = &out.bytes[start * esize..];
    match out.tensor.dtype() {
        ScalarType::Float => {
            for (d, c) in logits.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        ScalarType::Half => {
            for (d, c) in logits.iter_mut().zip(bytes.chunks_exact(2)) {
                *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        ScalarType::BFloat16 => {
            for (d, c) in logits.iter_mut().zip(bytes.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        other => {
            return Err(LlmError::Model(format!(
                "logits of dtype {other} are not supported"
            )));
        }
    }
    Ok(())
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("method", &self.method.name())
            .field("position", &self.position())
            .field("dirty", &self.dirty)
            .finish_non_exhaustive()
    }
}
