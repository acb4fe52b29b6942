//! Binary elementwise loops over f32 runs: `out[i] = clamp(a[i] op b[i])`, where each
//! operand is a run as long as the output or one value repeated. Written once as a
//! generic loop and compiled for AVX-512, AVX2 and the portable baseline; the result
//! is the same on every ISA (one IEEE operation and the clamp per element).

use crate::Isa;

/// An f32 arithmetic operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arithmetic {
    /// `a + b`.
    Add,
    /// `a - b`.
    Subtract,
    /// `a * b`.
    Multiply,
    /// `a / b`.
    Divide,
}

/// One operand of a binary loop.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a, T> {
    /// A run as long as the output.
    Run(&'a [T]),
    /// One value for every element.
    Splat(T),
}

/// `out[i] = op(a[i], b[i])`, clamped to `[lo, hi]` when `clamp` is given (as
/// `v.max(lo).min(hi)`); a run operand shorter than `out` limits the elements written.
pub fn arithmetic(
    isa: Isa,
    op: Arithmetic,
    a: Operand<'_, f32>,
    b: Operand<'_, f32>,
    clamp: Option<(f32, f32)>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = isa.avx512() {
        return x86::arithmetic_avx512(t, op, a, b, clamp, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = isa.avx2() {
        return x86::arithmetic_avx2(t, op, a, b, clamp, out);
    }
    let _ = isa;
    arithmetic_with(op, a, b, clamp, out)
}

/// `out[i] = g(a[i], b[i])` for runs and splats of any element type: one loop per
/// pair of operand kinds (a run shorter than `out` limits the elements written).
#[inline(always)]
pub fn zip_with<T: Copy, U: Copy>(
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    out: &mut [U],
    g: impl Fn(T, T) -> U,
) {
    match (a, b) {
        (Operand::Run(a), Operand::Run(b)) => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = g(x, y);
            }
        }
        (Operand::Run(a), Operand::Splat(y)) => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = g(x, y);
            }
        }
        (Operand::Splat(x), Operand::Run(b)) => {
            for (o, &y) in out.iter_mut().zip(b) {
                *o = g(x, y);
            }
        }
        (Operand::Splat(x), Operand::Splat(y)) => out.fill(g(x, y)),
    }
}

/// The loop nest: one monomorphic loop per operation, operand kinds and clamp, so that
/// each vectorizes.
#[inline(always)]
fn arithmetic_with(
    op: Arithmetic,
    a: Operand<'_, f32>,
    b: Operand<'_, f32>,
    clamp: Option<(f32, f32)>,
    out: &mut [f32],
) {
    macro_rules! ops {
        ($($variant:ident => $f:expr),*) => {
            match (op, clamp) {
                $(
                    (Arithmetic::$variant, None) => zip_with(a, b, out, $f),
                    (Arithmetic::$variant, Some((lo, hi))) => {
                        zip_with(a, b, out, |x, y| ($f)(x, y).max(lo).min(hi))
                    }
                )*
            }
        };
    }
    ops!(
        Add => |x: f32, y: f32| x + y,
        Subtract => |x: f32, y: f32| x - y,
        Multiply => |x: f32, y: f32| x * y,
        Divide => |x: f32, y: f32| x / y
    )
}

/// The x86 entry points: the generic loop compiled with the features enabled.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Arithmetic, Operand};
    use crate::CpuSupport;

    /// Generates a safe entry point (taking the CPU token) and the target-feature
    /// function it calls.
    macro_rules! entry {
        ($entry:ident, $inner:ident, $feat:literal, $what:literal) => {
            #[doc = concat!("[`super::arithmetic`] with ", $what, ".")]
            pub(super) fn $entry(
                _: CpuSupport,
                op: Arithmetic,
                a: Operand<'_, f32>,
                b: Operand<'_, f32>,
                clamp: Option<(f32, f32)>,
                out: &mut [f32],
            ) {
                // SAFETY: the token is only handed out once the feature was detected
                // on this CPU (`Isa::avx2`, `Isa::avx512`).
                unsafe { $inner(op, a, b, clamp, out) }
            }

            #[target_feature(enable = $feat)]
            unsafe fn $inner(
                op: Arithmetic,
                a: Operand<'_, f32>,
                b: Operand<'_, f32>,
                clamp: Option<(f32, f32)>,
                out: &mut [f32],
            ) {
                super::arithmetic_with(op, a, b, clamp, out)
            }
        };
    }

    entry!(arithmetic_avx2, avx2, "avx2", "AVX2");
    entry!(arithmetic_avx512, avx512, "avx512f", "AVX-512 F");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_isa_gives_the_scalar_bits() {
        let a: Vec<f32> = (0..77).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
        let b: Vec<f32> = (0..77)
            .map(|i| (i as f32 * 0.3).cos() + 0.01 * i as f32)
            .collect();
        let ops = [
            Arithmetic::Add,
            Arithmetic::Subtract,
            Arithmetic::Multiply,
            Arithmetic::Divide,
        ];
        for op in ops {
            for clamp in [None, Some((-1.0f32, 0.5f32))] {
                for (x, y) in [
                    (Operand::Run(&a[..]), Operand::Run(&b[..])),
                    (Operand::Run(&a[..]), Operand::Splat(0.25)),
                    (Operand::Splat(-2.0), Operand::Run(&b[..])),
                    (Operand::Splat(-2.0), Operand::Splat(3.0)),
                ] {
                    let want: Vec<f32> = (0..77)
                        .map(|i| {
                            let p = match x {
                                Operand::Run(r) => r[i],
                                Operand::Splat(v) => v,
                            };
                            let q = match y {
                                Operand::Run(r) => r[i],
                                Operand::Splat(v) => v,
                            };
                            let v = match op {
                                Arithmetic::Add => p + q,
                                Arithmetic::Subtract => p - q,
                                Arithmetic::Multiply => p * q,
                                Arithmetic::Divide => p / q,
                            };
                            clamp.map_or(v, |(lo, hi)| v.max(lo).min(hi))
                        })
                        .collect();
                    for &isa in Isa::available() {
                        let mut got = vec![f32::NAN; 77];
                        arithmetic(isa, op, x, y, clamp, &mut got);
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(g, w)| g.to_bits() == w.to_bits());
                        assert!(same, "{} {op:?} {clamp:?}", isa.name());
                    }
                }
            }
        }
    }
}
