//! `etch.TextGenerator`: text generation with an exported LLM, as `etch generate` does.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Instant;

use etch_llm::{Generation, JinjaChatTemplate, LlmError, Runner, RunnerOptions, SamplingConfig};
use etch_runtime::Module;
use pyo3::exceptions::{PyFileNotFoundError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::{etch_error, llm_error};
use crate::program::parse_load_mode;

/// What to generate from: text (tokenised as given, or wrapped in the chat template)
/// or token ids.
enum Prompt {
    Text(String),
    Ids(Vec<u64>),
}

/// One `generate`/`stream` call's settings.
struct Request {
    prompt: Prompt,
    max_new_tokens: usize,
    sampling: SamplingConfig,
    chat: bool,
    chat_template: Option<String>,
    system: Option<String>,
    ignore_eos: bool,
}

/// Runs one request from a fresh context; the runner's stop tokens are as before after.
fn run_request(
    runner: &mut Runner,
    tokenizer_path: &Path,
    request: Request,
    on_text: &mut (dyn FnMut(&str) + Send),
) -> Result<Generation, LlmError> {
    let saved_eos = runner.eos_ids().to_vec();
    let result = (|| {
        let ids = match request.prompt {
            Prompt::Ids(ids) => ids,
            Prompt::Text(text) if request.chat => {
                let template = JinjaChatTemplate::select(
                    request.chat_template.as_deref(),
                    tokenizer_path,
                    runner.tokenizer(),
                )?;
                runner.add_end_of_turn_tokens();
                let mut messages = Vec::new();
                if let Some(system) = &request.system {
                    messages.push(serde_json::json!({"role": "system", "content": system}));
                }
                messages.push(serde_json::json!({"role": "user", "content": text}));
                runner.encode(&template.render(
                    &serde_json::Value::Array(messages),
                    None,
                    true,
                    None,
                )?)?
            }
            Prompt::Text(text) => runner.encode(&text)?,
        };
        if request.ignore_eos {
            runner.clear_eos_ids();
        }
        runner.reset()?;
        runner.generate(&ids, request.max_new_tokens, request.sampling, on_text)
    })();
    runner.clear_eos_ids();
    for id in saved_eos {
        runner.add_eos_id(id);
    }
    result
}

/// A `serde_json` value as a Python object.
fn json_to_py(py: Python<'_>, value: &serde_json::Value) -> PyResult<PyObject> {
    use serde_json::Value as J;
    Ok(match value {
        J::Null => py.None(),
        J::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        J::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any().unbind(),
            (_, Some(i), _) => i.into_pyobject(py)?.into_any().unbind(),
            (_, _, Some(f)) => f.into_pyobject(py)?.into_any().unbind(),
            _ => py.None(),
        },
        J::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        J::Array(items) => PyList::new(
            py,
            items
                .iter()
                .map(|v| json_to_py(py, v))
                .collect::<PyResult<Vec<_>>>()?,
        )?
        .into_any()
        .unbind(),
        J::Object(map) => {
            let d = PyDict::new(py);
            for (k, v) in map {
                d.set_item(k, json_to_py(py, v)?)?;
            }
            d.into_any().unbind()
        }
    })
}

/// A generation as the dict `etch generate --json` prints.
fn generation_to_py(py: Python<'_>, generation: &Generation) -> PyResult<PyObject> {
    let value = serde_json::to_value(generation)
        .map_err(|e| etch_error(format!("cannot describe the generation: {e}")))?;
    json_to_py(py, &value)
}

/// A loaded LLM and tokenizer. `generate` returns the text, the token ids and the same
/// stats as `etch generate --json`; `stream` yields the text piece by piece. The model
/// runs with the GIL released. Each call starts from an empty context.
#[pyclass(module = "etch", frozen, name = "TextGenerator")]
pub struct TextGenerator {
    runner: Arc<Mutex<Runner>>,
    tokenizer_path: PathBuf,
    /// Read at load (fixed after), so reading them never waits for a generation.
    metadata: serde_json::Value,
    eos_ids: Vec<u64>,
}

