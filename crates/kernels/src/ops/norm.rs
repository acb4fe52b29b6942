//! `native_layer_norm`: normalises the trailing `normalized_shape` dims of each row,
//! `out = (x - mean) * rstd * weight + bias` with `rstd = 1 / sqrt(var + eps)` (biased
//! variance), and returns `mean` and `rstd` shaped like the input with the normalised
//! dims set to 1. Statistics are two-pass pairwise sums in f32 (f64 for f64).

use etch_base::ScalarType;

use super::elementwise::BLOCK;
use super::elementwise::dtype::{In, Out};
use super::elementwise::num::Num;
use super::reduce::{Pairwise, block_sum};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, GRAIN_SIZE, IntList, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::native_layer_norm.out", layer_norm);
}

op_args! {
    /// `native_layer_norm.out(Tensor input, SymInt[] normalized_shape, Tensor? weight,
    /// Tensor? bias, float eps, *, Tensor(a!) out0, Tensor(b!) out1, Tensor(c!) out2)`,
    /// returning the three outs (one TensorList slot).
    struct LayerNormArgs<'a> = "aten::native_layer_norm.out" {
        input: Tensor,
        normalized_shape: IntList<'a>,
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        eps: f64,
        out0: OutArg,
        out1: OutArg,
        out2: OutArg,
    } returns 1
}

fn layer_norm(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let LayerNormArgs {
        input: x,
        normalized_shape,
        weight,
        bias,
        eps,
        out0,
        out1,
        out2,
    } = LayerNormArgs::unpack(a)?;
    let mut nbuf = [0i64; MAX_RANK];
    let norm = normalized_shape.read_into(&mut nbuf)?;
    let k = norm.len();
    let rank = x.rank();
    if k == 0 || k > rank {
        return Err(KernelError::invalid(format!(
            "layer_norm: normalized_shape of {k} dims for an input of rank {rank}"
        )));
    }
    let axis = rank - k;
    for (i, &n) in norm.iter().enumerate() {
        if n < 0 || n as usize != x.sizes()[axis + i] {
            return Err(KernelError::invalid(format!(
                "layer_norm: normalized_shape {norm:?} does not match input {:?}",
                x.sizes()
            )));
        }
    }
    if !x.dtype().is_floating_point() {
        return Err(KernelError::UnsupportedDtype {
            dtype: x.dtype(),
            what: "layer_norm (floating point only)",
        });
    }
    if !x.is_contiguous() {
        return Err(KernelError::invalid("layer_norm: input must be contiguous"));
    }
    let cols: usize = x.sizes()[axis..].iter().product();
    let rows: usize = x.sizes()[..axis].iter().product();
    for t in [weight, bias].into_iter().flatten() {
        if t.sizes() != &x.sizes()[axis..] {
            return Err(KernelError::invalid(format!(
                "layer_norm: weight/bias of shape {:?}, expected {:?}",
                t.sizes(),
                &x.sizes()[axis..]
            )));
        }
        if !t.dtype().is_floating_point() {
            return Err(KernelError::UnsupportedDtype {
                dtype: t.dtype(),
                what: "layer_norm weight/bias",
            });
        }
    }
    let out = out0.resize(a, x.sizes())?;
    let mut sbuf = [1usize; MAX_RANK];
    sbuf[..axis].copy_from_slice(&x.sizes()[..axis]);
    let mean = out1.resize(a, &sbuf[..rank])?;
    let rstd = out2.resize(a, &sbuf[..rank])?;
    for t in [&out, &mean, &rstd] {
        if !t.dtype().is_floating_point() {
            return Err(KernelError::UnsupportedDtype {
                dtype: t.dtype(),
                what: "layer_norm outputs",
            });
        }
        if !t.is_contiguous() {
            return Err(KernelError::invalid(
                "layer_norm: outputs must be contiguous",
            ));
        }
    }
    let p = Params {
        x,
        weight,
        bias,
        eps,
        rows,
        cols,
    };
    if x.dtype() == ScalarType::Double {
        run::<f64>(ctx, &p, &out, &mean, &rstd)
    } else {
        run::<f32>(ctx, &p, &out, &mean, &rstd)
    }
}

struct Params {
    x: Tensor,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
    rows: usize,
    cols: usize,
}

