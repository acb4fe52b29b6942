//! Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition
//! penalty, with a seeded generator for reproducible sampling.

use crate::LlmError;

/// How to pick tokens.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SamplingConfig {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability exceeds p (1: off).
    pub top_p: f32,
    /// Penalise tokens already in the context (1: off), as Hugging Face does.
    pub repetition_penalty: f32,
    /// Keep only tokens at least this fraction as likely as the most likely one (0: off),
    /// as llama.cpp's min-p does.
    pub min_p: f32,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            min_p: 0.0,
            seed: 42,
        }
    }
}

impl SamplingConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), LlmError> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(LlmError::Sampling(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(LlmError::Sampling(format!(
                "top-p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(LlmError::Sampling(format!(
                "min-p must be in [0, 1], got {}",
                self.min_p
            )));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(LlmError::Sampling(format!(
                "repetition penalty must be > 0, got {}",
                self.repetition_penalty
            )));
        }
        Ok(())
    }
}

/// A sampler with buffers sized once for the vocabulary: sampling allocates nothing.
///
/// ```
/// use etch_llm::{Sampler, SamplingConfig};
/// let mut s = Sampler::new(4, SamplingConfig::default()).unwrap();
/// let mut logits = [0.1, 2.0, 2.0, -1.0];
/// assert_eq!(s.sample(&mut logits, &[]), 1); // greedy; ties go to the lowest id
/// ```
pub struct Sampler {
    config: SamplingConfig,
    state: u64,
    candidates: Vec<(f32, u32)>,
    seen: Vec<bool>,
}

