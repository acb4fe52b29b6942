//! Padding of the trailing dims of a tensor (any dtype), with
//! `pad = [last_before, last_after, second_last_before, ...]`, every amount
//! non-negative (as ExecuTorch's portable kernels require):
//!
//! * `constant_pad_nd`: a constant fills the border;
//! * `reflection_pad{1,2,3}d`: the border mirrors the input without repeating its edge
//!   (each amount smaller than the dim);
//! * `replication_pad{1,2,3}d`: the border repeats the input's edge element.

use super::elementwise::dtype::{is_supported, unsupported, with_elem};
use super::layout::{NchwOut, read_nchw, require_nchw_or_channels_last};
use super::shape::common::{
    checked_numel, for_rows, require_copy_pair, with_bits_type, worth_parallel,
};
use crate::ops::same_dtype;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor};
use etch_base::Element;

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::constant_pad_nd.out", constant_pad_nd);
    r.register("aten::reflection_pad1d.out", |c, a| {
        edge_pad(c, a, 1, Edge::Reflect)
    });
    r.register("aten::reflection_pad2d.out", |c, a| {
        edge_pad(c, a, 2, Edge::Reflect)
    });
    r.register("aten::reflection_pad3d.out", |c, a| {
        edge_pad(c, a, 3, Edge::Reflect)
    });
    r.register("aten::replication_pad1d.out", |c, a| {
        edge_pad(c, a, 1, Edge::Replicate)
    });
    r.register("aten::replication_pad2d.out", |c, a| {
        edge_pad(c, a, 2, Edge::Replicate)
    });
    r.register("aten::replication_pad3d.out", |c, a| {
        edge_pad(c, a, 3, Edge::Replicate)
    });
}

/// How a border element is taken from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    /// Mirrored about the edge element (`[a b c]` padded by 2: `c b [a b c] b a`).
    Reflect,
    /// The edge element repeated (`a a [a b c] c c`).
    Replicate,
}

impl Edge {
    /// The input index of out index `o` along a dim of `size` (> 0) padded by
    /// `before` (checked: for `Reflect` every amount is below `size`).
    #[inline(always)]
    fn source(self, o: usize, before: usize, size: usize) -> usize {
        if o < before {
            match self {
                Edge::Reflect => before - o,
                Edge::Replicate => 0,
            }
        } else if o - before < size {
            o - before
        } else {
            let past = o - before - (size - 1);
            match self {
                Edge::Reflect => size - 1 - past,
                Edge::Replicate => size - 1,
            }
        }
    }
}

op_args! {
    /// `reflection_padNd.out(Tensor self, SymInt[2N] padding, *, Tensor(a!) out)` (and
    /// `replication_padNd`), N = 1, 2 or 3.
    struct EdgePadArgs<'a> = "aten::<reflection|replication>_pad<1|2|3>d.out" {
        input: Tensor,
        padding: IntList<'a>,
        out: OutArg,
    } returns 1
}

/// `reflection_pad{k}d` or `replication_pad{k}d`: pads the last `k` dims of a tensor
/// of rank `k + 1` or `k + 2` (contiguous) by mirroring or repeating its edges.
fn edge_pad(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    k: usize,
    edge: Edge,
) -> Result<(), KernelError> {
    let EdgePadArgs {
        input: x,
        padding,
        out,
    } = EdgePadArgs::unpack(a)?;
    let what = match edge {
        Edge::Reflect => "reflection pad",
        Edge::Replicate => "replication pad",
    };
    let rank = x.rank();
    if rank != k + 1 && rank != k + 2 {
        return Err(KernelError::invalid(format!(
            "{what} of {k} dims: input of rank {rank} (expected {} or {})",
            k + 1,
            k + 2
        )));
    }
    let mut pbuf = [0i64; 6];
    if padding.len() != 2 * k {
        return Err(KernelError::invalid(format!(
            "{what} of {k} dims: {} padding values (expected {})",
            padding.len(),
            2 * k
        )));
    }
    let pad = padding.read_into(&mut pbuf)?;
    let mut before = [0usize; MAX_RANK];
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(x.sizes());
    for (i, pair) in pad.chunks_exact(2).enumerate() {
        let d = rank - 1 - i;
        let n = sizes[d];
        let (b, e) = (pair[0], pair[1]);
        if b < 0 || e < 0 {
            return Err(KernelError::invalid(format!(
                "{what}: padding must be non-negative, got {pad:?}"
            )));
        }
        if n == 0 {
            return Err(KernelError::invalid(format!(
                "{what}: padded dim {d} is empty"
            )));
        }
        if edge == Edge::Reflect && (b as u64 >= n as u64 || e as u64 >= n as u64) {
            return Err(KernelError::invalid(format!(
                "{what}: padding ({b}, {e}) must be below the size {n} of dim {d}"
            )));
        }
        before[d] = b as usize;
        sizes[d] = usize::try_from(b)
            .ok()
            .zip(usize::try_from(e).ok())
            .and_then(|(b, e)| n.checked_add(b)?.checked_add(e))
            .ok_or_else(|| KernelError::invalid(format!("{what}: padded size overflows")))?;
    }
    require_copy_pair(&x, &out.tensor())?;
    let out = out.resize(a, &sizes[..rank])?;
    require_copy_pair(&x, &out)?;
    let numel = checked_numel(&sizes[..rank])?;
    if numel == 0 {
        return Ok(());
    }
    with_bits_type!(x.dtype().element_size(), T => {
        let src = ctx.read_raw::<T>(&x)?;
        let dst = ctx.write_raw::<T>(&out)?;
        if src.len() < x.numel() || dst.len() < numel {
            return Err(KernelError::invalid(format!("{what}: tensor storage is too small")));
        }
        edge_copy(ctx, src, dst, x.sizes(), &sizes[..rank], &before[..rank], edge);
        Ok(())
    })
}

