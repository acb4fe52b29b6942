//! The metadata an exported LLM carries as constant methods (`get_max_seq_len`, ...).

use etch_runtime::{Module, Value, ValueInfo};

use crate::LlmError;

/// What the runner needs to know about an exported LLM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LlmMetadata {
    /// Most tokens one forward call takes, as the metadata says.
    pub max_seq_len: usize,
    /// KV-cache length: the most tokens in the context.
    pub max_context_len: usize,
    pub bos_id: Option<u64>,
    pub eos_ids: Vec<u64>,
    pub vocab_size: Option<usize>,
    pub n_layers: Option<usize>,
    pub use_kv_cache: bool,
    pub use_sdpa_with_kv_cache: bool,
    pub enable_dynamic_shape: bool,
    /// Most tokens one prefill call really accepts: the smaller of `max_seq_len` and the
    /// token input's upper bound (which exports set to max_seq_len - 1).
    pub max_prefill_chunk: usize,
    /// Inputs of the forward method (2 with a KV cache: tokens and position).
    pub forward_inputs: usize,
    /// True when the position input is a `[S]` cache-position vector, not `[1]`.
    pub position_is_vector: bool,
}

fn int(module: &mut Module, name: &'static str) -> Result<Option<i64>, LlmError> {
    match module.get_scalar(name)? {
        None => Ok(None),
        Some(Value::Int(v)) => Ok(Some(v)),
        Some(Value::Bool(b)) => Ok(Some(b as i64)),
        Some(other) => Err(LlmError::BadMetadata {
            name: name.to_string(),
            found: other.kind().to_string(),
        }),
    }
}

fn positive(name: &'static str, v: i64) -> Result<usize, LlmError> {
    usize::try_from(v)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| LlmError::BadMetadata {
            name: name.to_string(),
            found: v.to_string(),
        })
}

impl LlmMetadata {
    /// Reads the metadata methods of `module`; `method` is the forward method's name.
    pub fn read(module: &mut Module, method: &str) -> Result<Self, LlmError> {
        let max_seq_len =
            int(module, "get_max_seq_len")?.ok_or(LlmError::MissingMetadata("get_max_seq_len"))?;
        let max_seq_len = positive("get_max_seq_len", max_seq_len)?;
        let max_context_len = match int(module, "get_max_context_len")? {
            Some(v) => positive("get_max_context_len", v)?,
            None => max_seq_len,
        };
        // export_llama writes `get_eos_ids`; optimum-executorch writes `get_eos_id`
        // (one id, or several).
        let eos_method = ["get_eos_ids", "get_eos_id"]
            .into_iter()
            .find(|name| module.has_method(name));
        let eos_ids = match eos_method {
            Some(name) => module
                .execute(name, &[])?
                .into_iter()
                .filter_map(|v| match v {
                    Value::Int(i) => u64::try_from(i).ok(),
                    _ => None,
                })
                .collect(),
            None => Vec::new(),
        };
        let meta = module.method_meta(method)?;
        let (max_prefill_chunk, dynamic_tokens) = match meta.inputs.first() {
            Some(ValueInfo::Tensor(t)) if t.sizes.len() == 2 => (
                t.sizes[1].min(max_seq_len).max(1),
                t.dynamism != etch_format::ShapeDynamism::Static,
            ),
            _ => {
                return Err(LlmError::Model(format!(
                    "method {method:?}: input 0 must be a [1, seq] token tensor, found {:?}",
                    meta.inputs.first()
                )));
            }
        };
        let position_is_vector = matches!(
            meta.inputs.get(1),
            Some(ValueInfo::Tensor(t)) if t.sizes.iter().product::<usize>() > 1
        );
        let enable_dynamic_shape =
            int(module, "enable_dynamic_shape")?.map_or(dynamic_tokens, |v| v != 0);
        Ok(Self {
            max_seq_len,
            max_context_len,
            bos_id: int(module, "get_bos_id")?.and_then(|v| u64::try_from(v).ok()),
            eos_ids,
            vocab_size: int(module, "get_vocab_size")?.and_then(|v| usize::try_from(v).ok()),
            n_layers: int(module, "get_n_layers")?.and_then(|v| usize::try_from(v).ok()),
            use_kv_cache: int(module, "use_kv_cache")?.map_or(meta.inputs.len() > 1, |v| v != 0)
                || meta.inputs.len() > 1,
            use_sdpa_with_kv_cache: int(module, "use_sdpa_with_kv_cache")?.is_some_and(|v| v != 0),
            enable_dynamic_shape,
            max_prefill_chunk: if enable_dynamic_shape {
                max_prefill_chunk
            } else {
                1
            },
            forward_inputs: meta.inputs.len(),
            position_is_vector,
        })
    }
}
