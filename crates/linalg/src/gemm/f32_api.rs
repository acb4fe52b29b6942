//! The f32 GEMM entry point for callers outside the matmul ops (the XNNPACK
//! delegate's fully-connected and convolution nodes): `C = A·B (+ bias) (clamped)`,
//! with B given as `[n, k]`, `[k, n]` or packed once ahead of time.

use super::kernels::Tile;
use super::{Elems, Gemm, MatRef, scratch_len, scratch_len_tiled};
use etch_memory::WeightBuffer;

use crate::{Isa, LinalgError, ThreadPool, dispatch};

/// How the right-hand matrix `B` (`k x n`) of [`gemm_f32`] is stored.
#[derive(Clone, Copy, Debug)]
pub enum RhsF32<'a> {
    /// `[n, k]` row-major (`B` transposed): a PyTorch linear weight
    /// `[out_features, in_features]`.
    NK(&'a [f32]),
    /// `[k, n]` row-major.
    KN(&'a [f32]),
    /// Packed once with [`PackedB`] (for weights reused across calls).
    Packed(&'a PackedB),
}

/// One f32 product `out[m, n] = clamp(A[m, k] · B[k, n] + bias[n])`, see [`gemm_f32`].
#[derive(Clone, Copy, Debug)]
pub struct GemmF32<'a> {
    /// Rows of `A` and of the output.
    pub m: usize,
    /// Columns of `B` and of the output.
    pub n: usize,
    /// Columns of `A`, rows of `B`.
    pub k: usize,
    /// `A`: row `i` is `a[i * lda..][..k]`.
    pub a: &'a [f32],
    /// Row stride of `A` (at least `k`; `k` for a contiguous matrix).
    pub lda: usize,
    /// `B`.
    pub b: RhsF32<'a>,
    /// One value per output column, added to every row.
    pub bias: Option<&'a [f32]>,
    /// `(min, max)`: every output is clamped into it (XNNPACK's `output_min/max`).
    pub clamp: Option<(f32, f32)>,
}

impl GemmF32<'_> {
    /// Scratch (f32 elements) that [`gemm_f32`] needs for this product on a pool of
    /// `threads` threads. Depends only on `m`, `n`, `k`, the layout of `B` and
    /// `threads`, so a caller can size its scratch once per shape.
    pub fn scratch_len(&self, threads: usize) -> usize {
        self.scratch_len_with(self.isa(dispatch().gemm), threads)
    }

    pub(super) fn scratch_len_with(&self, isa: Isa, threads: usize) -> usize {
        match self.b {
            // One row streams the panels directly: it only copies A's row.
            RhsF32::Packed(_) if self.m == 1 && self.n > 0 => self.k,
            RhsF32::Packed(_) if self.m > 0 && self.n > 0 => {
                scratch_len_tiled(isa, (self.m, self.n, self.k), threads, false)
            }
            RhsF32::Packed(_) => 0,
            _ => match self.view(&[]) {
                Ok(g) => scratch_len(isa, &g, threads),
                Err(_) => 0,
            },
        }
    }

    /// Scratch (f32 elements) that [`gemm_f32_rows_alone`] needs on `threads` threads.
    pub fn rows_alone_scratch_len(&self, threads: usize) -> usize {
        let isa = self.isa(dispatch().gemm);
        let rows = match self.view(&[]) {
            Ok(g) => super::rows_alone::rows_alone_scratch_len(isa, &g, threads),
            Err(_) => 0,
        };
        rows.max(self.scratch_len(threads))
    }

    /// The instruction set the product runs with: a packed `B` fixes its own.
    fn isa(&self, isa: Isa) -> Isa {
        match self.b {
            RhsF32::Packed(p) => p.isa,
            _ => isa,
        }
    }

    /// The product as strided views (`placeholder` stands for a packed `B`).
    fn view<'a>(&'a self, placeholder: &'a [f32]) -> Result<Gemm<'a>, LinalgError> {
        let (m, n, k) = (self.m, self.n, self.k);
        if self.lda < k && m > 1 {
            return Err(LinalgError::Shape(format!(
                "row stride {} of A is below its {k} columns",
                self.lda
            )));
        }
        let (data, rs, cs) = match self.b {
            RhsF32::NK(w) => (w, 1, k),
            RhsF32::KN(w) => (w, n, 1),
            RhsF32::Packed(p) => {
                if (p.k, p.n) != (k, n) {
                    return Err(LinalgError::Shape(format!(
                        "packed B is {}x{}, the product needs {k}x{n}",
                        p.k, p.n
                    )));
                }
                (placeholder, 0, 0)
            }
        };
        let addend = match self.bias {
            None => None,
            Some(bias) if bias.len() == n => Some((
                MatRef {
                    data: Elems::F32(bias),
                    offset: 0,
                    rows: m,
                    cols: n,
                    rs: 0,
                    cs: 1,
                },
                1.0,
            )),
            Some(bias) => {
                return Err(LinalgError::Shape(format!(
                    "bias of {} values for {n} output columns",
                    bias.len()
                )));
            }
        };
        Ok(Gemm {
            a: MatRef {
                data: Elems::F32(self.a),
                offset: 0,
                rows: m,
                cols: k,
                rs: self.lda,
                cs: 1,
            },
            b: MatRef {
                data: Elems::F32(data),
                offset: 0,
                rows: k,
                cols: n,
                rs,
                cs,
            },
            alpha: 1.0,
            addend,
            clamp: self.clamp,
        })
    }
}

