//! The text-generation loop: prefill the prompt in as few calls as the program allows,
//! then decode token by token, with every buffer owned by the runner and reused.

use std::path::Path;
use std::time::Instant;

use std::sync::atomic::AtomicBool;

use crate::session::{ForwardShape, Session};
use crate::{
    LlmError, LlmMetadata, Sampler, SamplingConfig, StreamDecoder, Tokenizer, load_tokenizer,
    tokenizer::TokenBytes,
};
use etch_memory::counting::{CountingAllocator, count_allocations};
use etch_runtime::{LoadMode, Method, Module};

/// Default cache budget of the runner's caching temp allocator.
pub const DEFAULT_TEMP_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// How to load a model for generation.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Kernel threads (0: one per available core).
    pub threads: usize,
    /// Cache budget of the caching temp allocator.
    pub temp_cache_bytes: usize,
    /// The method that runs the model.
    pub method: String,
    /// How the `.pte` is brought into memory. Default [`LoadMode::Auto`]: decode streams
    /// every weight once per token, and on transparent huge pages that measured 18-25%
    /// faster than a memory map of the page cache (BENCHMARKS.md); a delegated program's
    /// weights are packed onto huge pages at load, so its file stays mapped and its
    /// pages are released once packed.
    pub load_mode: LoadMode,
    /// The most memory the program may hold, in bytes (`None`: what the system reports
    /// available); see `ModuleBuilder::max_memory`.
    pub max_memory: Option<u64>,
    /// Fold constant work at load (default on); see `ModuleBuilder::fold_constants`.
    pub fold_constants: bool,
}

impl RunnerOptions {
    /// A module builder for `model` with these options.
    fn builder(&self, model: &Path) -> etch_runtime::ModuleBuilder {
        let builder = Module::from_path(model)
            .load_mode(self.load_mode)
            .threads(self.threads)
            .temp_cache_bytes(self.temp_cache_bytes)
            .fold_constants(self.fold_constants);
        match self.max_memory {
            Some(bytes) => builder.max_memory(bytes),
            None => builder,
        }
    }
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            temp_cache_bytes: DEFAULT_TEMP_CACHE_BYTES,
            method: "forward".to_string(),
            load_mode: LoadMode::Auto,
            max_memory: None,
            fold_constants: true,
        }
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-sequence token was generated.
    Eos,
    /// `max_new_tokens` were generated.
    MaxNewTokens,
    /// The KV cache is full.
    ContextFull,
}

/// Measurements of one `generate` call.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GenerationStats {
    pub load_ms: f64,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_calls: usize,
    pub time_to_first_token_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub sampling_ms: f64,
    /// Heap allocations per decoded token over the whole token loop: the model step,
    /// sampling, detokenising, and the `on_text` callback (streaming to stdout in the
    /// CLI), after the first two steps. Not counted: loading, prefill, the first two
    /// steps, the last token (which needs no model step) and the result's assembly.
    /// With one thread, exactly this thread's allocations; with a pool, every thread's
    /// (so also anything else the process does meanwhile). `None` when the binary does
    /// not count allocations.
    pub heap_allocations_per_decoded_token: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub planned_bytes: usize,
    /// Bytes of constants folded at load (once per plan; see `MethodPlan::folded_bytes`).
    pub folded_bytes: usize,
    pub temp_allocator_hits: u64,
    pub temp_allocator_misses: u64,
    pub temp_allocator_peak_bytes: usize,
    pub threads: usize,
}

/// The result of `generate`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    pub prompt_token_ids: Vec<u64>,
    pub generated_token_ids: Vec<u64>,
    pub text: String,
    pub stop_reason: StopReason,
    pub stats: GenerationStats,
}

/// A loaded model plus tokenizer, ready to generate.
pub struct Runner {
    module: Module,
    /// The session of the model method, held directly: no lookup per token.
    session: Session,
    method: String,
    metadata: LlmMetadata,
    tokenizer: Box<dyn Tokenizer>,
    token_bytes: TokenBytes,
    stream: StreamDecoder,
    eos_ids: Vec<u64>,
    vocab: usize,
    load_ms: f64,
}

/// A loaded LLM without a session: what every session of it shares.
pub(crate) struct LoadedModel {
    pub(crate) module: Module,
    pub(crate) method: String,
    pub(crate) metadata: LlmMetadata,
    pub(crate) tokenizer: std::sync::Arc<dyn Tokenizer>,
    pub(crate) token_bytes: TokenBytes,
    pub(crate) eos_ids: Vec<u64>,
    pub(crate) vocab: usize,
}

