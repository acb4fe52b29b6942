//! `llama::gated_delta_rule.out` (and its deprecated name
//! `llama::channelwise_gated_delta_rule.out`): the recurrence of a Gated DeltaNet layer
//! (Qwen3.5's linear-attention layers), token by token over a per-head state.
//!
//! Shapes: `query [B, Hq, T, Dk]`, `key [B, H, T, Dk]`, `value [B, H, T, Dv]`, `decay`
//! `[B, H, T]` (one gate per head and token) or `[B, H, T, Dk]` (one per key channel),
//! `beta [B, H, T]`, `initial_state [B, H, Dk, Dv]`; `Hq` is a multiple of `H`, and
//! query head `h` reads state `h / (Hq / H)` (as `repeat_interleave`). All f32. For
//! every token `t` of state head `h`, with `S` its `[Dk, Dv]` state:
//!
//! ```text
//! S[k, :] *= decay[t, k]                      (the same gate for every k when scalar)
//! delta    = beta[t] * (v[t] - sum_k S[k, :] * k[t, k])
//! S[k, :] += k[t, k] * delta
//! out[q, t] = sum_k S[k, :] * q[q, t, k]      for each query head q of the group
//! ```
//!
//! `out` is `[B, Hq, T, Dv]` and `final_state_out` the state after the last token; the
//! decay arrives already exponentiated. The official kernel runs long prefills in
//! chunks of 32 tokens (the same function, summed in another order); this is the exact
//! recurrence it falls back to, which a static-shape program (one token per call)
//! always takes. `final_state_out` must not share bytes with `initial_state` (the
//! official kernel refuses that alias too; etch's borrow check names the bytes).
//!
//! State heads run in parallel. Each task works in scratch laid out per head as
//! `[state Dk*Dv | outputs Hq/H * T * Dv | delta Dv]` and the results are copied to the
//! two outs afterwards, so every task owns one contiguous piece.

use etch_base::ScalarType;

use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Tensor};

op_args! {
    /// `gated_delta_rule.out(Tensor query, Tensor key, Tensor value, Tensor decay,
    /// Tensor beta, Tensor initial_state, *, Tensor(a!) out, Tensor(b!) final_state_out)
    /// -> (Tensor(a!), Tensor(b!))`, returning both outs (one TensorList slot).
    struct GatedDeltaRuleArgs = "llama::gated_delta_rule.out" {
        query: Tensor,
        key: Tensor,
        value: Tensor,
        decay: Tensor,
        beta: Tensor,
        initial_state: Tensor,
        out: OutArg,
        final_state_out: OutArg,
    } returns 1
}

/// The validated problem.
#[derive(Debug, Clone, Copy)]
struct Recurrence {
    batch: usize,
    /// State (key/value) heads.
    heads: usize,
    /// Query heads per state head.
    group: usize,
    tokens: usize,
    key_dim: usize,
    value_dim: usize,
    /// One decay per key channel (`[B, H, T, Dk]`) rather than one per token.
    channelwise: bool,
}

impl Recurrence {
    fn state_len(&self) -> usize {
        self.key_dim * self.value_dim
    }

    fn out_len(&self) -> usize {
        self.group * self.tokens * self.value_dim
    }

    /// Scratch elements of one state head: its state, its outputs, `delta`.
    fn head_scratch_len(&self) -> usize {
        self.state_len() + self.out_len() + self.value_dim
    }
}

fn invalid(what: String) -> KernelError {
    KernelError::invalid(format!("gated_delta_rule: {what}"))
}