/// Fills `dst` (contiguous, `out_sizes`) from `src` (contiguous, `in_sizes`), row by
/// row along the last dim, each index mapped by `edge`.
fn edge_copy<T: Copy + Send + Sync>(
    ctx: &KernelContext<'_>,
    src: &[T],
    dst: &mut [T],
    in_sizes: &[usize],
    out_sizes: &[usize],
    before: &[usize],
    edge: Edge,
) {
    let rank = in_sizes.len();
    let mut in_strides = [1usize; MAX_RANK];
    for d in (0..rank - 1).rev() {
        in_strides[d] = in_strides[d + 1] * in_sizes[d + 1];
    }
    let last = rank - 1;
    let (w, ow, b) = (in_sizes[last], out_sizes[last], before[last]);
    let rows = dst.len().min(checked_numel(out_sizes).unwrap_or(0)) / ow;
    let run = |first_row: usize, chunk: &mut [T]| {
        for (r, row) in chunk.chunks_exact_mut(ow).enumerate() {
            // The input row this out row reads.
            let mut rem = first_row + r;
            let mut base = 0;
            for d in (0..last).rev() {
                let o = rem % out_sizes[d];
                rem /= out_sizes[d];
                base += edge.source(o, before[d], in_sizes[d]) * in_strides[d];
            }
            let line = &src[base..base + w];
            row[b..b + w].copy_from_slice(line);
            for o in (0..b).chain(b + w..ow) {
                row[o] = line[edge.source(o, b, w)];
            }
        }
    };
    let parallel = worth_parallel(rows, rows * ow);
    for_rows(ctx.pool(), dst, ow, rows, 8, parallel, run);
}

op_args! {
    /// `constant_pad_nd.out(Tensor self, SymInt[] pad, Scalar value=0, *,
    /// Tensor(a!) out)`.
    struct ConstantPadArgs<'a> = "aten::constant_pad_nd.out" {
        input: Tensor,
        pad: IntList<'a>,
        value: Scalar,
        out: OutArg,
    } returns 1
}

fn constant_pad_nd(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let ConstantPadArgs {
        input: x,
        pad,
        value,
        out,
    } = ConstantPadArgs::unpack(a)?;
    let mut pbuf = [0i64; 2 * MAX_RANK];
    let pad = pad.read_into(&mut pbuf)?;
    let rank = x.rank();
    if pad.len() % 2 != 0 || pad.len() / 2 > rank {
        return Err(KernelError::invalid(format!(
            "constant_pad_nd: {} pad values for a rank-{rank} tensor",
            pad.len()
        )));
    }
    if let Some(p) = pad.iter().find(|&&p| p < 0) {
        return Err(KernelError::invalid(format!(
            "constant_pad_nd: pad values must be non-negative, got {p}"
        )));
    }
    if !is_supported(x.dtype()) {
        return Err(unsupported(x.dtype(), "constant_pad_nd"));
    }
    // before[d], after[d] per dim.
    let mut before = [0usize; MAX_RANK];
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(x.sizes());
    for (i, pair) in pad.chunks_exact(2).enumerate() {
        let d = rank - 1 - i;
        before[d] = pair[0] as usize;
        sizes[d] = sizes[d]
            .checked_add(pair[0] as usize)
            .and_then(|s| s.checked_add(pair[1] as usize))
            .ok_or_else(|| KernelError::invalid("constant_pad_nd: padded size overflows"))?;
    }
    let out = out.resize(a, &sizes[..rank])?;
    same_dtype(&x, &out)?;
    require_nchw_or_channels_last(&x, "constant_pad_nd input")?;
    require_nchw_or_channels_last(&out, "constant_pad_nd out")?;
    with_elem!(
        x.dtype(),
        E => copy_padded::<E>(ctx, &x, &out, value.cast::<E>(), &before[..rank]),
        Err(unsupported(x.dtype(), "constant_pad_nd"))
    )
}