/// Computes `out[i * n + j] = clamp(Σ_k A[i, k] · B[k, j] + bias[j])` with the best
/// kernels of this CPU, in parallel on `pool`.
///
/// `out` holds at least `m * n` values (row-major); `scratch` at least
/// [`GemmF32::scratch_len`]`(pool.threads())` values, taken from the caller's temp
/// allocator (nothing is allocated here). Every length and view is checked first: a
/// mismatch is an error, never a panic.
pub fn gemm_f32(
    pool: &ThreadPool,
    p: &GemmF32<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    gemm_f32_with(pool, dispatch().gemm, p, out, scratch)
}

/// [`gemm_f32`] with the kernels of `isa` (for tests and A/B benchmarks; a packed `B`
/// keeps the instruction set it was packed for).
pub fn gemm_f32_with(
    pool: &ThreadPool,
    isa: Isa,
    p: &GemmF32<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    let isa = p.isa(isa);
    let g = p.view(&[])?;
    let src = match p.b {
        RhsF32::Packed(pb) => super::RightSource::Packed(pb),
        _ => super::RightSource::View,
    };
    let need = p.scratch_len_with(isa, pool.threads());
    if scratch.len() < need {
        return Err(LinalgError::ScratchTooSmall {
            what: "gemm_f32",
            need,
            len: scratch.len(),
        });
    }
    super::run(pool, isa, &g, src, out, scratch)
}

/// [`gemm_f32`] with every row of `A` computed as it is alone (bit for bit, on the same
/// pool): several sessions' one-row products against the same weights in one pass over
/// them (see `gemm::rows_alone`). `scratch` holds at least
/// [`GemmF32::rows_alone_scratch_len`] values.
pub fn gemm_f32_rows_alone(
    pool: &ThreadPool,
    p: &GemmF32<'_>,
    out: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), LinalgError> {
    let isa = p.isa(dispatch().gemm);
    let g = p.view(&[])?;
    let src = match p.b {
        RhsF32::Packed(pb) => super::RightSource::Packed(pb),
        _ => super::RightSource::View,
    };
    super::rows_alone::run_rows_alone(pool, isa, &g, src, out, scratch)
}

/// A `k x n` matrix `B` packed for the GEMM micro-kernel of one instruction set:
/// pack a weight once (at load time), then multiply by it any number of times
/// through [`RhsF32::Packed`] without repacking.
#[derive(Clone, Debug)]
pub struct PackedB {
    k: usize,
    n: usize,
    isa: Isa,
    nr: usize,
    /// Panel `q` (columns `q*nr..`), step `kk`, column `c` at `q*k*nr + kk*nr + c`;
    /// columns past `n` are zero. On huge pages when large: a decode step streams it
    /// whole.
    data: WeightBuffer<f32>,
}

impl PackedB {
    /// Packs `w`, a `[n, k]` row-major matrix (a PyTorch linear weight), for this
    /// CPU's GEMM kernels.
    pub fn from_nk(w: &[f32], n: usize, k: usize) -> Result<PackedB, LinalgError> {
        PackedB::pack(dispatch().gemm, w, n, k, true)
    }

    /// Packs `w`, a `[k, n]` row-major matrix, for this CPU's GEMM kernels.
    pub fn from_kn(w: &[f32], k: usize, n: usize) -> Result<PackedB, LinalgError> {
        PackedB::pack(dispatch().gemm, w, n, k, false)
    }

    /// Packs for the kernels of `isa`; `nk` says `w` is `[n, k]` (else `[k, n]`).
    pub fn pack(isa: Isa, w: &[f32], n: usize, k: usize, nk: bool) -> Result<PackedB, LinalgError> {
        let need = n.checked_mul(k).ok_or_else(|| {
            LinalgError::Shape(format!("a {k}x{n} matrix overflows the address space"))
        })?;
        if w.len() < need {
            return Err(LinalgError::ViewOutOfBounds {
                what: "packed B",
                rows: k,
                cols: n,
                len: w.len(),
            });
        }
        let nr = Tile::of(isa).nr;
        let panels = n.div_ceil(nr);
        let len = panels.checked_mul(k * nr).ok_or_else(|| {
            LinalgError::Shape(format!(
                "a {k}x{n} packed matrix overflows the address space"
            ))
        })?;
        let mut data = WeightBuffer::<f32>::zeroed(len)?;
        for (q, panel) in data
            .chunks_exact_mut((k * nr).max(1))
            .enumerate()
            .take(panels)
        {
            for c in 0..nr.min(n - q * nr) {
                let j = q * nr + c;
                for kk in 0..k {
                    panel[kk * nr + c] = if nk { w[j * k + kk] } else { w[kk * n + j] };
                }
            }
        }
        Ok(PackedB {
            k,
            n,
            isa,
            nr,
            data,
        })
    }

    /// Rows of `B` (the product's depth).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns of `B`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Bytes the packed panels hold (columns padded to the micro-kernel's width).
    pub fn packed_bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// The instruction set whose kernels this packing is for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Steps `k0..k0+kc` of panel `q`.
    pub(super) fn panel(&self, q: usize, k0: usize, kc: usize) -> &[f32] {
        &self.data[q * self.k * self.nr + k0 * self.nr..][..kc * self.nr]
    }
}
