//! Instruction sets and the dispatch table.
//!
//! An [`Isa`] names the instructions a kernel may execute. Its SIMD variants carry a
//! [`CpuSupport`], a proof value that only this module can build, and only after
//! `is_x86_feature_detected!` / `is_aarch64_feature_detected!` confirmed the features:
//! holding an `Isa::Avx512(_)` *is* the evidence that AVX-512 instructions may run.
//!
//! The CPU is examined once, the first time [`dispatch`] or [`Isa::available`] is
//! called; [`Dispatch`] then says which instruction set each kernel family uses.

use std::sync::OnceLock;

/// Proof that the running CPU has the features of the [`Isa`] variant holding it
/// (private constructor: built only by the detection in this module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSupport(());

/// An instruction set the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust: the scalar twin every fast kernel is tested against.
    Scalar,
    /// AVX2 with FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2(CpuSupport),
    /// AVX-512 F (with AVX2, FMA and F16C, which every AVX-512 CPU has; checked anyway).
    #[cfg(target_arch = "x86_64")]
    Avx512(CpuSupport),
    /// AVX-512 F, BW and VL with VNNI (`vpdpbusd`, the int8 dot product): everything
    /// `Avx512` has, plus the int8 kernels' instructions.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni(CpuSupport),
    /// NEON with fused multiply-adds (part of the base aarch64 ABI).
    #[cfg(target_arch = "aarch64")]
    Neon(CpuSupport),
    /// NEON with the dot-product extension (Armv8.2 `dotprod`: `sdot`, the int8 dot
    /// product): everything `Neon` has, plus the int8 kernels' instruction.
    #[cfg(target_arch = "aarch64")]
    NeonDot(CpuSupport),
}

impl Isa {
    /// Every instruction set this CPU supports, the portable one first and the best
    /// last (detected once).
    pub fn available() -> &'static [Isa] {
        static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
        AVAILABLE.get_or_init(detect)
    }

    /// The best instruction set of this CPU.
    pub fn best() -> Isa {
        Isa::available().last().copied().unwrap_or(Isa::Scalar)
    }

    /// The AVX2+FMA token when this instruction set includes AVX2 and FMA (AVX-512
    /// CPUs do), for kernels that have no AVX-512 version.
    #[cfg(target_arch = "x86_64")]
    pub fn avx2(self) -> Option<CpuSupport> {
        match self {
            Isa::Avx2(t) | Isa::Avx512(t) | Isa::Avx512Vnni(t) => Some(t),
            Isa::Scalar => None,
        }
    }

    /// The AVX-512 F token when this instruction set includes AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    pub fn avx512(self) -> Option<CpuSupport> {
        match self {
            Isa::Avx512(t) | Isa::Avx512Vnni(t) => Some(t),
            _ => None,
        }
    }

    /// The NEON token when this instruction set includes NEON, for kernels that have no
    /// dot-product version.
    #[cfg(target_arch = "aarch64")]
    pub fn neon(self) -> Option<CpuSupport> {
        match self {
            Isa::Neon(t) | Isa::NeonDot(t) => Some(t),
            Isa::Scalar => None,
        }
    }

    /// A short lower-case name (`scalar`, `avx2`, `avx512`, `avx512vnni`, `neon`,
    /// `neondot`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(_) => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(_) => "avx512",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni(_) => "avx512vnni",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon(_) => "neon",
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot(_) => "neondot",
        }
    }

    /// The supported instruction set called `name` (see [`Isa::name`]), if any.
    pub fn by_name(name: &str) -> Option<Isa> {
        Isa::available().iter().copied().find(|i| i.name() == name)
    }
}

#[allow(unused_mut)]
fn detect() -> Vec<Isa> {
    let mut found = vec![Isa::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            found.push(Isa::Avx2(CpuSupport(())));
            if has!("avx512f") {
                found.push(Isa::Avx512(CpuSupport(())));
                if has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                    found.push(Isa::Avx512Vnni(CpuSupport(())));
                }
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            found.push(Isa::Neon(CpuSupport(())));
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                found.push(Isa::NeonDot(CpuSupport(())));
            }
        }
    }
    found
}

/// Which instruction set each kernel family uses on this CPU: one slot per family,
/// filled once at start-up with the best version that exists for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// The packed f32 GEMM micro-kernel (AVX-512, AVX2 or NEON).
    pub gemm: Isa,
    /// The matrix-vector dot-product rows (AVX-512, AVX2 or NEON).
    pub gemv: Isa,
    /// The attention inner loops (AVX-512 for the blocked query-key scores, AVX2 for the
    /// rest; or NEON).
    pub attention: Isa,
    /// The int8 x int4 / int8 x int8 products of dynamically quantized linear layers
    /// ([`crate::quant`]): AVX-512 VNNI, AVX2, NEON `sdot`, or the scalar twin.
    pub quant: Isa,
    /// The elementwise estimates of [`crate::approx`] (AVX-512 or AVX2 on x86; the
    /// correctly rounded scalar functions elsewhere).
    pub elementwise: Isa,
}

/// The dispatch table of this CPU (built on first use).
///
/// The environment variable `ETCH_ISA` (an [`Isa::name`], e.g. `avx2`) caps every
/// slot at that instruction set, for A/B measurements; an unknown or unsupported name
/// is ignored.
pub fn dispatch() -> &'static Dispatch {
    static TABLE: OnceLock<Dispatch> = OnceLock::new();
    TABLE.get_or_init(|| {
        let cap = std::env::var("ETCH_ISA")
            .ok()
            .and_then(|n| Isa::by_name(&n))
            .unwrap_or_else(Isa::best);
        Dispatch::for_isa(cap)
    })
}

impl Dispatch {
    /// The table that uses `isa` (or the best version below it) for every family.
    pub fn for_isa(isa: Isa) -> Dispatch {
        // The f32 kernels have no use for VNNI or sdot.
        let float = match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni(t) => Isa::Avx512(t),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot(t) => Isa::Neon(t),
            other => other,
        };
        let quant = match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(t) => Isa::Avx2(t),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon(_) => Isa::Scalar,
            other => other,
        };
        Dispatch {
            gemm: float,
            gemv: float,
            attention: float,
            quant,
            elementwise: float,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_portable_twin_is_always_available() {
        assert_eq!(Isa::available()[0], Isa::Scalar);
        assert!(Isa::available().contains(&Isa::best()));
        for &isa in Isa::available() {
            assert_eq!(Isa::by_name(isa.name()), Some(isa));
        }
        let d = dispatch();
        assert!(Isa::available().contains(&d.gemm));
        assert!(Isa::available().contains(&d.attention));
    }

    #[test]
    fn each_slot_takes_the_best_version_it_has() {
        let names: Vec<&str> = Isa::available().iter().map(|i| i.name()).collect();
        eprintln!("instruction sets of this CPU: {names:?}");
        let d = Dispatch::for_isa(Isa::best());
        #[cfg(target_arch = "x86_64")]
        if let Some(&vnni @ Isa::Avx512Vnni(_)) = Isa::available().last() {
            assert_eq!(d.quant, vnni);
            assert!(matches!(d.gemm, Isa::Avx512(_)));
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(&dot @ Isa::NeonDot(t)) = Isa::available().last() {
            assert_eq!(d.quant, dot);
            assert_eq!(d.gemm, Isa::Neon(t));
        }
        let _ = d;
    }
}