fn run<A: Num>(
    ctx: &KernelContext<'_>,
    p: &Params,
    out: &Tensor,
    mean_t: &Tensor,
    rstd_t: &Tensor,
) -> Result<(), KernelError> {
    if p.rows == 0 {
        return Ok(());
    }
    let data = In::read(ctx, &p.x)?;
    let w = p.weight.map(|t| In::read(ctx, &t)).transpose()?;
    let b = p.bias.map(|t| In::read(ctx, &t)).transpose()?;
    // Statistics first (mean, rstd per row), into scratch.
    let stats = ctx.scratch::<A>(2 * p.rows)?;
    let eps = A::from_f64(p.eps);
    let cols = p.cols;
    let stat_row = |r: usize, s: &mut [A]| {
        let mut buf = [A::ZERO; BLOCK];
        let off = r * cols;
        let mut sum = Pairwise::new();
        let mut j = 0;
        while j < cols {
            let n = BLOCK.min(cols - j);
            data.load(off + j, 1, &mut buf[..n]);
            sum.push(block_sum(&buf[..n]));
            j += n;
        }
        let mean = if cols == 0 {
            A::ZERO
        } else {
            sum.total().div(A::from_i64(cols as i64))
        };
        let mut sq = Pairwise::new();
        j = 0;
        while j < cols {
            let n = BLOCK.min(cols - j);
            let blk = &mut buf[..n];
            data.load(off + j, 1, blk);
            for v in blk.iter_mut() {
                let d = v.sub(mean);
                *v = d.mul(d);
            }
            sq.push(block_sum(blk));
            j += n;
        }
        let var = if cols == 0 {
            A::ZERO
        } else {
            sq.total().div(A::from_i64(cols as i64))
        };
        s[0] = mean;
        s[1] = A::ONE.div(var.add(eps).sqrt());
    };
    let pool = ctx.pool();
    let parallel = pool.threads() > 1 && p.rows >= 2 && p.rows * cols >= GRAIN_SIZE;
    if parallel {
        pool.for_each_chunk_mut(stats, 2, 1, |r, s| stat_row(r, s));
    } else {
        for (r, s) in stats.chunks_mut(2).enumerate() {
            stat_row(r, s);
        }
    }
    let stats: &[A] = stats;
    // Then the normalised rows.
    let norm_rows = |row0: usize, part: &mut Out<'_>| {
        let mut xb = [A::ZERO; BLOCK];
        let mut wb = [A::ONE; BLOCK];
        let mut bb = [A::ZERO; BLOCK];
        let n_rows = part.len() / cols.max(1);
        for r in 0..n_rows {
            let (mean, rstd) = (stats[2 * (row0 + r)], stats[2 * (row0 + r) + 1]);
            let mut j = 0;
            while j < cols {
                let n = BLOCK.min(cols - j);
                data.load((row0 + r) * cols + j, 1, &mut xb[..n]);
                if let Some(w) = &w {
                    w.load(j, 1, &mut wb[..n]);
                }
                if let Some(b) = &b {
                    b.load(j, 1, &mut bb[..n]);
                }
                for i in 0..n {
                    xb[i] = xb[i].sub(mean).mul(rstd).mul(wb[i]).add(bb[i]);
                }
                part.store(r * cols + j, 1, &xb[..n]);
                j += n;
            }
        }
    };
    let mut dst = Out::write(ctx, out)?;
    if dst.len() != p.rows * cols || data.len() != p.rows * cols {
        return Err(KernelError::invalid(
            "layer_norm: unexpected storage length",
        ));
    }
    if cols > 0 {
        if parallel {
            let rows_per = p.rows.div_ceil(pool.threads() * 4).max(1);
            dst.par_chunks(pool, rows_per * cols, &|start, mut part| {
                norm_rows(start / cols, &mut part)
            });
        } else {
            norm_rows(0, &mut dst);
        }
    }
    let mut m = Out::write(ctx, mean_t)?;
    let mut s = Out::write(ctx, rstd_t)?;
    if m.len() != p.rows || s.len() != p.rows {
        return Err(KernelError::invalid("layer_norm: unexpected stats length"));
    }
    for r in 0..p.rows {
        m.set(r, stats[2 * r]);
        s.set(r, stats[2 * r + 1]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ops::elementwise::testutil::{Lcg, assert_close, harness, read, tensor};
    use crate::testing::Harness;

    fn reference(
        vals: &[f64],
        rows: usize,
        cols: usize,
        w: Option<&[f64]>,
        b: Option<&[f64]>,
        eps: f64,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut out = vec![0.0; vals.len()];
        let mut means = vec![0.0; rows];
        let mut rstds = vec![0.0; rows];
        for r in 0..rows {
            let row = &vals[r * cols..(r + 1) * cols];
            let m = row.iter().sum::<f64>() / cols as f64;
            let v = row.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / cols as f64;
            let rs = 1.0 / (v + eps).sqrt();
            means[r] = m;
            rstds[r] = rs;
            for c in 0..cols {
                let wv = w.map_or(1.0, |w| w[c]);
                let bv = b.map_or(0.0, |b| b[c]);
                out[r * cols + c] = (row[c] - m) * rs * wv + bv;
            }
        }
        (out, means, rstds)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn matches_reference(lead in proptest::collection::vec(0usize..4, 0..3), tail in proptest::collection::vec(1usize..6, 1..3), affine in 0usize..4, seed in any::<u64>(), threads in 1usize..=2) {
            let mut shape = lead.clone();
            shape.extend(&tail);
            let rows: usize = lead.iter().product();
            let cols: usize = tail.iter().product();
            let mut rng = Lcg(seed);
            let vals: Vec<f64> = rng.vec(rows * cols, 3.0).into_iter().map(|v| v as f32 as f64).collect();
            let wv: Vec<f64> = rng.vec(cols, 2.0).into_iter().map(|v| v as f32 as f64).collect();
            let bv: Vec<f64> = rng.vec(cols, 2.0).into_iter().map(|v| v as f32 as f64).collect();
            let mut h = harness(threads);
            let x = tensor(&mut h, ScalarType::Float, &shape, &vals);
            let ns: Vec<i64> = tail.iter().map(|&s| s as i64).collect();
            let norm = h.int_list(&ns);
            let w = if affine & 1 == 1 { tensor(&mut h, ScalarType::Float, &tail, &wv) } else { h.none() };
            let b = if affine & 2 == 2 { tensor(&mut h, ScalarType::Float, &tail, &bv) } else { h.none() };
            let eps = h.double(1e-5);
            let mut sshape = lead.clone();
            sshape.extend(tail.iter().map(|_| 1));
            let o0 = h.out(ScalarType::Float, &shape);
            let o1 = h.out(ScalarType::Float, &sshape);
            let o2 = h.out(ScalarType::Float, &sshape);
            let list = h.tensor_list(&[o0, o1, o2]);
            h.call("aten::native_layer_norm.out", &[x, norm, w, b, eps, o0, o1, o2, list]).unwrap();
            let (want, m, r) = reference(&vals, rows, cols, (affine & 1 == 1).then_some(&wv[..]), (affine & 2 == 2).then_some(&bv[..]), 1e-5);
            assert_close(&read(&mut h, o0), &want, 2e-5, 2e-5);
            assert_close(&read(&mut h, o1), &m, 1e-5, 1e-6);
            assert_close(&read(&mut h, o2), &r, 1e-5, 1e-5);
            prop_assert_eq!(h.tensor_meta(o1).sizes().to_vec(), sshape.clone());
        }
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut h = Harness::new();
        let x = tensor(&mut h, ScalarType::Float, &[2, 3], &[0.0; 6]);
        let bad = h.int_list(&[2]);
        let none = h.none();
        let eps = h.double(1e-5);
        let o0 = h.out(ScalarType::Float, &[2, 3]);
        let o1 = h.out(ScalarType::Float, &[2, 1]);
        let o2 = h.out(ScalarType::Float, &[2, 1]);
        let list = h.tensor_list(&[o0, o1, o2]);
        assert!(
            h.call(
                "aten::native_layer_norm.out",
                &[x, bad, none, none, eps, o0, o1, o2, list]
            )
            .is_err()
        );
        let norm = h.int_list(&[3]);
        let w = tensor(&mut h, ScalarType::Float, &[2], &[1.0, 1.0]);
        assert!(
            h.call(
                "aten::native_layer_norm.out",
                &[x, norm, w, none, eps, o0, o1, o2, list]
            )
            .is_err()
        );
        assert!(
            h.call(
                "aten::native_layer_norm.out",
                &[x, norm, none, none, eps, o0, o1, o2]
            )
            .is_err()
        );
        let empty = h.int_list(&[]);
        assert!(
            h.call(
                "aten::native_layer_norm.out",
                &[x, empty, none, none, eps, o0, o1, o2, list]
            )
            .is_err()
        );
        let i = tensor(&mut h, ScalarType::Int, &[2, 3], &[0.0; 6]);
        assert!(
            h.call(
                "aten::native_layer_norm.out",
                &[i, norm, none, none, eps, o0, o1, o2, list]
            )
            .is_err()
        );
        h.call(
            "aten::native_layer_norm.out",
            &[x, norm, none, none, eps, o0, o1, o2, list],
        )
        .unwrap();
    }
}
