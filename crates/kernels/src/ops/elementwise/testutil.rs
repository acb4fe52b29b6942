//! Test helpers for the elementwise, reduction and conversion kernels: tensors of any
//! dtype from f64 values, reading them back, broadcast indexing and shape strategies.

use etch_base::ScalarType;
use proptest::prelude::*;

use super::dtype::{Element, with_elem};
use crate::ThreadPool;
use crate::testing::Harness;

/// Every dtype the kernels compute with.
pub const DTYPES: [ScalarType; 10] = [
    ScalarType::Bool,
    ScalarType::Byte,
    ScalarType::Char,
    ScalarType::Short,
    ScalarType::Int,
    ScalarType::Long,
    ScalarType::Half,
    ScalarType::BFloat16,
    ScalarType::Float,
    ScalarType::Double,
];

/// A static tensor of `dtype` holding `vals` cast from f64.
pub fn tensor(h: &mut Harness, dtype: ScalarType, sizes: &[usize], vals: &[f64]) -> usize {
    with_elem!(dtype, E => {
        let data: Vec<E> = vals.iter().map(|&v| E::from_f64(v)).collect();
        h.tensor_raw(dtype, sizes, bytemuck::cast_slice(&data))
    }, panic!("unsupported test dtype {dtype}"))
}

/// A tensor's elements (current shape) as f64.
pub fn read(h: &mut Harness, idx: usize) -> Vec<f64> {
    let dtype = h.tensor_meta(idx).dtype();
    let bytes = h.read_bytes(idx);
    with_elem!(dtype, E => {
        bytemuck::pod_collect_to_vec::<u8, E>(&bytes).into_iter().map(|x| x.to_f64()).collect()
    }, panic!("unsupported test dtype {dtype}"))
}

/// `v` cast to `dtype` and back.
pub fn round_through(dtype: ScalarType, v: f64) -> f64 {
    with_elem!(dtype, E => E::from_f64(v).to_f64(), panic!("unsupported test dtype {dtype}"))
}

/// The linear index into a tensor of `in_shape` (right-aligned, broadcast) of the
/// output element with linear index `linear` in `out_shape`.
pub fn bcast_index(out_shape: &[usize], in_shape: &[usize], mut linear: usize) -> usize {
    let off = out_shape.len() - in_shape.len();
    let mut idx = 0;
    let mut stride = 1;
    for d in (0..out_shape.len()).rev() {
        let i = linear % out_shape[d];
        linear /= out_shape[d];
        if d >= off {
            let s = in_shape[d - off];
            if s != 1 {
                idx += i * stride;
            }
            stride *= s;
        }
    }
    idx
}

/// `n` small integers valid for `dtype` (non-negative for unsigned, 0/1 for bool).
pub fn small_ints(rng: &mut Lcg, dtype: ScalarType, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let v = (rng.next_f64() * 9.99).trunc();
            match dtype {
                ScalarType::Bool => (v.abs() >= 5.0) as u8 as f64,
                ScalarType::Byte | ScalarType::UInt16 | ScalarType::UInt32 | ScalarType::UInt64 => {
                    v.abs()
                }
                _ => v,
            }
        })
        .collect()
}

/// An output shape (rank 0..=4, dims 0..=4) and two shapes that broadcast to it.
pub fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<usize>)> {
    proptest::collection::vec(0usize..=4, 0..=4).prop_flat_map(|out| {
        let r = out.len();
        (
            Just(out),
            proptest::collection::vec(any::<bool>(), r),
            proptest::collection::vec(any::<bool>(), r),
            0..=r,
            0..=r,
        )
            .prop_map(|(out, ones_a, ones_b, drop_a, drop_b)| {
                let mk = |ones: &[bool], drop: usize| -> Vec<usize> {
                    out.iter()
                        .zip(ones)
                        .skip(drop)
                        .map(|(&s, &one)| if one { 1 } else { s })
                        .collect()
                };
                let a = mk(&ones_a, drop_a);
                let b = mk(&ones_b, drop_b);
                // The broadcast of a and b (dims set to 1 in both become 1).
                let rank = a.len().max(b.len());
                let mut full = vec![0; rank];
                for (d, f) in full.iter_mut().enumerate() {
                    let pick = |s: &[usize]| {
                        let off = rank - s.len();
                        if d >= off { s[d - off] } else { 1 }
                    };
                    let (x, y) = (pick(&a), pick(&b));
                    *f = if x == 1 { y } else { x };
                }
                (full, a, b)
            })
    })
}

/// A harness over a serial pool or a pool of 2 threads.
pub fn harness(threads: usize) -> Harness {
    if threads <= 1 {
        Harness::new()
    } else {
        Harness::with_pool(ThreadPool::new(threads).expect("pool"))
    }
}

/// Asserts two f64 sequences agree within `rel` relative (and `abs` absolute) error,
/// treating NaN as equal to NaN.
pub fn assert_close(got: &[f64], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g.is_nan() && w.is_nan() {
            continue;
        }
        if g == w {
            continue;
        }
        let tol = abs + rel * w.abs();
        assert!(
            (g - w).abs() <= tol,
            "element {i}: got {g}, want {w} (tol {tol})"
        );
    }
}

/// A simple deterministic generator for test data.
pub struct Lcg(pub u64);

impl Lcg {
    /// Next value in [-1, 1).
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    /// `n` values in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| self.next_f64() * scale).collect()
    }
}

/// Tolerance for results of `dtype` compared with an f64 reference.
pub fn tol(dtype: ScalarType) -> f64 {
    match dtype {
        ScalarType::Half => 2e-3,
        ScalarType::BFloat16 => 1.6e-2,
        ScalarType::Float => 2e-6,
        ScalarType::Double => 1e-12,
        _ => 0.0,
    }
}

/// Calls `op` with `args` and asserts that the kernel refuses the call.
#[track_caller]
pub fn assert_refused(h: &mut Harness, op: &str, args: &[usize]) {
    assert!(h.call(op, args).is_err(), "{op} accepted {args:?}");
}
