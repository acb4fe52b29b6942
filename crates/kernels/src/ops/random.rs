//! Random numbers: `rand` (uniform in `[0, 1)`), `randn` (standard normal) and
//! `native_dropout`.
//!
//! As the official portable kernels, every call draws from a generator seeded afresh
//! from the operating system's randomness (upstream: `std::random_device` into
//! `std::mt19937`; here the random keys of `std::collections::hash_map::RandomState`
//! into SplitMix64), so no two runs agree and no output can be compared with the
//! official runtime's; tests check shapes, ranges and statistics. Values are drawn in
//! f64 and cast to the out dtype (f32, f64, f16, bf16), normals by Box-Muller.
//!
//! `native_dropout` in training (`train` true or None, `p > 0`) keeps each element
//! with probability `1 - p` and, as PyTorch, scales the kept ones by `1 / (1 - p)`
//! (the official portable kernel keeps them unscaled); otherwise it copies the input
//! and sets the whole mask.

use std::hash::{BuildHasher, Hasher};

use etch_base::{Bool8, Element, cast};

use crate::ops::elementwise::dtype::with_float;
use crate::ops::same_dtype;
use crate::ops::shape::common::require_contiguous;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, IntList, KernelContext, KernelError, MAX_RANK, Registry, ScalarType, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::rand.out", |c, a| random(c, a, Dist::Uniform));
    r.register("aten::randn.out", |c, a| random(c, a, Dist::Normal));
    r.register("aten::native_dropout.out", native_dropout);
}

/// SplitMix64 over a seed from the process's random hashing keys.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        // Each RandomState has fresh keys (the first per thread from the OS, then
        // incremented), so every call starts elsewhere.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        Rng(h.finish())
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, 53 random bits.
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller, one value per two uniforms).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // in (0, 1]: ln is finite
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[derive(Clone, Copy, Debug)]
enum Dist {
    Uniform,
    Normal,
}

op_args! {
    /// `rand.out(SymInt[] size, *, Tensor(a!) out)` and `randn.out`.
    struct RandArgs<'a> = "aten::<rand|randn>.out" {
        size: IntList<'a>,
        out: OutArg,
    } returns 1
}

/// Resizes `out` to `size` (no negative sizes) and fills it with draws of `dist`.
fn random(ctx: &KernelContext<'_>, a: &mut Args<'_>, dist: Dist) -> Result<(), KernelError> {
    let RandArgs { size, out } = RandArgs::unpack(a)?;
    let mut ints = [0i64; MAX_RANK];
    let ints = size.read_into(&mut ints)?;
    let mut sizes = [0usize; MAX_RANK];
    for (s, &v) in sizes.iter_mut().zip(ints) {
        *s = usize::try_from(v)
            .map_err(|_| KernelError::invalid(format!("rand/randn: negative size in {ints:?}")))?;
    }
    let out = out.resize(a, &sizes[..ints.len()])?;
    require_contiguous(&out, "out")?;
    let mut rng = Rng::seeded();
    with_float!(out.dtype(), "rand/randn out", E, A => {
        let _ = std::mem::size_of::<A>();
        for v in ctx.write::<E>(&out)? {
            let x = match dist {
                Dist::Uniform => rng.uniform(),
                Dist::Normal => rng.normal(),
            };
            *v = E::from_f64(x);
        }
        Ok(())
    })
}

op_args! {
    /// `native_dropout.out(Tensor input, float p, bool? train, *, Tensor(a!) out0,
    /// Tensor(b!) out1)`: the output and the bool mask of kept elements.
    struct DropoutArgs = "aten::native_dropout.out" {
        input: Tensor,
        p: f64,
        train: Option<bool>,
        out0: OutArg,
        out1: OutArg,
    } returns 0..=2
}

