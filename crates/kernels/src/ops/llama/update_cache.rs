//! `llama::update_cache.out` and `llama::update_cache_with_indices.out`: copy the new
//! key/value rows `[B, S, H, D]` into a `[B, S_max, H, D]` cache, in place.
//!
//! The copy is dtype-agnostic (only the element sizes must match), so the same ops
//! update float caches and the int8 / scale / zero-point tensors of a quantized cache.
//! The `out` argument is an untouched placeholder. Every check runs before the first
//! byte is written, so a rejected call leaves the cache as it was.

use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Tensor};

/// A validated cache update: where each batch's rows go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheUpdate {
    batch: usize,
    seq: usize,
    cache_len: usize,
    /// Bytes of one token (H * D * element size).
    token_bytes: usize,
}

impl CacheUpdate {
    /// Bytes of one batch of the value.
    fn value_batch_bytes(&self) -> usize {
        self.seq * self.token_bytes
    }

    /// Bytes of one batch of the cache.
    fn cache_batch_bytes(&self) -> usize {
        self.cache_len * self.token_bytes
    }
}

/// Checks a `value` `[B, S, H, D]` / `cache` `[B, S_max, H, D]` pair (both 4-D and
/// contiguous, sizes 0, 2 and 3 equal, equal element sizes).
pub(crate) fn check_pair(value: &Tensor, cache: &Tensor) -> Result<CacheUpdate, KernelError> {
    if value.rank() != 4 || cache.rank() != 4 {
        return Err(KernelError::invalid(format!(
            "update_cache: value {value:?} and cache {cache:?} must be 4-D"
        )));
    }
    if !value.is_contiguous() || !cache.is_contiguous() {
        return Err(KernelError::invalid(
            "update_cache: value and cache must be in contiguous dim order",
        ));
    }
    let (v, c) = (value.sizes(), cache.sizes());
    if v[0] != c[0] || v[2] != c[2] || v[3] != c[3] {
        return Err(KernelError::invalid(format!(
            "update_cache: value {v:?} does not match cache {c:?} in batch, heads or head dim"
        )));
    }
    let elem = value.dtype().element_size();
    if elem != cache.dtype().element_size() {
        return Err(KernelError::invalid(format!(
            "update_cache: element size of value ({}) differs from the cache's ({})",
            value.dtype(),
            cache.dtype()
        )));
    }
    Ok(CacheUpdate {
        batch: v[0],
        seq: v[1],
        cache_len: c[1],
        token_bytes: v[2] * v[3] * elem,
    })
}

/// Checks the position range `[start_pos, start_pos + S)` against the cache.
pub(crate) fn check_start(u: &CacheUpdate, start_pos: i64) -> Result<usize, KernelError> {
    let fits = usize::try_from(start_pos)
        .ok()
        .filter(|&p| p < u.cache_len && p.checked_add(u.seq).is_some_and(|end| end <= u.cache_len));
    fits.ok_or_else(|| {
        KernelError::invalid(format!(
            "update_cache: start_pos {start_pos} with {} new rows does not fit a cache of {} rows",
            u.seq, u.cache_len
        ))
    })
}

fn short(what: &str) -> KernelError {
    KernelError::invalid(format!(
        "update_cache: {what} bytes are shorter than its shape"
    ))
}

/// Copies every batch's `S` rows to rows `[start, start + S)` of the cache.
pub(crate) fn copy_at(
    u: &CacheUpdate,
    start: usize,
    value: &[u8],
    cache: &mut [u8],
) -> Result<(), KernelError> {
    let (vb, cb) = (u.value_batch_bytes(), u.cache_batch_bytes());
    for b in 0..u.batch {
        let src = value
            .get(b * vb..(b + 1) * vb)
            .ok_or_else(|| short("value"))?;
        let at = b * cb + start * u.token_bytes;
        let dst = cache.get_mut(at..at + vb).ok_or_else(|| short("cache"))?;
        dst.copy_from_slice(src);
    }
    Ok(())
}

op_args! {
    /// `update_cache.out(Tensor value, Tensor(a!) cache, SymInt start_pos, *, Tensor(b!) out)`.
    struct UpdateCacheArgs = "llama::update_cache.out" {
        value: Tensor,
        cache: Tensor,
        start_pos: i64,
        out: OutArg,
    } returns 1
}

pub(crate) fn update_cache_out(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    let UpdateCacheArgs {
        value,
        cache,
        start_pos,
        ..
    } = UpdateCacheArgs::unpack(a)?;
    let u = check_pair(&value, &cache)?;
    let start = check_start(&u, start_pos)?;
    if value.numel() == 0 {
        return Ok(());
    }
    let src = ctx.read_bytes(&value)?;
    let dst = ctx.write_bytes(&cache)?;
    copy_at(&u, start, src, dst)
}

op_args! {
    /// `update_cache_with_indices.out(Tensor value, Tensor(a!) cache, SymInt start_pos,
    /// Tensor indices, *, Tensor(b!) out)`: token `s` of batch `b` goes to cache row
    /// `indices[b, s]` (`start_pos` is not used for addressing).
    struct UpdateCacheWithIndicesArgs = "llama::update_cache_with_indices.out" {
        value: Tensor,
        cache: Tensor,
        start_pos: i64,
        indices: Tensor,
        out: OutArg,
    } returns 1
}

