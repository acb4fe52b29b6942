//! Batch norm over the batch's own statistics (f32): `_native_batch_norm_legit.out`
//! and `.no_stats_out`.
//!
//! Each channel's mean and biased variance over the batch and spatial dims are
//! computed in f64 (two passes), `invstd = 1 / sqrt(var + eps)`, and the output is
//! `((x - mean) * invstd) * weight + bias` in f32, as the official portable kernel
//! orders it; the `save_mean` and `save_invstd` outs are `[C]`. The official kernel
//! sums `x` and `x^2` in f32 and takes `E[x^2] - mean^2`, so its statistics may differ
//! in the last bits (and lose precision when the mean is large against the spread).
//!
//! `_native_batch_norm_legit.out` with `training=False` is the running-statistics
//! batch norm (`_native_batch_norm_legit_no_training`, with the same empty
//! `save_*` outs). With `training=True` it normalizes with the batch statistics and,
//! as PyTorch, updates the running statistics in place: `running = (1 - momentum)
//! running + momentum stat`, the variance unbiased (`n / (n - 1)`); the official
//! portable kernel refuses `training=True`.

use super::{f32_tensor, per_channel};
use crate::ops::layout::{NchwOut, read_nchw};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Registry, Tensor};

pub(super) fn register(r: &mut Registry) {
    r.register("aten::_native_batch_norm_legit.out", batch_norm_legit);
    r.register(
        "aten::_native_batch_norm_legit.no_stats_out",
        batch_norm_no_stats,
    );
}

op_args! {
    /// `_native_batch_norm_legit.out(Tensor input, Tensor? weight, Tensor? bias,
    /// Tensor(a!) running_mean, Tensor(b!) running_var, bool training, float momentum,
    /// float eps, *, Tensor(d!) out, Tensor(e!) save_mean, Tensor(f!) save_invstd)`.
    struct LegitArgs = "aten::_native_batch_norm_legit.out" {
        input: Tensor,
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        running_mean: Tensor,
        running_var: Tensor,
        training: bool,
        momentum: f64,
        eps: f64,
        out: OutArg,
        save_mean: OutArg,
        save_invstd: OutArg,
    } returns 0..=3
}

op_args! {
    /// `_native_batch_norm_legit.no_stats_out(Tensor input, Tensor? weight, Tensor?
    /// bias, bool training, float momentum, float eps, *, Tensor(a!) out, Tensor(b!)
    /// save_mean, Tensor(c!) save_invstd)`: always the batch statistics.
    struct NoStatsArgs = "aten::_native_batch_norm_legit.no_stats_out" {
        input: Tensor,
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
        out: OutArg,
        save_mean: OutArg,
        save_invstd: OutArg,
    } returns 0..=3
}

/// The running statistics to normalize with (`training=False`) or to update
/// (`training=True`), and the momentum.
struct Running {
    mean: Tensor,
    var: Tensor,
    training: bool,
    momentum: f64,
}

/// The operands both overloads share.
struct Operands {
    input: Tensor,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
    out: OutArg,
    save_mean: OutArg,
    save_invstd: OutArg,
}

/// Moves the operands both overloads share out of either overload's unpacked
/// arguments (`LegitArgs` or `NoStatsArgs`, which name them alike) into `Operands`.
macro_rules! shared_operands {
    ($args:ident) => {
        Operands {
            input: $args.input,
            weight: $args.weight,
            bias: $args.bias,
            eps: $args.eps,
            out: $args.out,
            save_mean: $args.save_mean,
            save_invstd: $args.save_invstd,
        }
    };
}

fn batch_norm_legit(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let args = LegitArgs::unpack(a)?;
    let running = Running {
        mean: args.running_mean,
        var: args.running_var,
        training: args.training,
        momentum: args.momentum,
    };
    batch_norm(ctx, a, shared_operands!(args), Some(running))
}

fn batch_norm_no_stats(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let args = NoStatsArgs::unpack(a)?;
    batch_norm(ctx, a, shared_operands!(args), None)
}