fn check(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    decay: &Tensor,
    beta: &Tensor,
    state: &Tensor,
) -> Result<Recurrence, KernelError> {
    let named = [
        ("query", query),
        ("key", key),
        ("value", value),
        ("decay", decay),
        ("beta", beta),
        ("initial_state", state),
    ];
    for (name, t) in named {
        if t.dtype() != ScalarType::Float {
            return Err(invalid(format!("{name} is {}, not f32", t.dtype())));
        }
        if !t.is_contiguous() {
            return Err(invalid(format!("{name} must be in contiguous dim order")));
        }
    }
    for (name, t, rank) in [("query", query, 4), ("key", key, 4), ("value", value, 4)] {
        if t.rank() != rank {
            return Err(invalid(format!("{name} {t:?} must be 4-D")));
        }
    }
    let (q, k, v) = (query.sizes(), key.sizes(), value.sizes());
    let (batch, heads, tokens, key_dim) = (k[0], k[1], k[2], k[3]);
    if q[0] != batch || q[2] != tokens || q[3] != key_dim {
        return Err(invalid(format!(
            "query {q:?} does not match key {k:?} in batch, tokens or key dim"
        )));
    }
    if heads == 0 || q[1] % heads != 0 {
        return Err(invalid(format!(
            "query's {} heads are not a multiple of key's {heads}",
            q[1]
        )));
    }
    if v[..3] != k[..3] {
        return Err(invalid(format!("value {v:?} does not match key {k:?}")));
    }
    let channelwise = match decay.sizes() {
        d if d == k => true,
        d if d == &k[..3] => false,
        d => {
            return Err(invalid(format!(
                "decay {d:?} must be {:?} (per head) or {k:?} (per key channel)",
                &k[..3]
            )));
        }
    };
    if beta.sizes() != &k[..3] {
        return Err(invalid(format!(
            "beta {:?} must be {:?}",
            beta.sizes(),
            &k[..3]
        )));
    }
    let value_dim = v[3];
    if state.sizes() != [batch, heads, key_dim, value_dim] {
        return Err(invalid(format!(
            "initial_state {:?} must be {:?}",
            state.sizes(),
            [batch, heads, key_dim, value_dim]
        )));
    }
    Ok(Recurrence {
        batch,
        heads,
        group: q[1] / heads,
        tokens,
        key_dim,
        value_dim,
        channelwise,
    })
}

/// The kernel of `gated_delta_rule.out` and of its deprecated name
/// `channelwise_gated_delta_rule.out`, whose arguments are the same (an error names
/// the current one).
pub(crate) fn gated_delta_rule_out(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    let GatedDeltaRuleArgs {
        query,
        key,
        value,
        decay,
        beta,
        initial_state,
        out,
        final_state_out,
    } = GatedDeltaRuleArgs::unpack(a)?;
    run(
        ctx,
        a,
        [&query, &key, &value, &decay, &beta, &initial_state],
        out,
        final_state_out,
    )
}

fn run(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    [query, key, value, decay, beta, initial_state]: [&Tensor; 6],
    out: OutArg,
    final_state_out: OutArg,
) -> Result<(), KernelError> {
    let r = check(query, key, value, decay, beta, initial_state)?;
    let out_sizes = [r.batch, r.heads * r.group, r.tokens, r.value_dim];
    let out = out.resize(a, &out_sizes)?;
    let final_state = final_state_out.resize(a, initial_state.sizes())?;
    for (name, t) in [("out", &out), ("final_state_out", &final_state)] {
        if t.dtype() != ScalarType::Float || !t.is_contiguous() {
            return Err(invalid(format!("{name} must be a contiguous f32 tensor")));
        }
    }
    let inputs = Inputs {
        query: ctx.read::<f32>(query)?,
        key: ctx.read::<f32>(key)?,
        value: ctx.read::<f32>(value)?,
        decay: ctx.read::<f32>(decay)?,
        beta: ctx.read::<f32>(beta)?,
        state: ctx.read::<f32>(initial_state)?,
    };
    let out = ctx.write::<f32>(&out)?;
    let final_state = ctx.write::<f32>(&final_state)?;
    let pairs = r.batch * r.heads;
    if pairs == 0 {
        return Ok(());
    }
    let per_head = r.head_scratch_len();
    let scratch_len = pairs
        .checked_mul(per_head)
        .ok_or_else(|| invalid("the state and output sizes overflow".into()))?;
    let scratch = ctx.scratch_dirty::<f32>(scratch_len)?;
    // Each head streams its state once per token, about 4 * Dk * Dv flops a token.
    let work = r.state_len().saturating_mul(4 * r.tokens.max(1)).max(1);
    let min_heads = (crate::GRAIN_SIZE / work).max(1);
    ctx.pool()
        .for_each_chunk_mut(scratch, per_head, min_heads, |head, part| {
            run_head(&r, &inputs, head, part);
        });
    let (state_len, out_len) = (r.state_len(), r.out_len());
    for (head, part) in scratch.chunks_exact(per_head).enumerate() {
        let state_at = head * state_len;
        let out_at = head * out_len;
        final_state
            .get_mut(state_at..state_at + state_len)
            .ok_or_else(|| invalid("final_state_out is shorter than its shape".into()))?
            .copy_from_slice(&part[..state_len]);
        out.get_mut(out_at..out_at + out_len)
            .ok_or_else(|| invalid("out is shorter than its shape".into()))?
            .copy_from_slice(&part[state_len..state_len + out_len]);
    }
    Ok(())
}