impl Sampler {
    /// A sampler for a vocabulary of `vocab` tokens.
    pub fn new(vocab: usize, config: SamplingConfig) -> Result<Self, LlmError> {
        config.validate()?;
        Ok(Self {
            config,
            state: if config.seed == 0 {
                0x9E37_79B9_7F4A_7C15
            } else {
                config.seed
            },
            candidates: Vec::with_capacity(vocab),
            seen: vec![false; vocab],
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    fn next_u32(&mut self) -> u32 {
        // xorshift64*, as ExecuTorch's (llama2.c's) sampler.
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        (self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
    }

    fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / 16_777_216.0
    }

    /// Picks a token. `logits` is modified in place (penalty, temperature, softmax);
    /// `history` is the context so far, for the repetition penalty.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u64]) -> u32 {
        if self.config.repetition_penalty != 1.0 {
            self.apply_repetition_penalty(logits, history);
        }
        if self.config.temperature == 0.0 || logits.len() <= 1 {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.config.temperature;
        logits.iter_mut().for_each(|l| *l *= inv_t);
        softmax(logits);
        if self.config.min_p > 0.0 {
            apply_min_p(logits, self.config.min_p);
        }
        let coin = self.next_f32();
        let n = logits.len();
        if self.config.top_k > 0 && self.config.top_k < n {
            self.sample_top_k(logits, coin)
        } else if self.config.top_p < 1.0 {
            self.sample_top_p(logits, coin)
        } else {
            sample_multinomial(logits, coin)
        }
    }

    fn apply_repetition_penalty(&mut self, logits: &mut [f32], history: &[u64]) {
        let p = self.config.repetition_penalty;
        for &t in history {
            let t = t as usize;
            if t < logits.len() && t < self.seen.len() && !self.seen[t] {
                self.seen[t] = true;
                let l = &mut logits[t];
                *l = if *l > 0.0 { *l / p } else { *l * p };
            }
        }
        for &t in history {
            if let Some(s) = self.seen.get_mut(t as usize) {
                *s = false;
            }
        }
    }

    fn load_candidates(&mut self, probs: &[f32], min_p: f32) {
        self.candidates.clear();
        self.candidates.extend(
            probs
                .iter()
                .enumerate()
                .filter(|(_, p)| **p >= min_p)
                .map(|(i, &p)| (p, i as u32)),
        );
    }

    fn sample_top_k(&mut self, probs: &[f32], coin: f32) -> u32 {
        let k = self.config.top_k;
        self.load_candidates(probs, f32::NEG_INFINITY);
        let by_prob_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        self.candidates.select_nth_unstable_by(k - 1, by_prob_desc);
        self.candidates.truncate(k);
        self.candidates.sort_unstable_by(by_prob_desc);
        // Then the nucleus of the k, as llama.cpp chains its samplers.
        let top_p = self.config.top_p;
        if top_p < 1.0 {
            let total: f32 = self.candidates.iter().map(|c| c.0).sum();
            let mut cumulative = 0.0;
            if let Some(last) = self.candidates.iter().position(|c| {
                cumulative += c.0;
                cumulative > top_p * total
            }) {
                self.candidates.truncate(last + 1);
            }
        }
        pick(&self.candidates, coin)
    }

    fn sample_top_p(&mut self, probs: &[f32], coin: f32) -> u32 {
        let n = probs.len();
        let top_p = self.config.top_p;
        // Tokens below this cannot be part of the nucleus: skip them before sorting.
        let cutoff = (1.0 - top_p) / (n - 1) as f32;
        self.load_candidates(probs, cutoff);
        if self.candidates.is_empty() {
            return argmax(probs);
        }
        self.candidates
            .sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut cumulative = 0.0;
        let mut last = self.candidates.len() - 1;
        for (i, c) in self.candidates.iter().enumerate() {
            cumulative += c.0;
            if cumulative > top_p {
                last = i;
                break;
            }
        }
        self.candidates.truncate(last + 1);
        pick(&self.candidates, coin)
    }
}

/// Index of the largest value (the lowest index among equals; NaN never wins).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in values.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Zeroes the probabilities below `min_p` times the largest and renormalises the rest.
fn apply_min_p(probs: &mut [f32], min_p: f32) {
    let floor = min_p * probs.iter().copied().fold(0.0, f32::max);
    let mut sum = 0.0;
    for p in probs.iter_mut() {
        if *p < floor {
            *p = 0.0;
        }
        sum += *p;
    }
    if sum > 0.0 {
        let inv = 1.0 / sum;
        probs.iter_mut().for_each(|p| *p *= inv);
    }
}

fn sample_multinomial(probs: &[f32], coin: f32) -> u32 {
    let mut cdf = 0.0;
    for (i, &p) in probs.iter().enumerate() {
        cdf += p;
        if coin < cdf {
            return i as u32;
        }
    }
    (probs.len() - 1) as u32
}

fn pick(candidates: &[(f32, u32)], coin: f32) -> u32 {
    let total: f32 = candidates.iter().map(|c| c.0).sum();
    let r = coin * total;
    let mut cdf = 0.0;
    for c in candidates {
        cdf += c.0;
        if r < cdf {
            return c.1;
        }
    }
    candidates.last().map_or(0, |c| c.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
        Sampler::new(
            5,
            SamplingConfig {
                temperature,
                top_k,
                top_p,
                seed,
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn greedy_picks_the_first_maximum() {
        let mut s = sampler(0.0, 0, 1.0, 1);
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, f32::NAN, 0.0], &[]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_reproduce() {
        let logits = [0.5, 1.5, 0.2, 1.4, -3.0];
        let mut s = sampler(1.0, 1, 1.0, 7);
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits.clone(), &[]), 1);
        }
        let draw = |seed| {
            let mut s = sampler(0.8, 0, 0.9, seed);
            (0..50)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        assert!(draw(5).iter().all(|&t| t != 4), "top-p drops the tail");
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        let mut s = Sampler::new(
            3,
            SamplingConfig {
                repetition_penalty: 2.0,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(s.sample(&mut [1.0, 1.5, 0.0], &[1, 1]), 0);
    }

    #[test]
    fn bad_settings_are_errors() {
        for c in [
            SamplingConfig {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingConfig {
                top_p: 0.0,
                ..Default::default()
            },
            SamplingConfig {
                repetition_penalty: 0.0,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(3, c).is_err());
        }
    }
}