/// As upstream: `out0` of the input's dtype (floating point), `out1` bool, both
/// resized to the input's sizes, `0 <= p <= 1`.
fn native_dropout(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let DropoutArgs {
        input,
        p,
        train,
        out0,
        out1,
    } = DropoutArgs::unpack(a)?;
    same_dtype(&input, &out0.tensor())?;
    if out1.tensor().dtype() != ScalarType::Bool {
        return Err(KernelError::DtypeMismatch {
            expected: ScalarType::Bool,
            found: out1.tensor().dtype(),
        });
    }
    if !(0.0..=1.0).contains(&p) {
        return Err(KernelError::invalid(format!(
            "native_dropout: probability has to be between 0 and 1, but got {p}"
        )));
    }
    for (t, what) in [
        (&input, "input"),
        (&out0.tensor(), "out0"),
        (&out1.tensor(), "out1"),
    ] {
        require_contiguous(t, what)?;
    }
    let out = out0.resize(a, input.sizes())?;
    let mask = out1.resize(a, input.sizes())?;
    let training = train.unwrap_or(true) && p != 0.0;
    with_float!(input.dtype(), "native_dropout", E, A => {
        let x = ctx.read::<E>(&input)?;
        let y = ctx.write::<E>(&out)?;
        let m = ctx.write::<Bool8>(&mask)?;
        if !training {
            y.copy_from_slice(x);
            m.fill(Bool8(1));
            return Ok(());
        }
        let scale = if p < 1.0 { A::from_f64(1.0 / (1.0 - p)) } else { A::from_f64(0.0) };
        let mut rng = Rng::seeded();
        for ((yv, &xv), mv) in y.iter_mut().zip(x).zip(m.iter_mut()) {
            let keep = rng.uniform() >= p;
            *mv = Bool8(keep as u8);
            *yv = if keep {
                cast::<A, E>(cast::<E, A>(xv) * scale)
            } else {
                E::from_f64(0.0)
            };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use etch_base::{Bool8, ScalarType};

    use crate::testing::Harness;

    fn mean_and_var(v: &[f64]) -> (f64, f64) {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        (
            m,
            v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64,
        )
    }

    #[test]
    fn rand_and_randn_fill_the_shape_with_the_right_statistics() {
        let mut h = Harness::new();
        let size = h.int_list(&[100, 100]);
        let out = h.out(ScalarType::Float, &[100, 100]);
        h.call("aten::rand.out", &[size, out, out]).unwrap();
        let u: Vec<f64> = h.read::<f32>(out).iter().map(|&v| v as f64).collect();
        assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)));
        let (m, var) = mean_and_var(&u);
        // 10^4 draws: the mean's standard error is about 0.003.
        assert!(
            (m - 0.5).abs() < 0.02 && (var - 1.0 / 12.0).abs() < 0.01,
            "{m} {var}"
        );
        h.call("aten::randn.out", &[size, out, out]).unwrap();
        let g: Vec<f64> = h.read::<f32>(out).iter().map(|&v| v as f64).collect();
        let (m, var) = mean_and_var(&g);
        assert!(m.abs() < 0.05 && (var - 1.0).abs() < 0.08, "{m} {var}");
        // Two calls differ.
        h.call("aten::randn.out", &[size, out, out]).unwrap();
        let g2: Vec<f64> = h.read::<f32>(out).iter().map(|&v| v as f64).collect();
        assert_ne!(g, g2);
        // A smaller size resizes; half and double outs; refusals.
        let small = h.int_list(&[3, 2]);
        h.call("aten::rand.out", &[small, out, out]).unwrap();
        assert_eq!(h.tensor_meta(out).sizes(), &[3, 2]);
        let oh = h.out(ScalarType::Half, &[3, 2]);
        h.call("aten::randn.out", &[small, oh, oh]).unwrap();
        let od = h.out(ScalarType::Double, &[3, 2]);
        h.call("aten::rand.out", &[small, od, od]).unwrap();
        assert!(h.read::<f64>(od).iter().all(|&v| (0.0..1.0).contains(&v)));
        let neg = h.int_list(&[-1, 2]);
        assert!(h.call("aten::rand.out", &[neg, out, out]).is_err());
        let oi = h.out(ScalarType::Int, &[3, 2]);
        assert!(h.call("aten::rand.out", &[small, oi, oi]).is_err());
    }

    #[test]
    fn dropout_keeps_one_minus_p_scaled_and_copies_in_eval() {
        let n = 20_000;
        let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + 1.0).collect();
        let mut h = Harness::new();
        let xt = h.tensor(&[n], &x);
        let (p, none) = (h.double(0.25), h.none());
        let (o, m) = (
            h.out(ScalarType::Float, &[n]),
            h.out(ScalarType::Bool, &[n]),
        );
        let op = "aten::native_dropout.out";
        h.call(op, &[xt, p, none, o, m, o, m]).unwrap();
        let (y, mask) = (h.read::<f32>(o), h.read::<Bool8>(m));
        let kept = mask.iter().filter(|b| b.0 != 0).count() as f64 / n as f64;
        assert!((kept - 0.75).abs() < 0.02, "{kept}");
        for ((&yv, &xv), b) in y.iter().zip(&x).zip(&mask) {
            let want = if b.0 != 0 { xv / 0.75 } else { 0.0 };
            assert!((yv - want).abs() < 1e-6);
        }
        // Eval (train=False) and p = 0: an exact copy, every mask element set.
        let f = h.bool(false);
        h.call(op, &[xt, p, f, o, m, o, m]).unwrap();
        assert_eq!(h.read::<f32>(o), x);
        assert!(h.read::<Bool8>(m).iter().all(|b| b.0 == 1));
        let zero = h.double(0.0);
        h.call(op, &[xt, zero, none, o, m, o, m]).unwrap();
        assert_eq!(h.read::<f32>(o), x);
        // p = 1 drops everything.
        let one = h.double(1.0);
        h.call(op, &[xt, one, none, o, m, o, m]).unwrap();
        assert!(h.read::<f32>(o).iter().all(|&v| v == 0.0));
        // p outside [0, 1], a non-bool mask.
        let big = h.double(1.5);
        assert!(h.call(op, &[xt, big, none, o, m, o, m]).is_err());
        let fm = h.out(ScalarType::Float, &[n]);
        assert!(h.call(op, &[xt, p, none, o, fm, o, fm]).is_err());
    }
}
