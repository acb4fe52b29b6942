//! Normalisations over the channel dim of `[N, C, *]` tensors (f32):
//!
//! * `_native_batch_norm_legit_no_training`: inference batch norm with running
//!   statistics, `out = (x - mean[c]) * invstd[c] * weight[c] + bias[c]` with
//!   `invstd = 1 / sqrt(var + eps)` computed in f64 and rounded once, as ExecuTorch's
//!   portable kernel; the mean/invstd outputs are resized to `[0]`.
//! * `native_group_norm`: statistics of each (image, group) block of `C / group`
//!   channels (two-pass, in f64), `mean` and `rstd` of shape `[N, group]`.
//!
//! * `_native_batch_norm_legit` (`.out`, `.no_stats_out`): batch norm over the
//!   batch's own statistics, in `channel_norm/batch_stats.rs`.
//!
//! 4-d inputs and outputs may be channels-last (see [`super::layout`]).

mod batch_stats;

use etch_base::ScalarType;

use super::layout::{NchwOut, read_nchw, require_nchw_or_channels_last};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, GRAIN_SIZE, KernelContext, KernelError, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register(
        "aten::_native_batch_norm_legit_no_training.out",
        batch_norm_no_training,
    );
    r.register("aten::native_group_norm.out", group_norm);
    batch_stats::register(r);
}

fn f32_tensor(t: &Tensor, what: &'static str) -> Result<(), KernelError> {
    if t.dtype() != ScalarType::Float {
        return Err(KernelError::UnsupportedDtype {
            dtype: t.dtype(),
            what,
        });
    }
    require_nchw_or_channels_last(t, what)
}

/// Fails unless `t` is a 1-d tensor of `c` values.
fn per_channel(t: &Tensor, c: usize, what: &'static str) -> Result<(), KernelError> {
    f32_tensor(t, what)?;
    if t.sizes() != [c] {
        return Err(KernelError::invalid(format!(
            "{what}: shape {:?}, expected [{c}]",
            t.sizes()
        )));
    }
    Ok(())
}

op_args! {
    /// `_native_batch_norm_legit_no_training.out(Tensor input, Tensor? weight,
    /// Tensor? bias, Tensor running_mean, Tensor running_var, float momentum,
    /// float eps, *, Tensor(a!) out0, Tensor(b!) out1, Tensor(c!) out2)`, returning the
    /// three outs (one TensorList slot).
    struct BatchNormArgs = "aten::_native_batch_norm_legit_no_training.out" {
        input: Tensor,
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        running_mean: Tensor,
        running_var: Tensor,
        momentum: f64,
        eps: f64,
        out0: OutArg,
        out1: OutArg,
        out2: OutArg,
    } returns 1
}

fn batch_norm_no_training(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let BatchNormArgs {
        input: x,
        weight,
        bias,
        running_mean: mean,
        running_var: var,
        eps,
        out0,
        out1,
        out2,
        ..
    } = BatchNormArgs::unpack(a)?;
    f32_tensor(&x, "batch_norm input")?;
    let c = if x.rank() >= 2 {
        x.sizes()[1]
    } else if x.rank() == 1 {
        x.sizes()[0]
    } else {
        return Err(KernelError::invalid("batch_norm: input of rank 0"));
    };
    for (t, what) in [
        (Some(mean), "batch_norm running_mean"),
        (Some(var), "batch_norm running_var"),
        (weight, "batch_norm weight"),
        (bias, "batch_norm bias"),
    ] {
        if let Some(t) = t {
            per_channel(&t, c, what)?;
        }
    }
    let out = out0.resize(a, x.sizes())?;
    out1.resize(a, &[0])?;
    out2.resize(a, &[0])?;
    f32_tensor(&out, "batch_norm out")?;
    let outer = if x.rank() >= 2 { x.sizes()[0] } else { 1 };
    let inner: usize = x.sizes().iter().skip(2).product();
    let xs = read_nchw::<f32>(ctx, &x, "batch_norm input")?;
    let m = ctx.read::<f32>(&mean)?;
    let v = ctx.read::<f32>(&var)?;
    let w = weight.map(|t| ctx.read::<f32>(&t)).transpose()?;
    let b = bias.map(|t| ctx.read::<f32>(&t)).transpose()?;
    let mut staged = NchwOut::<f32>::new(ctx, &out, "batch_norm out")?;
    let os = staged.data();
    if xs.len() != outer * c * inner || os.len() != xs.len() {
        return Err(KernelError::invalid(
            "batch_norm: unexpected storage length",
        ));
    }
    if xs.is_empty() {
        return Ok(());
    }
    let inner = inner.max(1);
    let plane = |idx: usize, o: &mut [f32]| {
        let ch = idx % c;
        let invstd = (1.0 / (v[ch] as f64 + eps).sqrt()) as f32;
        let scale = invstd * w.map_or(1.0, |w| w[ch]);
        let shift = b.map_or(0.0, |b| b[ch]);
        let mu = m[ch];
        let src = &xs[idx * inner..(idx + 1) * inner];
        for (y, &x) in o.iter_mut().zip(src) {
            *y = (x - mu) * scale + shift;
        }
    };
    let min_planes = (GRAIN_SIZE / inner).max(1);
    ctx.pool().for_each_chunk_mut(os, inner, min_planes, plane);
    staged.finish("batch_norm out")
}

