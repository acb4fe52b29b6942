//! Sampling defaults for chat: the model's `generation_config.json`, else the
//! conventions of llama.cpp (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05).

use serde_json::Value;

use crate::SamplingConfig;

/// Sampling defaults: from the model's `generation_config.json`, else the conventions
/// of the official runner and llama.cpp.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub repetition_penalty: f32,
    pub min_p: f32,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 40,
            repetition_penalty: 1.0,
            min_p: 0.05,
        }
    }
}

impl SamplingDefaults {
    /// The defaults of a `generation_config.json` (`do_sample: false` means greedy);
    /// fields it lacks keep the conventions.
    pub fn from_generation_config(config: &Value) -> Self {
        let mut d = Self::default();
        let num = |k: &str| config.get(k).and_then(Value::as_f64);
        if let Some(t) = num("temperature") {
            d.temperature = t as f32;
        }
        if let Some(p) = num("top_p") {
            d.top_p = p as f32;
        }
        if let Some(k) = config.get("top_k").and_then(Value::as_u64) {
            d.top_k = k as usize;
        }
        if let Some(r) = num("repetition_penalty") {
            d.repetition_penalty = r as f32;
        }
        if let Some(m) = num("min_p") {
            d.min_p = m as f32;
        }
        if config.get("do_sample").and_then(Value::as_bool) == Some(false) {
            d.temperature = 0.0;
        }
        d
    }

    /// The defaults beside a tokenizer file (`generation_config.json`), or the
    /// conventions.
    pub fn beside(tokenizer: &std::path::Path) -> Self {
        tokenizer
            .parent()
            .map(|d| d.join("generation_config.json"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .map(|c| Self::from_generation_config(&c))
            .unwrap_or_default()
    }
}

impl SamplingDefaults {
    /// A sampling configuration with these defaults and `seed`.
    pub fn config(&self, seed: u64) -> SamplingConfig {
        SamplingConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            repetition_penalty: self.repetition_penalty,
            min_p: self.min_p,
            seed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generation_config_defaults() {
        let d = SamplingDefaults::from_generation_config(
            &json!({"temperature": 0.6, "top_p": 0.9, "top_k": 20}),
        );
        assert_eq!((d.temperature, d.top_p, d.top_k), (0.6, 0.9, 20));
        let greedy = SamplingDefaults::from_generation_config(
            &json!({"do_sample": false, "temperature": 0.7}),
        );
        assert_eq!(greedy.temperature, 0.0);
    }
}