/// The input elements (lengths checked against the shapes by the access layer).
struct Inputs<'a> {
    query: &'a [f32],
    key: &'a [f32],
    value: &'a [f32],
    decay: &'a [f32],
    beta: &'a [f32],
    state: &'a [f32],
}

/// Runs every token of state head `head` (batch-major, `b * H + h`) in its scratch
/// `part`. Inputs shorter than their shapes leave the remaining outputs zero.
fn run_head(r: &Recurrence, x: &Inputs<'_>, head: usize, part: &mut [f32]) {
    let (dk, dv, t_len) = (r.key_dim, r.value_dim, r.tokens);
    let (state, rest) = part.split_at_mut(r.state_len());
    let (outs, delta) = rest.split_at_mut(r.out_len());
    let init = head * r.state_len();
    match x.state.get(init..init + r.state_len()) {
        Some(s) => state.copy_from_slice(s),
        None => state.fill(0.0),
    }
    outs.fill(0.0);
    let b = head / r.heads;
    let q_heads = r.heads * r.group;
    let first_q = (head % r.heads) * r.group;
    for t in 0..t_len {
        let row = head * t_len + t;
        let (Some(k), Some(v), Some(&beta)) = (
            x.key.get(row * dk..(row + 1) * dk),
            x.value.get(row * dv..(row + 1) * dv),
            x.beta.get(row),
        ) else {
            return;
        };
        // Decay the state and read what it predicts for this key.
        delta.fill(0.0);
        for (kc, (s_row, &k_c)) in state.chunks_exact_mut(dv).zip(k).enumerate() {
            let g = if r.channelwise {
                x.decay.get(row * dk + kc)
            } else {
                x.decay.get(row)
            };
            let g = g.copied().unwrap_or(0.0);
            for (s, p) in s_row.iter_mut().zip(delta.iter_mut()) {
                *s *= g;
                *p += *s * k_c;
            }
        }
        for (p, &v_c) in delta.iter_mut().zip(v) {
            *p = (v_c - *p) * beta;
        }
        // Write the correction, then read the state with each query of the group.
        for (s_row, &k_c) in state.chunks_exact_mut(dv).zip(k) {
            for (s, &d) in s_row.iter_mut().zip(delta.iter()) {
                *s += k_c * d;
            }
        }
        for g in 0..r.group {
            let q_row = (b * q_heads + first_q + g) * t_len + t;
            let Some(q) = x.query.get(q_row * dk..(q_row + 1) * dk) else {
                return;
            };
            let o = &mut outs[(g * t_len + t) * dv..(g * t_len + t + 1) * dv];
            for (s_row, &q_c) in state.chunks_exact(dv).zip(q) {
                for (o, &s) in o.iter_mut().zip(s_row) {
                    *o += s * q_c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recurrence as the upstream reference writes it, on whole tensors.
    fn reference(r: &Recurrence, x: &Inputs<'_>) -> (Vec<f32>, Vec<f32>) {
        let (dk, dv) = (r.key_dim, r.value_dim);
        let mut state = x.state.to_vec();
        let mut out = vec![0.0; r.batch * r.heads * r.group * r.tokens * dv];
        for b in 0..r.batch {
            for h in 0..r.heads {
                let s = &mut state[(b * r.heads + h) * dk * dv..][..dk * dv];
                for t in 0..r.tokens {
                    let row = (b * r.heads + h) * r.tokens + t;
                    for kc in 0..dk {
                        let g = if r.channelwise {
                            x.decay[row * dk + kc]
                        } else {
                            x.decay[row]
                        };
                        for vc in 0..dv {
                            s[kc * dv + vc] *= g;
                        }
                    }
                    for vc in 0..dv {
                        let mem: f32 = (0..dk)
                            .map(|kc| s[kc * dv + vc] * x.key[row * dk + kc])
                            .sum();
                        let d = (x.value[row * dv + vc] - mem) * x.beta[row];
                        for kc in 0..dk {
                            s[kc * dv + vc] += x.key[row * dk + kc] * d;
                        }
                    }
                    for g in 0..r.group {
                        let qh = h * r.group + g;
                        let q_row = (b * r.heads * r.group + qh) * r.tokens + t;
                        for vc in 0..dv {
                            out[q_row * dv + vc] = (0..dk)
                                .map(|kc| s[kc * dv + vc] * x.query[q_row * dk + kc])
                                .sum();
                        }
                    }
                }
            }
        }
        (out, state)
    }

    fn noise(n: usize, seed: u32, lo: f32, hi: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                lo + (hi - lo) * (s as f32 / u32::MAX as f32)
            })
            .collect()
    }

    #[test]
    fn mismatched_shapes_are_refused_by_name() {
        use crate::testing::Harness;
        use etch_base::ScalarType;
        // (beta sizes, state sizes, the words the error must hold)
        let cases: [(&[usize], &[usize], &str); 3] = [
            (&[1, 2, 3], &[1, 2, 4, 5], "ok"),
            (
                &[1, 2, 4],
                &[1, 2, 4, 5],
                "beta [1, 2, 4] must be [1, 2, 3]",
            ),
            (
                &[1, 2, 3],
                &[1, 2, 5, 5],
                "initial_state [1, 2, 5, 5] must be [1, 2, 4, 5]",
            ),
        ];
        for (beta_sizes, state_sizes, want) in cases {
            let mut h = Harness::new();
            let zeros = |sizes: &[usize]| vec![0.0f32; sizes.iter().product()];
            let q = h.tensor(&[1, 2, 3, 4], &zeros(&[1, 2, 3, 4]));
            let k = h.tensor(&[1, 2, 3, 4], &zeros(&[1, 2, 3, 4]));
            let v = h.tensor(&[1, 2, 3, 5], &zeros(&[1, 2, 3, 5]));
            let g = h.tensor(&[1, 2, 3], &zeros(&[1, 2, 3]));
            let b = h.tensor(beta_sizes, &zeros(beta_sizes));
            let s = h.tensor(state_sizes, &zeros(state_sizes));
            let out = h.out(ScalarType::Float, &[1, 2, 3, 5]);
            let fin = h.out(ScalarType::Float, &[1, 2, 4, 5]);
            let ret = h.tensor_list(&[out, fin]);
            let got = h.call(
                "llama::gated_delta_rule.out",
                &[q, k, v, g, b, s, out, fin, ret],
            );
            match got {
                Ok(()) => assert_eq!(want, "ok"),
                Err(e) => assert!(e.to_string().contains(want), "{e}"),
            }
        }
    }

    #[test]
    fn heads_follow_the_reference_recurrence() {
        for (channelwise, group, tokens) in [(false, 1, 1), (false, 2, 5), (true, 3, 4)] {
            let r = Recurrence {
                batch: 2,
                heads: 3,
                group,
                tokens,
                key_dim: 5,
                value_dim: 6,
                channelwise,
            };
            let rows = r.batch * r.heads * r.tokens;
            let q = noise(rows * r.group * r.key_dim, 1, -1.0, 1.0);
            let k = noise(rows * r.key_dim, 2, -1.0, 1.0);
            let v = noise(rows * r.value_dim, 3, -1.0, 1.0);
            let decay = noise(
                if channelwise { rows * r.key_dim } else { rows },
                4,
                0.0,
                1.0,
            );
            let beta = noise(rows, 5, 0.0, 1.0);
            let s0 = noise(r.batch * r.heads * r.state_len(), 6, -1.0, 1.0);
            let x = Inputs {
                query: &q,
                key: &k,
                value: &v,
                decay: &decay,
                beta: &beta,
                state: &s0,
            };
            let (want_out, want_state) = reference(&r, &x);
            let mut got_out = vec![0.0; want_out.len()];
            let mut got_state = vec![0.0; want_state.len()];
            for head in 0..r.batch * r.heads {
                let mut part = vec![f32::NAN; r.head_scratch_len()];
                run_head(&r, &x, head, &mut part);
                got_state[head * r.state_len()..][..r.state_len()]
                    .copy_from_slice(&part[..r.state_len()]);
                got_out[head * r.out_len()..][..r.out_len()]
                    .copy_from_slice(&part[r.state_len()..][..r.out_len()]);
            }
            for (g, w) in got_out
                .iter()
                .zip(&want_out)
                .chain(got_state.iter().zip(&want_state))
            {
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
            }
        }
    }
}