op_args! {
    /// `native_group_norm.out(Tensor input, Tensor? weight, Tensor? bias, SymInt N,
    /// SymInt C, SymInt HxW, int group, float eps, *, Tensor(a!) out0,
    /// Tensor(b!) out1, Tensor(c!) out2)`, returning the three outs (one TensorList
    /// slot).
    struct GroupNormArgs = "aten::native_group_norm.out" {
        input: Tensor,
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        n: i64,
        c: i64,
        hxw: i64,
        group: i64,
        eps: f64,
        out0: OutArg,
        out1: OutArg,
        out2: OutArg,
    } returns 1
}

fn group_norm(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let GroupNormArgs {
        input: x,
        weight,
        bias,
        n,
        c,
        hxw,
        group,
        eps,
        out0,
        out1,
        out2,
    } = GroupNormArgs::unpack(a)?;
    let dim = |v: i64, what: &str| -> Result<usize, KernelError> {
        usize::try_from(v).map_err(|_| KernelError::invalid(format!("group_norm: {what} {v}")))
    };
    let (n, c, hw, groups) = (
        dim(n, "N")?,
        dim(c, "C")?,
        dim(hxw, "HxW")?,
        dim(group, "group")?,
    );
    f32_tensor(&x, "group_norm input (f32, contiguous)")?;
    if groups == 0 || c % groups != 0 {
        return Err(KernelError::invalid(format!(
            "group_norm: {c} channels do not split into {groups} groups"
        )));
    }
    if x.rank() < 2 || x.sizes()[0] != n || x.sizes()[1] != c || x.numel() != n * c * hw {
        return Err(KernelError::invalid(format!(
            "group_norm: input {:?} is not N={n} x C={c} x HxW={hw}",
            x.sizes()
        )));
    }
    for (t, what) in [(weight, "group_norm weight"), (bias, "group_norm bias")] {
        if let Some(t) = t {
            per_channel(&t, c, what)?;
        }
    }
    let out = out0.resize(a, x.sizes())?;
    let mean_t = out1.resize(a, &[n, groups])?;
    let rstd_t = out2.resize(a, &[n, groups])?;
    for (t, what) in [
        (&out, "group_norm out"),
        (&mean_t, "group_norm mean"),
        (&rstd_t, "group_norm rstd"),
    ] {
        f32_tensor(t, what)?;
    }
    let xs = read_nchw::<f32>(ctx, &x, "group_norm input")?;
    let w = weight.map(|t| ctx.read::<f32>(&t)).transpose()?;
    let b = bias.map(|t| ctx.read::<f32>(&t)).transpose()?;
    let mut staged = NchwOut::<f32>::new(ctx, &out, "group_norm out")?;
    let os = staged.data();
    let block = (c / groups) * hw;
    let lead = n * groups;
    // Statistics per (image, group): mean, rstd.
    let stats = ctx.scratch::<f64>(2 * lead)?;
    let stat = |i: usize, s: &mut [f64]| {
        let blk = &xs[i * block..(i + 1) * block];
        if blk.is_empty() {
            s[0] = 0.0;
            s[1] = f64::NAN;
            return;
        }
        let mean = blk.iter().map(|&v| v as f64).sum::<f64>() / block as f64;
        let var = blk.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / block as f64;
        s[0] = mean;
        s[1] = 1.0 / (var + eps).sqrt();
    };
    let pool = ctx.pool();
    let min_blocks = (GRAIN_SIZE / block.max(1)).max(1);
    pool.for_each_chunk_mut(stats, 2, min_blocks, stat);
    let stats: &[f64] = stats;
    if hw > 0 {
        let per = c / groups;
        let channel = |idx: usize, o: &mut [f32]| {
            let (img, ch) = (idx / c, idx % c);
            let i = img * groups + ch / per;
            let (mean, rstd) = (stats[2 * i], stats[2 * i + 1]);
            let scale = rstd * w.map_or(1.0, |w| w[ch] as f64);
            let shift = b.map_or(0.0, |b| b[ch] as f64) - scale * mean;
            for (y, &x) in o.iter_mut().zip(&xs[idx * hw..(idx + 1) * hw]) {
                *y = (scale * x as f64 + shift) as f32;
            }
        };
        pool.for_each_chunk_mut(&mut os[..n * c * hw], hw, (GRAIN_SIZE / hw).max(1), channel);
    }
    let ms = ctx.write::<f32>(&mean_t)?;
    let rs = ctx.write::<f32>(&rstd_t)?;
    for i in 0..lead.min(ms.len()).min(rs.len()) {
        ms[i] = stats[2 * i] as f32;
        rs[i] = stats[2 * i + 1] as f32;
    }
    staged.finish("group_norm out")
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ops::elementwise::testutil::{Lcg, assert_close, harness, read, tensor};
    use crate::testing::Harness;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn batch_norm_matches_reference(n in 1usize..3, c in 1usize..6, spatial in proptest::collection::vec(1usize..5, 0..3), affine in 0usize..4, seed in any::<u64>(), threads in 1usize..=2) {
            let mut shape = vec![n, c];
            shape.extend(&spatial);
            let inner: usize = spatial.iter().product();
            let mut rng = Lcg(seed);
            let f = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|x| x as f32 as f64).collect() };
            let x = f(rng.vec(n * c * inner, 3.0));
            let mean = f(rng.vec(c, 1.0));
            let var: Vec<f64> = f(rng.vec(c, 1.0)).into_iter().map(|v| v.abs() + 0.1).collect();
            let w = f(rng.vec(c, 2.0));
            let b = f(rng.vec(c, 2.0));
            let mut h = harness(threads);
            let xt = tensor(&mut h, ScalarType::Float, &shape, &x);
            let wt = if affine & 1 == 1 { tensor(&mut h, ScalarType::Float, &[c], &w) } else { h.none() };
            let bt = if affine & 2 == 2 { tensor(&mut h, ScalarType::Float, &[c], &b) } else { h.none() };
            let mt = tensor(&mut h, ScalarType::Float, &[c], &mean);
            let vt = tensor(&mut h, ScalarType::Float, &[c], &var);
            let mom = h.double(0.1);
            let eps = h.double(1e-5);
            let o0 = h.out(ScalarType::Float, &shape);
            let o1 = h.out(ScalarType::Float, &[0]);
            let o2 = h.out(ScalarType::Float, &[0]);
            let list = h.tensor_list(&[o0, o1, o2]);
            h.call("aten::_native_batch_norm_legit_no_training.out", &[xt, wt, bt, mt, vt, mom, eps, o0, o1, o2, list]).unwrap();
            let mut want = vec![0.0; x.len()];
            for (i, y) in want.iter_mut().enumerate() {
                let ch = (i / inner) % c;
                let wv = if affine & 1 == 1 { w[ch] } else { 1.0 };
                let bv = if affine & 2 == 2 { b[ch] } else { 0.0 };
                *y = (x[i] - mean[ch]) / (var[ch] + 1e-5).sqrt() * wv + bv;
            }
            assert_close(&read(&mut h, o0), &want, 1e-5, 1e-5);
            prop_assert_eq!(h.tensor_meta(o1).sizes().to_vec(), vec![0]);
        }

        #[test]
        fn group_norm_matches_reference(n in 1usize..3, groups in 1usize..4, per in 1usize..4, hw in 1usize..7, affine in 0usize..4, seed in any::<u64>(), threads in 1usize..=2) {
            let c = groups * per;
            let mut rng = Lcg(seed);
            let f = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|x| x as f32 as f64).collect() };
            let x = f(rng.vec(n * c * hw, 3.0));
            let w = f(rng.vec(c, 2.0));
            let b = f(rng.vec(c, 2.0));
            let mut h = harness(threads);
            let xt = tensor(&mut h, ScalarType::Float, &[n, c, hw], &x);
            let wt = if affine & 1 == 1 { tensor(&mut h, ScalarType::Float, &[c], &w) } else { h.none() };
            let bt = if affine & 2 == 2 { tensor(&mut h, ScalarType::Float, &[c], &b) } else { h.none() };
            let (ni, ci, hwi, gi) = (h.int(n as i64), h.int(c as i64), h.int(hw as i64), h.int(groups as i64));
            let eps = h.double(1e-5);
            let o0 = h.out(ScalarType::Float, &[n, c, hw]);
            let o1 = h.out(ScalarType::Float, &[n, groups]);
            let o2 = h.out(ScalarType::Float, &[n, groups]);
            let list = h.tensor_list(&[o0, o1, o2]);
            h.call("aten::native_group_norm.out", &[xt, wt, bt, ni, ci, hwi, gi, eps, o0, o1, o2, list]).unwrap();
            let block = per * hw;
            let mut want = vec![0.0; x.len()];
            let mut means = vec![0.0; n * groups];
            let mut rstds = vec![0.0; n * groups];
            for i in 0..n * groups {
                let blk = &x[i * block..(i + 1) * block];
                let m = blk.iter().sum::<f64>() / block as f64;
                let v = blk.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / block as f64;
                let r = 1.0 / (v + 1e-5).sqrt();
                means[i] = m;
                rstds[i] = r;
                for j in 0..block {
                    let ch = (i % groups) * per + j / hw;
                    let wv = if affine & 1 == 1 { w[ch] } else { 1.0 };
                    let bv = if affine & 2 == 2 { b[ch] } else { 0.0 };
                    want[i * block + j] = (blk[j] - m) * r * wv + bv;
                }
            }
            assert_close(&read(&mut h, o0), &want, 1e-5, 1e-5);
            assert_close(&read(&mut h, o1), &means, 1e-5, 1e-6);
            assert_close(&read(&mut h, o2), &rstds, 1e-5, 1e-5);
        }
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut h = Harness::new();
        let x = tensor(&mut h, ScalarType::Float, &[1, 2, 3], &[0.0; 6]);
        let c3 = tensor(&mut h, ScalarType::Float, &[3], &[1.0; 3]);
        let c2 = tensor(&mut h, ScalarType::Float, &[2], &[1.0; 2]);
        let none = h.none();
        let d = h.double(1e-5);
        let o0 = h.out(ScalarType::Float, &[1, 2, 3]);
        let o1 = h.out(ScalarType::Float, &[0]);
        let o2 = h.out(ScalarType::Float, &[0]);
        let bn = "aten::_native_batch_norm_legit_no_training.out";
        let l = h.tensor_list(&[o0, o1, o2]);
        assert!(
            h.call(bn, &[x, none, none, c2, c2, d, d, o0, o1, o2, l])
                .is_ok()
        );
        assert!(
            h.call(bn, &[x, none, none, c3, c2, d, d, o0, o1, o2, l])
                .is_err()
        );
        assert!(
            h.call(bn, &[x, c3, none, c2, c2, d, d, o0, o1, o2, l])
                .is_err()
        );
        assert!(
            h.call(bn, &[x, none, none, c2, c2, d, d, o0, o1, o2])
                .is_err()
        );
        let (one, two, three) = (h.int(1), h.int(2), h.int(3));
        let g1 = h.out(ScalarType::Float, &[1, 2]);
        let g2 = h.out(ScalarType::Float, &[1, 2]);
        let gn = "aten::native_group_norm.out";
        let gl = h.tensor_list(&[o0, g1, g2]);
        assert!(
            h.call(
                gn,
                &[x, none, none, one, two, three, two, d, o0, g1, g2, gl]
            )
            .is_ok()
        );
        assert!(
            h.call(
                gn,
                &[x, none, none, one, two, three, three, d, o0, g1, g2, gl]
            )
            .is_err()
        );
        assert!(
            h.call(
                gn,
                &[x, none, none, one, three, three, one, d, o0, g1, g2, gl]
            )
            .is_err()
        );
    }
}