impl LoadedModel {
    /// A new session of the model method: its own planned memory (held against the
    /// program's memory budget) and temp allocator.
    pub(crate) fn new_session(&self) -> Result<Session, LlmError> {
        let method = self.module.program().method(&self.method)?;
        Ok(Session::new(
            method,
            ForwardShape::new(&self.metadata, self.vocab),
        ))
    }
}

/// Peak resident memory of this process (Linux `VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The method that runs the model: `method`, or `prefill` when `forward` is asked for
/// and only `prefill` exists.
fn model_method(module: &Module, method: &str) -> Result<String, LlmError> {
    if module.has_method(method) {
        Ok(method.to_string())
    } else if method == "forward" && module.has_method("prefill") {
        Ok("prefill".to_string())
    } else {
        Err(LlmError::Model(format!(
            "the program has no {method:?} method (methods: {})",
            module.method_names().join(", ")
        )))
    }
}

impl Runner {
    /// Loads a `.pte` LLM and a tokenizer file.
    pub fn load(model: &Path, tokenizer: &Path, options: &RunnerOptions) -> Result<Self, LlmError> {
        let start = Instant::now();
        let tokenizer = load_tokenizer(tokenizer)?;
        let module = options.builder(model).build()?;
        Self::from_parts(module, tokenizer, &options.method, start)
    }

    /// Loads a `.pte` LLM without a tokenizer, to run on token ids alone (benchmarks):
    /// the vocabulary's size comes from `get_vocab_size`, else from the logits' shape;
    /// generated text is empty and the stop tokens are the model's own.
    pub fn load_without_tokenizer(model: &Path, options: &RunnerOptions) -> Result<Self, LlmError> {
        let start = Instant::now();
        let mut module = options.builder(model).build()?;
        let method = model_method(&module, &options.method)?;
        let vocab = match LlmMetadata::read(&mut module, &method)?.vocab_size {
            Some(v) => v,
            None => match module.method_meta(&method)?.outputs.first() {
                Some(etch_runtime::ValueInfo::Tensor(t)) if !t.sizes.is_empty() => {
                    t.sizes[t.sizes.len() - 1]
                }
                other => {
                    return Err(LlmError::Model(format!(
                        "method {method:?}: no get_vocab_size and output 0 is not logits ({other:?})"
                    )));
                }
            },
        };
        let tokenizer = Box::new(crate::tokenizer::IdsOnlyTokenizer::new(vocab));
        Self::from_parts(module, tokenizer, &method, start)
    }