fn lock_runner(runner: &Mutex<Runner>) -> MutexGuard<'_, Runner> {
    runner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl TextGenerator {
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        prompt: &Bound<'_, PyAny>,
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        repetition_penalty: f32,
        seed: u64,
        chat: bool,
        chat_template: Option<String>,
        system: Option<String>,
        ignore_eos: bool,
    ) -> PyResult<Request> {
        let prompt = if let Ok(text) = prompt.extract::<String>() {
            if text.trim().is_empty() {
                return Err(PyValueError::new_err("the prompt is empty"));
            }
            Prompt::Text(text)
        } else if let Ok(ids) = prompt.extract::<Vec<u64>>() {
            if chat {
                return Err(PyValueError::new_err(
                    "chat=True needs a text prompt, not token ids",
                ));
            }
            Prompt::Ids(ids)
        } else {
            return Err(PyTypeError::new_err(format!(
                "prompt must be a str or a list of token ids, got {}",
                crate::dtype::type_name(prompt)
            )));
        };
        let sampling = SamplingConfig {
            min_p: 0.0,
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            seed,
        };
        sampling.validate().map_err(llm_error)?;
        Ok(Request {
            prompt,
            max_new_tokens,
            sampling,
            chat,
            chat_template,
            system,
            ignore_eos,
        })
    }
}

#[pymethods]
impl TextGenerator {
    /// Loads a `.pte` LLM (with a KV cache, as ExecuTorch's LLM exporter writes it) and a
    /// tokenizer (`tokenizer.json`, tiktoken, or llama2.c `tokenizer.bin`). `max_memory`:
    /// the most bytes the model may hold (None: what the system has available).
    #[new]
    // Each argument is one of Python's keyword arguments.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (model, tokenizer, threads = 0, load_mode = "auto", method = "forward", temp_cache_mib = 16, max_memory = None))]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        tokenizer: PathBuf,
        threads: usize,
        load_mode: &str,
        method: &str,
        temp_cache_mib: usize,
        max_memory: Option<u64>,
    ) -> PyResult<Self> {
        for (what, path) in [("model", &model), ("tokenizer", &tokenizer)] {
            if !path.exists() {
                return Err(PyFileNotFoundError::new_err(format!(
                    "{what} file {} does not exist",
                    path.display()
                )));
            }
        }
        let options = RunnerOptions {
            threads,
            temp_cache_bytes: temp_cache_mib.saturating_mul(1024 * 1024),
            method: method.to_string(),
            load_mode: parse_load_mode(load_mode)?,
            max_memory,
            fold_constants: true,
        };
        let runner = py
            .allow_threads(|| -> Result<Runner, LlmError> {
                let start = Instant::now();
                let tokenizer = etch_llm::load_tokenizer(&tokenizer)?;
                let builder = Module::from_path(&model);
                let builder = match options.max_memory {
                    Some(bytes) => builder.max_memory(bytes),
                    None => builder,
                };
                let module = builder
                    .load_mode(options.load_mode)
                    .threads(options.threads)
                    .temp_cache_bytes(options.temp_cache_bytes)
                    .build()?;
                Runner::from_parts(module, tokenizer, &options.method, start)
            })
            .map_err(|e| match e {
                LlmError::Runtime(r) => etch_error(format!("{}: {r}", model.display())),
                other => llm_error(other),
            })?;
        let metadata = serde_json::to_value(runner.metadata())
            .map_err(|e| etch_error(format!("cannot describe the model's metadata: {e}")))?;
        let eos_ids = runner.eos_ids().to_vec();
        Ok(Self {
            runner: Arc::new(Mutex::new(runner)),
            tokenizer_path: tokenizer,
            metadata,
            eos_ids,
        })
    }

    /// Generates up to `max_new_tokens` after `prompt` (text, tokenised as given with no
    /// BOS added, or a list of token ids). `chat=True` wraps the text in the model's chat
    /// template (`chat_template`: "chatml", "llama3" or a Jinja file; default the model's
    /// own beside the tokenizer, else the format its special tokens show) with `system`
    /// (default: the template's own). `temperature=0` is greedy.
    ///
    /// Returns `{"text", "prompt_token_ids", "generated_token_ids", "stop_reason",
    /// "stats"}`, as `etch generate --json` prints.
    #[pyo3(signature = (prompt, max_new_tokens = 128, temperature = 0.0, top_k = 0, top_p = 1.0, repetition_penalty = 1.0, seed = 42, chat = false, chat_template = None, system = None, ignore_eos = false))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        repetition_penalty: f32,
        seed: u64,
        chat: bool,
        chat_template: Option<String>,
        system: Option<String>,
        ignore_eos: bool,
    ) -> PyResult<PyObject> {
        let request = self.request(
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            seed,
            chat,
            chat_template,
            system,
            ignore_eos,
        )?;
        let generation = py
            .allow_threads(|| {
                let mut runner = lock_runner(&self.runner);
                run_request(&mut runner, &self.tokenizer_path, request, &mut |_| {})
            })
            .map_err(llm_error)?;
        generation_to_py(py, &generation)
    }

    /// Like `generate`, but returns an iterator of text pieces, each yielded as soon as
    /// it is complete UTF-8; after the last one, the iterator's `result` holds what
    /// `generate` returns. The model runs on a background thread.
    #[pyo3(signature = (prompt, max_new_tokens = 128, temperature = 0.0, top_k = 0, top_p = 1.0, repetition_penalty = 1.0, seed = 42, chat = false, chat_template = None, system = None, ignore_eos = false))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        prompt: &Bound<'_, PyAny>,
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        repetition_penalty: f32,
        seed: u64,
        chat: bool,
        chat_template: Option<String>,
        system: Option<String>,
        ignore_eos: bool,
    ) -> PyResult<TextStream> {
        let request = self.request(
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            seed,
            chat,
            chat_template,
            system,
            ignore_eos,
        )?;
        // Unbounded: the generation never waits for the reader, so it always ends and
        // frees the model, even when the reader stops or calls `generate` meanwhile.
        let (sender, receiver) = channel::<Event>();
        let runner = Arc::clone(&self.runner);
        let tokenizer_path = self.tokenizer_path.clone();
        std::thread::Builder::new()
            .name("etch-stream".to_string())
            .spawn(move || stream_worker(&runner, &tokenizer_path, request, sender))
            .map_err(|e| etch_error(format!("cannot start the generation thread: {e}")))?;
        Ok(TextStream {
            receiver: Mutex::new(Some(receiver)),
            result: Mutex::new(None),
        })
    }

    /// The token ids of `text` (tokenised as given: no BOS added).
    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u64>> {
        py.allow_threads(|| lock_runner(&self.runner).encode(text))
            .map_err(llm_error)
    }

    /// The text of token ids.
    fn decode(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<String> {
        py.allow_threads(|| lock_runner(&self.runner).tokenizer().decode(&ids))
            .map_err(llm_error)
    }

    /// The model's metadata (context length, BOS/EOS ids, vocabulary size, ...), as
    /// read from its metadata methods.
    #[getter]
    fn metadata(&self, py: Python<'_>) -> PyResult<PyObject> {
        json_to_py(py, &self.metadata)
    }

    /// The token ids that end generation (chat templates add their own per call).
    #[getter]
    fn eos_ids(&self) -> Vec<u64> {
        self.eos_ids.clone()
    }
}