/// Fills `out` with `value` and copies `x` into it, shifted by `before` per dim (in
/// row-major logical order; channels-last tensors pass through NCHW scratch).
fn copy_padded<E: Element>(
    ctx: &KernelContext<'_>,
    x: &Tensor,
    out: &Tensor,
    value: E,
    before: &[usize],
) -> Result<(), KernelError> {
    let src = read_nchw::<E>(ctx, x, "constant_pad_nd input")?;
    let mut staged = NchwOut::<E>::new(ctx, out, "constant_pad_nd out")?;
    let dst = staged.data();
    dst.fill(value);
    let rank = x.rank();
    if x.numel() == 0 {
        return staged.finish("constant_pad_nd out");
    }
    if rank == 0 {
        dst[0] = src[0];
        return staged.finish("constant_pad_nd out");
    }
    let row = x.sizes()[rank - 1];
    // Row-major strides of out's logical sizes.
    let mut out_strides = [1usize; MAX_RANK];
    for d in (0..rank - 1).rev() {
        out_strides[d] = out_strides[d + 1] * out.sizes()[d + 1];
    }
    for (r, chunk) in src.chunks_exact(row).enumerate() {
        // Coordinates of input row r over dims 0..rank-1, shifted by the padding.
        let mut rem = r;
        let mut at = before[rank - 1];
        for d in (0..rank - 1).rev() {
            let c = rem % x.sizes()[d];
            rem /= x.sizes()[d];
            at += (c + before[d]) * out_strides[d];
        }
        dst[at..at + row].copy_from_slice(chunk);
    }
    staged.finish("constant_pad_nd out")
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ops::elementwise::testutil::{Lcg, assert_close, read, tensor};
    use crate::testing::Harness;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn matches_reference(shape in proptest::collection::vec(1usize..4, 1..4), pads in proptest::collection::vec(0usize..3, 0..7), int in any::<bool>(), seed in any::<u64>()) {
            let rank = shape.len();
            let pads: Vec<usize> = pads.into_iter().take(2 * rank).collect();
            let pads = &pads[..pads.len() / 2 * 2];
            let dtype = if int { ScalarType::Int } else { ScalarType::Float };
            let n: usize = shape.iter().product();
            let mut rng = Lcg(seed);
            let x: Vec<f64> = rng.vec(n, 8.0).into_iter().map(|v| v.round()).collect();
            let mut out_shape = shape.clone();
            for (i, p) in pads.chunks(2).enumerate() {
                out_shape[rank - 1 - i] += p[0] + p[1];
            }
            let mut h = Harness::new();
            let xt = tensor(&mut h, dtype, &shape, &x);
            let pl: Vec<i64> = pads.iter().map(|&p| p as i64).collect();
            let pad = h.int_list(&pl);
            let v = h.double(-3.0);
            let out = h.out(dtype, &out_shape);
            h.call("aten::constant_pad_nd.out", &[xt, pad, v, out, out]).unwrap();
            let total: usize = out_shape.iter().product();
            let mut want = vec![-3.0; total];
            for (i, &xv) in x.iter().enumerate() {
                let mut rem = i;
                let mut at = 0;
                let mut stride = 1;
                for d in (0..rank).rev() {
                    let c = rem % shape[d];
                    rem /= shape[d];
                    let k = rank - 1 - d;
                    let b = if 2 * k < pads.len() { pads[2 * k] } else { 0 };
                    at += (c + b) * stride;
                    stride *= out_shape[d];
                }
                want[at] = xv;
            }
            assert_close(&read(&mut h, out), &want, 0.0, 0.0);
        }
    }

    /// Reference edge pad of row-major `x` (`shape`), the last `pads.len() / 2` dims
    /// padded; `reflect` mirrors, otherwise the edge repeats.
    fn edge_reference(
        x: &[f64],
        shape: &[usize],
        pads: &[usize],
        reflect: bool,
    ) -> (Vec<usize>, Vec<f64>) {
        let rank = shape.len();
        let mut before = vec![0usize; rank];
        let mut out_shape = shape.to_vec();
        for (i, p) in pads.chunks(2).enumerate() {
            before[rank - 1 - i] = p[0];
            out_shape[rank - 1 - i] += p[0] + p[1];
        }
        let total: usize = out_shape.iter().product();
        let mut out = Vec::with_capacity(total);
        for flat in 0..total {
            let mut rem = flat;
            let mut idx = vec![0usize; rank];
            for d in (0..rank).rev() {
                idx[d] = rem % out_shape[d];
                rem /= out_shape[d];
            }
            let mut at = 0;
            for d in 0..rank {
                let n = shape[d] as i64;
                let i = idx[d] as i64 - before[d] as i64;
                let src = if reflect {
                    if i < 0 {
                        -i
                    } else if i >= n {
                        2 * (n - 1) - i
                    } else {
                        i
                    }
                } else {
                    i.clamp(0, n - 1)
                };
                at = at * shape[d] + src as usize;
            }
            out.push(x[at]);
        }
        (out_shape, out)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn edge_pads_match_reference(
            k in 1usize..=3,
            extra in 1usize..=2,
            sizes in proptest::collection::vec(1usize..5, 5),
            raw_pads in proptest::collection::vec(0usize..6, 6),
            reflect in any::<bool>(),
            int in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let shape: Vec<usize> = sizes[..k + extra].to_vec();
            let rank = shape.len();
            let pads: Vec<usize> = (0..2 * k)
                .map(|j| {
                    let n = shape[rank - 1 - j / 2];
                    if reflect { raw_pads[j] % n } else { raw_pads[j] }
                })
                .collect();
            let dtype = if int { ScalarType::Int } else { ScalarType::Float };
            let n: usize = shape.iter().product();
            let x: Vec<f64> = Lcg(seed).vec(n, 8.0).into_iter().map(|v| v.round()).collect();
            let (out_shape, want) = edge_reference(&x, &shape, &pads, reflect);
            let op = format!("aten::{}_pad{k}d.out", if reflect { "reflection" } else { "replication" });
            let mut h = Harness::new();
            let xt = tensor(&mut h, dtype, &shape, &x);
            let pl: Vec<i64> = pads.iter().map(|&p| p as i64).collect();
            let pad = h.int_list(&pl);
            let out = h.out(dtype, &out_shape);
            h.call(&op, &[xt, pad, out, out]).unwrap();
            prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), out_shape);
            assert_close(&read(&mut h, out), &want, 0.0, 0.0);
        }
    }

    #[test]
    fn edge_pad_bad_calls() {
        let mut h = Harness::new();
        let x = h.tensor(&[1, 2, 3], &[0.0f32; 6]);
        let out = h.out(ScalarType::Float, &[8, 8, 8]);
        let ok = h.int_list(&[2, 2]);
        h.call("aten::reflection_pad1d.out", &[x, ok, out, out])
            .unwrap();
        let wide = h.int_list(&[3, 3, 1, 1]);
        h.call("aten::replication_pad2d.out", &[x, wide, out, out])
            .unwrap();
        for (op, pads) in [
            ("aten::reflection_pad1d.out", vec![3i64, 0]),
            ("aten::reflection_pad2d.out", vec![0, 0, 2, 0]),
            ("aten::reflection_pad1d.out", vec![1]),
            ("aten::replication_pad1d.out", vec![-1, 0]),
            ("aten::replication_pad3d.out", vec![1, 1, 1, 1]),
        ] {
            let p = h.int_list(&pads);
            assert!(h.call(op, &[x, p, out, out]).is_err(), "{op} {pads:?}");
        }
        // Rank 1 is too small for a 1-d pad, rank 4 too large; empty padded dims.
        let v = h.tensor(&[3], &[0.0f32; 3]);
        assert!(
            h.call("aten::replication_pad1d.out", &[v, ok, out, out])
                .is_err()
        );
        let r4 = h.tensor(&[1, 1, 1, 3], &[0.0f32; 3]);
        assert!(
            h.call("aten::replication_pad1d.out", &[r4, ok, out, out])
                .is_err()
        );
        let e = h.tensor::<f32>(&[2, 0], &[]);
        assert!(
            h.call("aten::replication_pad1d.out", &[e, ok, out, out])
                .is_err()
        );
        let oi = h.out(ScalarType::Int, &[8, 8, 8]);
        assert!(
            h.call("aten::replication_pad1d.out", &[x, ok, oi, oi])
                .is_err()
        );
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut h = Harness::new();
        let x = h.tensor(&[2, 2], &[0.0f32; 4]);
        let odd = h.int_list(&[1]);
        let neg = h.int_list(&[-1, 1]);
        let many = h.int_list(&[1, 1, 1, 1, 1, 1]);
        let v = h.double(0.0);
        let out = h.out(ScalarType::Float, &[4, 4]);
        let out_i = h.out(ScalarType::Int, &[4, 4]);
        let ok = h.int_list(&[1, 1, 1, 1]);
        let op = "aten::constant_pad_nd.out";
        h.call(op, &[x, ok, v, out, out]).unwrap();
        assert!(h.call(op, &[x, odd, v, out, out]).is_err());
        assert!(h.call(op, &[x, neg, v, out, out]).is_err());
        assert!(h.call(op, &[x, many, v, out, out]).is_err());
        assert!(h.call(op, &[x, ok, v, out_i, out_i]).is_err());
    }
}