    /// A runner over an already built module.
    pub fn from_parts(
        mut module: Module,
        tokenizer: Box<dyn Tokenizer>,
        method: &str,
        start: Instant,
    ) -> Result<Self, LlmError> {
        let method = model_method(&module, method)?;
        let metadata = LlmMetadata::read(&mut module, &method)?;
        let vocab = metadata
            .vocab_size
            .unwrap_or_else(|| tokenizer.vocab_size());
        if tokenizer.vocab_size() > vocab.max(1) + 1024 || vocab > tokenizer.vocab_size() + 1024 {
            return Err(LlmError::Model(format!(
                "the tokenizer ({} ids, {}) does not match the model ({vocab} ids)",
                tokenizer.vocab_size(),
                tokenizer.kind()
            )));
        }
        let mut eos_ids = metadata.eos_ids.clone();
        if eos_ids.is_empty() {
            eos_ids = tokenizer.eos_ids().into_iter().map(u64::from).collect();
        }
        let session = Session::new(
            module.take_method(&method)?,
            ForwardShape::new(&metadata, vocab),
        );
        let token_bytes = tokenizer.token_bytes()?;
        Ok(Self {
            stream: StreamDecoder::new(&token_bytes),
            token_bytes,
            module,
            session,
            method,
            vocab,
            eos_ids,
            tokenizer,
            metadata,
            load_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Takes the runner apart: the loaded model, and the session of its model method.
    pub(crate) fn into_parts(self) -> (LoadedModel, Session) {
        (
            LoadedModel {
                module: self.module,
                method: self.method,
                metadata: self.metadata,
                tokenizer: std::sync::Arc::from(self.tokenizer),
                token_bytes: self.token_bytes,
                eos_ids: self.eos_ids,
                vocab: self.vocab,
            },
            self.session,
        )
    }

    /// The underlying module (metadata methods; the model method's session is
    /// [`Runner::session_mut`]).
    pub fn module_mut(&mut self) -> &mut Module {
        &mut self.module
    }

    /// The session that runs the model method (for profiling and inspection).
    pub fn session_mut(&mut self) -> &mut Method {
        self.session.method_mut()
    }

    /// The name of the method that runs the model.
    pub fn method_name(&self) -> &str {
        &self.method
    }

    /// The model's metadata.
    pub fn metadata(&self) -> &LlmMetadata {
        &self.metadata
    }

    /// Ids the model's logits cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &dyn Tokenizer {
        &*self.tokenizer
    }

    /// Token ids that stop generation.
    pub fn eos_ids(&self) -> &[u64] {
        &self.eos_ids
    }

    /// Adds a stop token.
    pub fn add_eos_id(&mut self, id: u64) {
        if !self.eos_ids.contains(&id) {
            self.eos_ids.push(id);
        }
    }

    /// Adds the end-of-turn tokens of the common chat formats
    /// ([`crate::END_OF_TURN_TOKENS`]) that the tokenizer has as stop tokens.
    pub fn add_end_of_turn_tokens(&mut self) {
        let ids: Vec<u32> = crate::END_OF_TURN_TOKENS
            .iter()
            .filter_map(|t| self.tokenizer.token_id(t))
            .collect();
        for id in ids {
            self.add_eos_id(u64::from(id));
        }
    }

    /// Removes every stop token (generation then ends at `max_new_tokens` or when the
    /// context is full).
    pub fn clear_eos_ids(&mut self) {
        self.eos_ids.clear();
    }

    /// Forgets the context (the next generate starts at position 0): every mutable
    /// buffer of the program returns to its initial contents.
    pub fn reset(&mut self) -> Result<(), LlmError> {
        self.session.reset()
    }

    /// Makes the session ready for `prompt` (a whole conversation): keeps the tokens in
    /// the cache when the prompt extends them, empties it otherwise. `generate` then
    /// takes `&prompt[plan.reused..]`.
    pub fn prepare(&mut self, prompt: &[u64]) -> Result<crate::PrefillPlan, LlmError> {
        self.session.prepare(prompt)
    }

    /// Tokens in the KV cache: the position the next `generate` continues from. The last
    /// token a generation returns is not in it yet (it had no model step): a caller that
    /// continues the conversation puts it first in the next prompt.
    pub fn position(&self) -> usize {
        self.session.position()
    }

    /// The bytes of every token id, as streaming detokenisation reads them.
    pub fn token_bytes(&self) -> &TokenBytes {
        &self.token_bytes
    }

    /// Tokenises a prompt as given: no BOS is added (write it in the text, or use a
    /// chat template that has it).
    pub fn encode(&self, text: &str) -> Result<Vec<u64>, LlmError> {
        Ok(self
            .tokenizer
            .encode(text)?
            .into_iter()
            .map(u64::from)
            .collect())
    }

    /// Generates up to `max_new_tokens` after `prompt` (token ids), calling `on_text`
    /// with each piece of text as soon as it is complete UTF-8.
    pub fn generate(
        &mut self,
        prompt: &[u64],
        max_new_tokens: usize,
        sampling: SamplingConfig,
        on_text: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Generation, LlmError> {
        let pool = std::sync::Arc::clone(self.module.pool());
        // Run the whole loop on the pool, so kernels fork from a worker thread and
        // no job crosses into the pool per call; the other workers poll for that work
        // rather than sleep between the step's many small parallel loops.
        pool.install_hot(|| self.generate_inner(prompt, max_new_tokens, sampling, on_text))
    }

    fn generate_inner(
        &mut self,
        prompt: &[u64],
        max_new_tokens: usize,
        sampling: SamplingConfig,
        on_text: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Generation, LlmError> {
        if prompt.is_empty() {
            return Err(LlmError::EmptyPrompt);
        }
        let context = self.metadata.max_context_len;
        if self.position() + prompt.len() >= context {
            return Err(LlmError::PromptTooLong {
                prompt_tokens: prompt.len(),
                context,
                position: self.position(),
            });
        }
        let mut sampler = Sampler::new(self.vocab, sampling)?;
        let mut stats = GenerationStats {
            load_ms: self.load_ms,
            prompt_tokens: prompt.len(),
            threads: self.module.pool().threads(),
            ..Default::default()
        };
        let start = Instant::now();
        let never = AtomicBool::new(false);
        stats.prefill_calls = self.session.prefill(prompt, &never)?;
        let t = Instant::now();
        let mut token = sample(&mut sampler, &mut self.session) as u64;
        stats.sampling_ms += t.elapsed().as_secs_f64() * 1e3;
        stats.prefill_ms = start.elapsed().as_secs_f64() * 1e3;
        stats.time_to_first_token_ms = stats.prefill_ms;

        // Every buffer of the loop is sized up front: steady-state steps allocate nothing.
        let most_tokens = max_new_tokens.min(context - self.position() + 1);
        let mut generated = Vec::with_capacity(most_tokens);
        // A token's text is at most 3 bytes per byte (U+FFFD for each invalid byte).
        let mut text = String::with_capacity(most_tokens * 3 * self.token_bytes.longest().max(1));
        self.stream.finish();
        let decode_start = Instant::now();
        let mut counted_steps = 0u64;
        let mut counted_allocs = 0u64;
        // Serial pools run everything on this thread: count exactly that thread.
        // With worker threads, count every thread (other activity included).
        let serial = self.module.pool().threads() == 1;
        let stop = loop {
            let before = CountingAllocator::global_counts();
            let (step, local) = count_allocations(|| -> Result<Option<StopReason>, LlmError> {
                generated.push(token);
                if self.eos_ids.contains(&token) {
                    return Ok(Some(StopReason::Eos));
                }
                let piece = self.stream.push(&self.token_bytes, token as u32)?;
                if !piece.is_empty() {
                    on_text(piece);
                    text.push_str(piece);
                }
                if generated.len() >= max_new_tokens {
                    return Ok(Some(StopReason::MaxNewTokens));
                }
                if self.position() >= context {
                    return Ok(Some(StopReason::ContextFull));
                }
                self.session.decode(token)?;
                let t = Instant::now();
                token = sample(&mut sampler, &mut self.session) as u64;
                stats.sampling_ms += t.elapsed().as_secs_f64() * 1e3;
                Ok(None)
            });
            if let Some(stop) = step? {
                break stop;
            }
            let allocs = if serial {
                local.allocations
            } else {
                CountingAllocator::global_counts()
                    .since(&before)
                    .allocations
            };
            // The first steps warm up caches (temp allocator, thread-pool queues).
            if generated.len() > 2 {
                counted_steps += 1;
                counted_allocs += allocs;
            }
        };
        // The last token had no model step: the KV cache (and so the history the
        // sampler penalises) ends before it.
        let tail = self.stream.finish();
        if !tail.is_empty() {
            on_text(tail);
            text.push_str(tail);
        }
        stats.decode_ms = decode_start.elapsed().as_secs_f64() * 1e3;
        stats.generated_tokens = generated.len();
        let decoded_steps = generated.len().saturating_sub(1);
        stats.prefill_tokens_per_second = prompt.len() as f64 / (stats.prefill_ms / 1e3);
        stats.decode_tokens_per_second = if decoded_steps > 0 {
            decoded_steps as f64 / (stats.decode_ms / 1e3)
        } else {
            0.0
        };
        stats.heap_allocations_per_decoded_token = (CountingAllocator::is_installed()
            && counted_steps > 0)
            .then(|| counted_allocs as f64 / counted_steps as f64);
        stats.peak_rss_bytes = peak_rss_bytes();
        let method = self.session.method();
        stats.planned_bytes = method.planned_bytes() + self.module.planned_bytes();
        stats.folded_bytes = method.plan().folded_bytes();
        let temp = method.temp_allocator_stats();
        stats.temp_allocator_hits = temp.hits;
        stats.temp_allocator_misses = temp.misses;
        stats.temp_allocator_peak_bytes = temp.peak_bytes_live;
        Ok(Generation {
            prompt_token_ids: prompt.to_vec(),
            generated_token_ids: generated,
            text,
            stop_reason: stop,
            stats,
        })
    }
}

/// Samples the next token from a session's last logits, penalising its resident tokens.
pub(crate) fn sample(sampler: &mut Sampler, session: &mut Session) -> u32 {
    let (logits, resident) = session.logits_and_resident();
    sampler.sample(logits, resident)
}
