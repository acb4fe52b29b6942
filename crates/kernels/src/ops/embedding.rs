//! `aten::embedding.out`: rows of a `[V, D]` table picked by an index tensor.

use etch_base::ScalarType;

use crate::ops::same_dtype;
use crate::ops::shape::common::{for_rows, require_contiguous, with_bits_type, worth_parallel};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, MAX_RANK, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::embedding.out", embedding);
}

/// Index values as i64, from an i64 or i32 tensor.
#[derive(Clone, Copy)]
pub(crate) enum Indices<'a> {
    I64(&'a [i64]),
    I32(&'a [i32]),
}

impl<'a> Indices<'a> {
    /// Reads an index tensor (i64 or i32).
    pub(crate) fn read(ctx: &'a KernelContext<'_>, t: &Tensor) -> Result<Self, KernelError> {
        match t.dtype() {
            ScalarType::Long => Ok(Indices::I64(ctx.read::<i64>(t)?)),
            ScalarType::Int => Ok(Indices::I32(ctx.read::<i32>(t)?)),
            dtype => Err(KernelError::UnsupportedDtype {
                dtype,
                what: "index tensor (expected i64 or i32)",
            }),
        }
    }

    /// Number of indices.
    pub(crate) fn len(&self) -> usize {
        match self {
            Indices::I64(v) => v.len(),
            Indices::I32(v) => v.len(),
        }
    }

    /// Index `i` (callers keep `i < len()`).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> i64 {
        match self {
            Indices::I64(v) => v[i],
            Indices::I32(v) => v[i] as i64,
        }
    }
}

op_args! {
    /// `embedding.out(Tensor weight, Tensor indices, SymInt padding_idx=-1,
    /// bool scale_grad_by_freq=False, bool sparse=False, *, Tensor(a!) out)`.
    /// The flags only matter for training and are checked for kind only.
    struct EmbeddingArgs = "aten::embedding.out" {
        weight: Tensor,
        indices: Tensor,
        padding_idx: i64,
        scale_grad_by_freq: bool,
        sparse: bool,
        out: OutArg,
    } returns 1
}

fn embedding(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let EmbeddingArgs {
        weight,
        indices,
        out: out_arg,
        ..
    } = EmbeddingArgs::unpack(a)?;
    if weight.rank() != 2 {
        return Err(KernelError::invalid(format!(
            "embedding weight must be 2-d, got {:?}",
            weight.sizes()
        )));
    }
    let (vocab, dim) = (weight.sizes()[0], weight.sizes()[1]);
    let rank = indices.rank();
    if rank + 1 > MAX_RANK {
        return Err(KernelError::invalid("embedding indices rank too large"));
    }
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank].copy_from_slice(indices.sizes());
    sizes[rank] = dim;
    let out = out_arg.tensor();
    same_dtype(&weight, &out)?;
    require_contiguous(&weight, "weight")?;
    require_contiguous(&indices, "indices")?;
    require_contiguous(&out, "out")?;
    let out = out_arg.resize(a, &sizes[..=rank])?;
    let idx = Indices::read(ctx, &indices)?;
    let n = idx.len();
    for i in 0..n {
        let v = idx.get(i);
        if v < 0 || v as u64 >= vocab as u64 {
            return Err(KernelError::invalid(format!(
                "embedding index {v} out of range for {vocab} rows"
            )));
        }
    }
    if n == 0 || dim == 0 {
        return Ok(());
    }
    with_bits_type!(weight.dtype().element_size(), T => {
        let w = ctx.read_raw::<T>(&weight)?;
        let o = ctx.write_raw::<T>(&out)?;
        let parallel = worth_parallel(n, n * dim);
        for_rows(ctx.pool(), o, dim, n, 8, parallel, |first, chunk| {
            for (i, row) in chunk.chunks_exact_mut(dim).enumerate() {
                let r = idx.get(first + i) as usize * dim;
                row.copy_from_slice(&w[r..r + dim]);
            }
        });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use proptest::prelude::*;

    use crate::ThreadPool;
    use crate::testing::Harness;

    fn call(
        h: &mut Harness,
        w: usize,
        idx: usize,
        bound: &[usize],
    ) -> Result<usize, crate::KernelError> {
        let p = h.int(-1);
        let f = h.bool(false);
        let dtype = h.tensor_meta(w).dtype();
        let out = h.out(dtype, bound);
        h.call("aten::embedding.out", &[w, idx, p, f, f, out, out])?;
        Ok(out)
    }

    #[test]
    fn lookup_2d_indices() {
        let mut h = Harness::new();
        let table: Vec<f32> = (0..60).map(|i| i as f32).collect();
        let w = h.tensor(&[10, 6], &table);
        let idx = h.tensor(&[2, 3], &[0i64, 9, 3, 3, 1, 0]);
        let out = call(&mut h, w, idx, &[2, 3, 6]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[2, 3, 6]);
        let got = h.read::<f32>(out);
        for (k, &i) in [0usize, 9, 3, 3, 1, 0].iter().enumerate() {
            assert_eq!(&got[k * 6..k * 6 + 6], &table[i * 6..i * 6 + 6]);
        }
        // i32 indices, dynamic out.
        let idx32 = h.tensor(&[1, 2], &[5i32, 2]);
        let out = call(&mut h, w, idx32, &[1, 31, 6]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[1, 2, 6]);
        assert_eq!(&h.read::<f32>(out)[..6], &table[30..36]);
    }

    #[test]
    fn bad_calls() {
        let mut h = Harness::new();
        let w = h.tensor(&[4, 2], &[0f32; 8]);
        for bad in [4i64, -1] {
            let idx = h.tensor(&[1], &[bad]);
            assert!(call(&mut h, w, idx, &[1, 2]).is_err(), "{bad}");
        }
        let fidx = h.tensor(&[1], &[0f32]);
        assert!(call(&mut h, w, fidx, &[1, 2]).is_err());
        let idx = h.tensor(&[1], &[0i64]);
        let w1 = h.tensor(&[8], &[0f32; 8]);
        assert!(call(&mut h, w1, idx, &[1, 2]).is_err());
        // out rank must be indices rank + 1.
        assert!(call(&mut h, w, idx, &[2]).is_err());
        let p = h.int(-1);
        let f = h.bool(false);
        let out = h.out(ScalarType::Half, &[1, 2]);
        assert!(
            h.call("aten::embedding.out", &[w, idx, p, f, f, out, out])
                .is_err()
        );
        assert!(
            h.call("aten::embedding.out", &[w, idx, p, f, out, out])
                .is_err()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn matches_reference(
            vocab in 1usize..50,
            dim in 0usize..40,
            idx in proptest::collection::vec(0usize..1000, 0..600),
            threads in 1usize..3,
        ) {
            let table: Vec<u16> = (0..vocab * dim).map(|i| i as u16).collect();
            let ids: Vec<i64> = idx.iter().map(|&i| (i % vocab) as i64).collect();
            let mut h = Harness::with_pool(ThreadPool::new(threads).unwrap());
            let w = h.tensor(&[vocab, dim], &table.iter().map(|&v| half::bf16::from_bits(v)).collect::<Vec<_>>());
            let it = h.tensor(&[ids.len()], &ids);
            let out = call(&mut h, w, it, &[ids.len(), dim]).unwrap();
            let got: Vec<u16> = h.read::<half::bf16>(out).iter().map(|v| v.to_bits()).collect();
            let want: Vec<u16> = ids.iter().flat_map(|&i| table[i as usize * dim..(i as usize + 1) * dim].to_vec()).collect();
            prop_assert_eq!(got, want);
        }
    }
}