/// What the generation thread sends a stream.
enum Event {
    Text(String),
    Done(Result<Box<Generation>, LlmError>),
}

fn stream_worker(
    runner: &Mutex<Runner>,
    tokenizer_path: &Path,
    request: Request,
    sender: Sender<Event>,
) {
    let mut runner = lock_runner(runner);
    // A dropped stream only stops the reading; the generation finishes, bounded by
    // max_new_tokens and the context.
    let text_sender = sender.clone();
    let mut on_text = move |piece: &str| {
        let _ = text_sender.send(Event::Text(piece.to_string()));
    };
    let result = run_request(&mut runner, tokenizer_path, request, &mut on_text);
    drop(runner);
    let _ = sender.send(Event::Done(result.map(Box::new)));
}

/// The iterator `TextGenerator.stream` returns: text pieces as they are generated.
#[pyclass(module = "etch", frozen, name = "TextStream")]
pub struct TextStream {
    receiver: Mutex<Option<Receiver<Event>>>,
    result: Mutex<Option<PyObject>>,
}

#[pymethods]
impl TextStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut guard = match self.receiver.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(etch_error("this stream is being read by another thread"));
            }
        };
        let Some(receiver) = guard.as_mut() else {
            return Ok(None);
        };
        let event = py.allow_threads(move || receiver.recv());
        match event {
            Ok(Event::Text(piece)) => Ok(Some(piece)),
            Ok(Event::Done(result)) => {
                *guard = None;
                let generation = result.map_err(llm_error)?;
                let dict = generation_to_py(py, &generation)?;
                *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(dict);
                Ok(None)
            }
            Err(_) => {
                *guard = None;
                Err(etch_error("the generation thread stopped without a result"))
            }
        }
    }

    /// After the last piece: what `generate` returns (None before).
    #[getter]
    fn result(&self, py: Python<'_>) -> Option<PyObject> {
        self.result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|r| r.clone_ref(py))
    }
}