pub(crate) fn update_cache_with_indices_out(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
) -> Result<(), KernelError> {
    let UpdateCacheWithIndicesArgs {
        value,
        cache,
        indices,
        ..
    } = UpdateCacheWithIndicesArgs::unpack(a)?;
    let u = check_pair(&value, &cache)?;
    if indices.rank() != 2 || indices.sizes() != [u.batch, u.seq] {
        return Err(KernelError::invalid(format!(
            "update_cache_with_indices: indices {indices:?} must be [{}, {}]",
            u.batch, u.seq
        )));
    }
    if !indices.is_contiguous() {
        return Err(KernelError::invalid(
            "update_cache_with_indices: indices must be in contiguous dim order",
        ));
    }
    let idx = ctx.read::<i64>(&indices)?;
    if let Some(bad) = idx
        .iter()
        .find(|&&i| usize::try_from(i).map_or(true, |i| i >= u.cache_len))
    {
        return Err(KernelError::invalid(format!(
            "update_cache_with_indices: index {bad} is outside the cache's {} rows",
            u.cache_len
        )));
    }
    if value.numel() == 0 {
        return Ok(());
    }
    let src = ctx.read_bytes(&value)?;
    let dst = ctx.write_bytes(&cache)?;
    let t = u.token_bytes;
    for b in 0..u.batch {
        for s in 0..u.seq {
            let row = idx.get(b * u.seq + s).copied().unwrap_or(0) as usize;
            let from = (b * u.seq + s) * t;
            let to = (b * u.cache_len + row) * t;
            let src = src.get(from..from + t).ok_or_else(|| short("value"))?;
            let dst = dst.get_mut(to..to + t).ok_or_else(|| short("cache"))?;
            dst.copy_from_slice(src);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;
    use half::bf16;
    use proptest::prelude::*;

    use crate::KernelError;
    use crate::testing::Harness;

    fn ramp(n: usize, base: f32) -> Vec<f32> {
        (0..n).map(|i| base + i as f32).collect()
    }

    /// Runs update_cache and returns the cache contents.
    fn update(
        value: (&[usize], &[f32]),
        cache: (&[usize], &[f32]),
        start_pos: i64,
    ) -> Result<Vec<f32>, KernelError> {
        let mut h = Harness::new();
        let v = h.tensor(value.0, value.1);
        let c = h.tensor(cache.0, cache.1);
        let p = h.int(start_pos);
        let out = h.out(ScalarType::Float, &[1]);
        h.call("llama::update_cache.out", &[v, c, p, out, out])?;
        assert_eq!(h.read::<f32>(out), vec![0.0], "out is a placeholder");
        Ok(h.read::<f32>(c))
    }

    fn reference(
        value: &[f32],
        cache: &[f32],
        (b, s, s_max, row): (usize, usize, usize, usize),
        start: usize,
    ) -> Vec<f32> {
        let mut want = cache.to_vec();
        for bi in 0..b {
            for si in 0..s {
                let from = (bi * s + si) * row;
                let to = (bi * s_max + start + si) * row;
                want[to..to + row].copy_from_slice(&value[from..from + row]);
            }
        }
        want
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn copies_rows_at_start_pos(
            b in 1usize..3, s in 0usize..5, extra in 0usize..6, h in 1usize..4,
            d in 1usize..6, start_frac in 0.0f64..1.0,
        ) {
            let s_max = s + extra + 1;
            let start = ((s_max - s) as f64 * start_frac) as usize;
            let start = start.min(s_max - s).min(s_max - 1);
            let value = ramp(b * s * h * d, 1000.0);
            let cache = ramp(b * s_max * h * d, -500.0);
            let got = update(
                (&[b, s, h, d], &value),
                (&[b, s_max, h, d], &cache),
                start as i64,
            ).unwrap();
            prop_assert_eq!(got, reference(&value, &cache, (b, s, s_max, h * d), start));
        }
    }

    #[test]
    fn bounds_and_shape_errors() {
        let v = ramp(2 * 4, 0.0);
        let c = ramp(8 * 4, 0.0);
        // start_pos + S > S_max
        assert!(update((&[1, 2, 1, 4], &v), (&[1, 8, 1, 4], &c), 7).is_err());
        // start_pos == S_max
        assert!(update((&[1, 2, 1, 4], &v), (&[1, 8, 1, 4], &c), 8).is_err());
        // negative start_pos
        assert!(update((&[1, 2, 1, 4], &v), (&[1, 8, 1, 4], &c), -1).is_err());
        // the last rows fit exactly
        assert!(update((&[1, 2, 1, 4], &v), (&[1, 8, 1, 4], &c), 6).is_ok());
        // head-dim, head and batch mismatches
        assert!(update((&[1, 2, 2, 2], &v), (&[1, 8, 1, 4], &c), 0).is_err());
        assert!(update((&[1, 2, 4, 1], &v), (&[1, 8, 1, 4], &c), 0).is_err());
        assert!(update((&[2, 1, 1, 4], &v), (&[1, 8, 1, 4], &c), 0).is_err());
        // rank
        assert!(update((&[2, 4], &v), (&[1, 8, 1, 4], &c), 0).is_err());
    }

    #[test]
    fn element_size_is_what_counts() {
        let mut h = Harness::new();
        // f32 value into an i32 cache: same element size, copied bitwise.
        let v = h.tensor(&[1, 1, 1, 2], &[1.5f32, -2.0]);
        let c = h.tensor(&[1, 2, 1, 2], &[0i32; 4]);
        let p = h.int(1);
        let out = h.out(ScalarType::Float, &[1]);
        h.call("llama::update_cache.out", &[v, c, p, out, out])
            .unwrap();
        let got = h.read::<i32>(c);
        assert_eq!(got[2], 1.5f32.to_bits() as i32);
        // bf16 into an f32 cache: refused.
        let v = h.tensor(&[1, 1, 1, 2], &[bf16::ONE, bf16::ONE]);
        let c = h.tensor(&[1, 2, 1, 2], &[0f32; 4]);
        assert!(
            h.call("llama::update_cache.out", &[v, c, p, out, out])
                .is_err()
        );
        // Wrong argument count and kinds.
        assert!(matches!(
            h.call("llama::update_cache.out", &[v, c, p, out]),
            Err(KernelError::OpArgCount { .. })
        ));
        assert!(matches!(
            h.call("llama::update_cache.out", &[v, c, out, out, out]),
            Err(KernelError::Argument {
                name: "start_pos",
                ..
            })
        ));
    }

    #[test]
    fn int8_cache_rows() {
        let mut h = Harness::new();
        let v = h.tensor(&[1, 2, 1, 3], &[1i8, 2, 3, 4, 5, 6]);
        let c = h.tensor(&[1, 4, 1, 3], &[0i8; 12]);
        let p = h.int(1);
        let out = h.out(ScalarType::Float, &[1]);
        h.call("llama::update_cache.out", &[v, c, p, out, out])
            .unwrap();
        assert_eq!(h.read::<i8>(c), vec![0, 0, 0, 1, 2, 3, 4, 5, 6, 0, 0, 0]);
    }

    #[test]
    fn in_place_aliasing_is_refused() {
        // value and cache being the same tensor cannot be borrowed both ways.
        let mut h = Harness::new();
        let c = h.tensor(&[1, 2, 1, 2], &[0f32; 4]);
        let p = h.int(0);
        let out = h.out(ScalarType::Float, &[1]);
        assert!(
            h.call("llama::update_cache.out", &[c, c, p, out, out])
                .is_err()
        );
    }

    fn update_indices(
        value: (&[usize], &[f32]),
        cache: (&[usize], &[f32]),
        indices: (&[usize], &[i64]),
    ) -> Result<Vec<f32>, KernelError> {
        let mut h = Harness::new();
        let v = h.tensor(value.0, value.1);
        let c = h.tensor(cache.0, cache.1);
        let p = h.int(12345);
        let i = h.tensor(indices.0, indices.1);
        let out = h.out(ScalarType::Float, &[1]);
        h.call(
            "llama::update_cache_with_indices.out",
            &[v, c, p, i, out, out],
        )?;
        Ok(h.read::<f32>(c))
    }

    #[test]
    fn indices_scatter_rows() {
        let v = ramp(2 * 3 * 2, 100.0);
        let c = vec![0f32; 2 * 4 * 2];
        let got = update_indices(
            (&[2, 3, 1, 2], &v),
            (&[2, 4, 1, 2], &c),
            (&[2, 3], &[3, 0, 2, 1, 1, 0]),
        )
        .unwrap();
        #[rustfmt::skip]
        let want = vec![
            102., 103., 0., 0., 104., 105., 100., 101.,
            // batch 1: rows 1 then 1 again (last write wins), then 0
            110., 111., 108., 109., 0., 0., 0., 0.,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn indices_errors() {
        let v = ramp(2 * 2, 0.0);
        let c = vec![0f32; 4 * 2];
        let sizes = ([1usize, 2, 1, 2], [1usize, 4, 1, 2]);
        // Out of range (too large, negative): nothing is written.
        for bad in [[0i64, 4], [-1, 0]] {
            assert!(update_indices((&sizes.0, &v), (&sizes.1, &c), (&[1, 2], &bad)).is_err());
        }
        // Wrong shape.
        assert!(update_indices((&sizes.0, &v), (&sizes.1, &c), (&[2], &[0, 1])).is_err());
        assert!(update_indices((&sizes.0, &v), (&sizes.1, &c), (&[1, 1], &[0])).is_err());
        // Wrong dtype.
        let mut h = Harness::new();
        let vv = h.tensor(&sizes.0, &v);
        let cc = h.tensor(&sizes.1, &c);
        let p = h.int(0);
        let i = h.tensor(&[1, 2], &[0i32, 1]);
        let out = h.out(ScalarType::Float, &[1]);
        assert!(
            h.call(
                "llama::update_cache_with_indices.out",
                &[vv, cc, p, i, out, out]
            )
            .is_err()
        );
    }
}