/// Checks the operands (f32, rank >= 2, per-channel weight, bias and running
/// statistics of `[C]`), resizes the outs and normalizes.
fn batch_norm(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    ops: Operands,
    running: Option<Running>,
) -> Result<(), KernelError> {
    let x = ops.input;
    f32_tensor(&x, "batch_norm input")?;
    if x.rank() < 2 {
        return Err(KernelError::invalid(format!(
            "batch_norm needs an input of rank >= 2, got {:?}",
            x.sizes()
        )));
    }
    let (n, c) = (x.sizes()[0], x.sizes()[1]);
    let inner: usize = x.sizes()[2..].iter().product();
    let per_channel_args = [
        (ops.weight, "batch_norm weight"),
        (ops.bias, "batch_norm bias"),
        (running.as_ref().map(|r| r.mean), "batch_norm running_mean"),
        (running.as_ref().map(|r| r.var), "batch_norm running_var"),
    ];
    for (t, what) in per_channel_args {
        if let Some(t) = t {
            per_channel(&t, c, what)?;
        }
    }
    let batch_stats = running.as_ref().is_none_or(|r| r.training);
    let out = ops.out.resize(a, x.sizes())?;
    let stat_len = if batch_stats { c } else { 0 };
    let save_mean = ops.save_mean.resize(a, &[stat_len])?;
    let save_invstd = ops.save_invstd.resize(a, &[stat_len])?;
    f32_tensor(&out, "batch_norm out")?;
    for t in [&save_mean, &save_invstd] {
        f32_tensor(t, "batch_norm save_mean/save_invstd")?;
    }
    let xs = read_nchw::<f32>(ctx, &x, "batch_norm input")?;
    let mut staged = NchwOut::<f32>::new(ctx, &out, "batch_norm out")?;
    let ys = staged.data();
    if xs.len() != n * c * inner || ys.len() != xs.len() {
        return Err(KernelError::invalid(
            "batch_norm: unexpected storage length",
        ));
    }
    // Per channel: the mean and invstd to normalize with.
    let mean = ctx.scratch::<f32>(c)?;
    let invstd = ctx.scratch::<f32>(c)?;
    let count = n * inner;
    if batch_stats {
        if count == 0 && c > 0 {
            return Err(KernelError::invalid(
                "batch_norm: no elements per channel to take statistics over",
            ));
        }
        let sm = ctx.write::<f32>(&save_mean)?;
        let si = ctx.write::<f32>(&save_invstd)?;
        let updates = match &running {
            Some(r) => Some((
                ctx.write::<f32>(&r.mean)?,
                ctx.write::<f32>(&r.var)?,
                r.momentum,
            )),
            None => None,
        };
        let mut updates = updates;
        for ch in 0..c {
            let planes = || (0..n).map(|b| &xs[(b * c + ch) * inner..][..inner]);
            let mu = planes().flatten().map(|&v| v as f64).sum::<f64>() / count as f64;
            let ss: f64 = planes()
                .flatten()
                .map(|&v| (v as f64 - mu) * (v as f64 - mu))
                .sum();
            let var = ss / count as f64;
            mean[ch] = mu as f32;
            invstd[ch] = (1.0 / (var + ops.eps).sqrt()) as f32;
            sm[ch] = mean[ch];
            si[ch] = invstd[ch];
            if let Some((rm, rv, momentum)) = updates.as_mut() {
                let unbiased = if count > 1 {
                    ss / (count - 1) as f64
                } else {
                    f64::NAN
                };
                rm[ch] = ((1.0 - *momentum) * rm[ch] as f64 + *momentum * mu) as f32;
                rv[ch] = ((1.0 - *momentum) * rv[ch] as f64 + *momentum * unbiased) as f32;
            }
        }
    } else if let Some(r) = &running {
        let (rm, rv) = (ctx.read::<f32>(&r.mean)?, ctx.read::<f32>(&r.var)?);
        for ch in 0..c {
            mean[ch] = rm[ch];
            invstd[ch] = (1.0 / (rv[ch] as f64 + ops.eps).sqrt()) as f32;
        }
    }
    let w = ops.weight.map(|t| ctx.read::<f32>(&t)).transpose()?;
    let b = ops.bias.map(|t| ctx.read::<f32>(&t)).transpose()?;
    for (p, (dst, src)) in ys
        .chunks_exact_mut(inner.max(1))
        .zip(xs.chunks_exact(inner.max(1)))
        .enumerate()
    {
        let ch = p % c;
        let (wv, bv) = (w.map_or(1.0, |w| w[ch]), b.map_or(0.0, |b| b[ch]));
        for (y, &v) in dst.iter_mut().zip(src) {
            *y = (v - mean[ch]) * invstd[ch] * wv + bv;
        }
    }
    staged.finish("batch_norm out")
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;

    use crate::testing::Harness;

    /// Batch statistics per channel of an `[n, c, inner]` tensor, in f64.
    fn stats(x: &[f32], n: usize, c: usize, inner: usize) -> Vec<(f64, f64)> {
        (0..c)
            .map(|ch| {
                let v: Vec<f64> = (0..n)
                    .flat_map(|b| x[(b * c + ch) * inner..][..inner].iter().map(|&v| v as f64))
                    .collect();
                let m = v.iter().sum::<f64>() / v.len() as f64;
                let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
                (m, var)
            })
            .collect()
    }

    fn close(got: &[f32], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!(
                (*g as f64 - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                "{got:?} {want:?}"
            );
        }
    }

    #[test]
    fn no_stats_normalizes_with_the_batch_statistics() {
        let (n, c, inner) = (2, 3, 4);
        let x: Vec<f32> = (0..n * c * inner)
            .map(|i| ((i * 7) % 11) as f32 * 0.5 - 2.0)
            .collect();
        let w = [1.5f32, -1.0, 0.5];
        let bias = [0.25f32, 0.0, -1.0];
        let mut h = Harness::new();
        let xt = h.tensor(&[n, c, 2, 2], &x);
        let (wt, bt) = (h.tensor(&[c], &w), h.tensor(&[c], &bias));
        let (t, mom, eps) = (h.bool(true), h.double(0.1), h.double(1e-5));
        let out = h.out(ScalarType::Float, &[n, c, 2, 2]);
        let (sm, si) = (
            h.out(ScalarType::Float, &[c]),
            h.out(ScalarType::Float, &[c]),
        );
        let list = h.tensor_list(&[out, sm, si]);
        let op = "aten::_native_batch_norm_legit.no_stats_out";
        h.call(op, &[xt, wt, bt, t, mom, eps, out, sm, si, list])
            .unwrap();
        let st = stats(&x, n, c, inner);
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let ch = (i / inner) % c;
                let (m, var) = st[ch];
                (v as f64 - m) / (var + 1e-5).sqrt() * w[ch] as f64 + bias[ch] as f64
            })
            .collect();
        close(&h.read::<f32>(out), &want);
        let means: Vec<f64> = st.iter().map(|s| s.0).collect();
        let invstd: Vec<f64> = st.iter().map(|s| 1.0 / (s.1 + 1e-5).sqrt()).collect();
        close(&h.read::<f32>(sm), &means);
        close(&h.read::<f32>(si), &invstd);
    }

    #[test]
    fn legit_updates_running_statistics_only_when_training() {
        let (n, c, inner) = (3, 2, 1);
        let x = [1.0f32, 10.0, 2.0, 20.0, 6.0, 60.0];
        let op = "aten::_native_batch_norm_legit.out";
        for training in [true, false] {
            let mut h = Harness::new();
            let xt = h.tensor(&[n, c], &x);
            let none = h.none();
            let rm = h.out(ScalarType::Float, &[c]);
            let rv = h.tensor(&[c], &[1.0f32, 4.0]);
            let (t, mom, eps) = (h.bool(training), h.double(0.25), h.double(0.0));
            let out = h.out(ScalarType::Float, &[n, c]);
            let (sm, si) = (
                h.out(ScalarType::Float, &[c]),
                h.out(ScalarType::Float, &[c]),
            );
            h.call(op, &[xt, none, none, rm, rv, t, mom, eps, out, sm, si])
                .unwrap();
            let st = stats(&x, n, c, inner);
            if training {
                // Channel 0: mean 3, biased var 14/3, unbiased 7.
                let means: Vec<f64> = st.iter().map(|s| 0.25 * s.0).collect();
                close(&h.read::<f32>(rm), &means);
                let vars: Vec<f64> = [1.0, 4.0]
                    .iter()
                    .zip(&st)
                    .map(|(r, s)| 0.75 * r + 0.25 * s.1 * 3.0 / 2.0)
                    .collect();
                close(&h.read::<f32>(rv), &vars);
                assert_eq!(h.tensor_meta(sm).sizes(), &[c]);
            } else {
                // Running mean 0, var [1, 4]: x / sqrt(var).
                let want: Vec<f64> = x
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| v as f64 / [1.0f64, 2.0][i % 2])
                    .collect();
                close(&h.read::<f32>(out), &want);
                assert_eq!(h.read::<f32>(rm), vec![0.0, 0.0]);
                assert_eq!(h.tensor_meta(sm).sizes(), &[0]);
            }
        }
    }

    #[test]
    fn bad_operands_are_refused() {
        let mut h = Harness::new();
        let x1 = h.tensor(&[4], &[1.0f32; 4]);
        let x = h.tensor(&[2, 2], &[1.0f32; 4]);
        let w3 = h.tensor(&[3], &[1.0f32; 3]);
        let xi = h.tensor(&[2, 2], &[1i32; 4]);
        let (none, t, mom, eps) = (h.none(), h.bool(true), h.double(0.1), h.double(1e-5));
        let out = h.out(ScalarType::Float, &[2, 2]);
        let (sm, si) = (
            h.out(ScalarType::Float, &[2]),
            h.out(ScalarType::Float, &[2]),
        );
        let op = "aten::_native_batch_norm_legit.no_stats_out";
        for args in [
            [x1, none, none, t, mom, eps, out, sm, si],
            [x, w3, none, t, mom, eps, out, sm, si],
            [xi, none, none, t, mom, eps, out, sm, si],
        ] {
            assert!(h.call(op, &args).is_err());
        }
        h.call(op, &[x, none, none, t, mom, eps, out, sm, si])
            .unwrap();
    }
}
