//! Inner kernels of the matrix products: the GEMM micro-kernel over packed panels and
//! the dot-product rows of the matrix-vector path.
//!
//! Each kernel has a safe scalar version (written lane-wise so compilers vectorise
//! it) and a SIMD version per architecture, chosen at run time: AVX2+FMA on x86-64
//! (`is_x86_feature_detected!`), NEON on aarch64 (`is_aarch64_feature_detected!`;
//! NEON and FMA are part of the base aarch64 ABI, so in practice always). Tests compare
//! every version the CPU supports with the scalar one.

use half::{bf16, f16};

/// Rows of the micro-kernel tile (A panel height).
pub(crate) const MR: usize = 6;
/// Columns of the micro-kernel tile (B panel width).
pub(crate) const NR: usize = 16;

/// Which implementation the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// The best implementation this CPU supports.
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                return Isa::Neon;
            }
        }
        Isa::Scalar
    }

    /// Every implementation this CPU supports (for tests).
    #[cfg(test)]
    pub(crate) fn available() -> &'static [Isa] {
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::detect() == Isa::Avx2 {
                return &[Isa::Scalar, Isa::Avx2];
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if Isa::detect() == Isa::Neon {
                return &[Isa::Scalar, Isa::Neon];
            }
        }
        &[Isa::Scalar]
    }
}

/// `tile[MR x NR] (+)= A_panel · B_panel` over `kc` steps; `a` holds `kc` groups of
/// `MR` values, `b` `kc` groups of `NR`. Writes the `rows x cols` corner of the tile
/// to `c` (row stride `ldc`), adding to it when `accumulate`.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn micro_kernel(
    isa: Isa,
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    let a = &a[..kc * MR];
    let b = &b[..kc * NR];
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(rows <= MR && cols <= NR && c.len() >= (rows - 1) * ldc + cols);
    // The SIMD kernel of this ISA: it needs its instruction set, `kc*MR` values at `a`,
    // `kc*NR` at `b`, and a full MR x NR tile at `c` with row stride `ldc`.
    let simd: Option<SimdKernel> = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(x86::kernel_6x16),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => Some(neon::kernel_6x16),
        Isa::Scalar => None,
    };
    match simd {
        Some(kernel) if rows == MR && cols == NR => {
            // SAFETY: a SIMD Isa is only chosen after its instructions were detected;
            // a and b hold kc*MR and kc*NR values, and c holds a full MR x NR tile at
            // row stride ldc (checked above).
            unsafe { kernel(kc, a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), ldc, accumulate) };
        }
        Some(kernel) => {
            let mut tile = [0f32; MR * NR];
            // SAFETY: as above, with the local tile (row stride NR) as c.
            unsafe { kernel(kc, a.as_ptr(), b.as_ptr(), tile.as_mut_ptr(), NR, false) };
            store_tile(&tile, c, ldc, rows, cols, accumulate);
        }
        None => {
            let mut tile = [0f32; MR * NR];
            kernel_scalar(kc, a, b, &mut tile);
            store_tile(&tile, c, ldc, rows, cols, accumulate);
        }
    }
}

/// A SIMD micro-kernel: `(kc, a, b, c, ldc, accumulate)`, see [`micro_kernel`].
type SimdKernel = unsafe fn(usize, *const f32, *const f32, *mut f32, usize, bool);

fn store_tile(
    tile: &[f32; MR * NR],
    c: &mut [f32],
    ldc: usize,
    rows: usize,
    cols: usize,
    acc: bool,
) {
    for r in 0..rows {
        let dst = &mut c[r * ldc..r * ldc + cols];
        let src = &tile[r * NR..r * NR + cols];
        if acc {
            dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
        } else {
            dst.copy_from_slice(src);
        }
    }
}

/// The scalar micro-kernel.
pub(crate) fn kernel_scalar(kc: usize, a: &[f32], b: &[f32], tile: &mut [f32; MR * NR]) {
    for (ak, bk) in a.chunks_exact(MR).zip(b.chunks_exact(NR)).take(kc) {
        for (r, &av) in ak.iter().enumerate() {
            let row = &mut tile[r * NR..(r + 1) * NR];
            for (t, &bv) in row.iter_mut().zip(bk) {
                *t += av * bv;
            }
        }
    }
}

/// Weight element types of the matrix-vector path.
pub(crate) trait WeightElem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
}
impl WeightElem for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}
impl WeightElem for f16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}
impl WeightElem for f64 {
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
}
impl WeightElem for bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Lanes of the scalar dot product (independent partial sums).
const LANES: usize = 8;

/// Scalar dot product of `x` with `w[..x.len()]`, lane-wise.
pub(crate) fn dot_scalar<W: WeightElem>(x: &[f32], w: &[W]) -> f32 {
    let k = x.len();
    let w = &w[..k];
    let mut acc = [0f32; LANES];
    let mut xc = x.chunks_exact(LANES);
    let mut wc = w.chunks_exact(LANES);
    for (xs, ws) in (&mut xc).zip(&mut wc) {
        for l in 0..LANES {
            acc[l] += xs[l] * ws[l].to_f32();
        }
    }
    let mut tail = 0f32;
    for (&xv, wv) in xc.remainder().iter().zip(wc.remainder()) {
        tail += xv * wv.to_f32();
    }
    let mut s = 0f32;
    for v in acc {
        s += v;
    }
    s + tail
}

/// `out[j] = dot(x, w[j*ldw..][..k])` for every `j < out.len()`.
pub(crate) fn dot_rows<W: WeightElem>(isa: Isa, x: &[f32], w: &[W], ldw: usize, out: &mut [f32]) {
    let k = x.len();
    let rows = out.len();
    if rows == 0 {
        return;
    }
    assert!(w.len() >= (rows - 1) * ldw + k);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::dot_rows(x, w, ldw, out),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::dot_rows(x, w, ldw, out),
        Isa::Scalar => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = dot_scalar(x, &w[j * ldw..j * ldw + k]);
            }
        }
    }
}

/// Runs `out[j] = dot(x, row j)` over rows of `k` weights at stride `ldw`: `four` on
/// each full group of 4 rows, `one` on the rows left over. Every row is handed over as
/// a slice of exactly `k` elements, which the SIMD versions rely on.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn by_four_rows<W: WeightElem>(
    k: usize,
    w: &[W],
    ldw: usize,
    out: &mut [f32],
    four: impl Fn([&[W]; 4]) -> [f32; 4],
    one: impl Fn(&[W]) -> f32,
) {
    let row = |j: usize| &w[j * ldw..j * ldw + k];
    let done = out.len() / 4 * 4;
    let (full, rest) = out.split_at_mut(done);
    for (g, dst) in full.chunks_exact_mut(4).enumerate() {
        let j = 4 * g;
        dst.copy_from_slice(&four([row(j), row(j + 1), row(j + 2), row(j + 3)]));
    }
    for (i, o) in rest.iter_mut().enumerate() {
        *o = one(row(done + i));
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::any::TypeId;
    use std::arch::x86_64::*;

    use half::{bf16, f16};

    use super::{MR, NR, WeightElem, dot_scalar};

    /// AVX2+FMA 6x16 micro-kernel: 12 accumulators, two B vectors, one A broadcast.
    ///
    /// # Safety
    /// Needs AVX2 and FMA. `a` must hold `kc*MR` floats, `b` `kc*NR`, and `c` a full
    /// `MR x NR` tile with row stride `ldc`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn kernel_6x16(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for k in 0..kc {
            // SAFETY: k < kc, so both reads stay inside the panels.
            let (b0, b1, ak) = unsafe {
                let bk = b.add(k * NR);
                (
                    _mm256_loadu_ps(bk),
                    _mm256_loadu_ps(bk.add(8)),
                    a.add(k * MR),
                )
            };
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: r < MR, inside this step's A group.
                let av = unsafe { _mm256_broadcast_ss(&*ak.add(r)) };
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
        }
        for (r, row) in acc.iter().enumerate() {
            // SAFETY: the tile has MR rows of NR floats at stride ldc.
            unsafe {
                let cr = c.add(r * ldc);
                let (mut v0, mut v1) = (row[0], row[1]);
                if accumulate {
                    v0 = _mm256_add_ps(v0, _mm256_loadu_ps(cr));
                    v1 = _mm256_add_ps(v1, _mm256_loadu_ps(cr.add(8)));
                }
                _mm256_storeu_ps(cr, v0);
                _mm256_storeu_ps(cr.add(8), v1);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Loads 8 weights as f32.
    ///
    /// # Safety
    /// Needs AVX2, FMA and F16C; `p` must point at 8 readable elements of `W`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8<W: WeightElem>(p: *const W) -> __m256 {
        // SAFETY: p points at 8 elements (caller); the type checks pick the layout.
        unsafe {
            if TypeId::of::<W>() == TypeId::of::<f32>() {
                _mm256_loadu_ps(p as *const f32)
            } else if TypeId::of::<W>() == TypeId::of::<f16>() {
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
            } else if TypeId::of::<W>() == TypeId::of::<bf16>() {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            } else {
                let mut v = [0f32; 8];
                for (l, o) in v.iter_mut().enumerate() {
                    *o = (*p.add(l)).to_f32();
                }
                _mm256_loadu_ps(v.as_ptr())
            }
        }
    }

    /// Dot products of `x` with 4 rows at once (shared loads of `x`, 8 accumulators).
    ///
    /// # Safety
    /// Needs AVX2, FMA and F16C; each `w[r]` must point at `x.len()` elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot4<W: WeightElem>(x: &[f32], w: [*const W; 4]) -> [f32; 4] {
        let k = x.len();
        let xp = x.as_ptr();
        let mut acc0 = [_mm256_setzero_ps(); 4];
        let mut acc1 = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 16 <= k {
            // SAFETY: i + 16 <= k, inside x and every row.
            unsafe {
                let x0 = _mm256_loadu_ps(xp.add(i));
                let x1 = _mm256_loadu_ps(xp.add(i + 8));
                for r in 0..4 {
                    acc0[r] = _mm256_fmadd_ps(load8(w[r].add(i)), x0, acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(load8(w[r].add(i + 8)), x1, acc1[r]);
                }
            }
            i += 16;
        }
        if i + 8 <= k {
            // SAFETY: i + 8 <= k.
            unsafe {
                let x0 = _mm256_loadu_ps(xp.add(i));
                for r in 0..4 {
                    acc0[r] = _mm256_fmadd_ps(load8(w[r].add(i)), x0, acc0[r]);
                }
            }
            i += 8;
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            let mut s = hsum(_mm256_add_ps(acc0[r], acc1[r]));
            for (j, &xv) in x.iter().enumerate().skip(i) {
                // SAFETY: j < k = x.len(), inside row r.
                s += xv * unsafe { *w[r].add(j) }.to_f32();
            }
            out[r] = s;
        }
        out
    }

    /// One row.
    ///
    /// # Safety
    /// Needs AVX2, FMA and F16C; `w` must point at `x.len()` elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot1<W: WeightElem>(x: &[f32], w: *const W) -> f32 {
        let k = x.len();
        let xp = x.as_ptr();
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= k {
            for (l, a) in acc.iter_mut().enumerate() {
                // SAFETY: i + 32 <= k.
                unsafe {
                    *a = _mm256_fmadd_ps(
                        load8(w.add(i + 8 * l)),
                        _mm256_loadu_ps(xp.add(i + 8 * l)),
                        *a,
                    );
                }
            }
            i += 32;
        }
        while i + 8 <= k {
            // SAFETY: i + 8 <= k.
            unsafe {
                acc[0] = _mm256_fmadd_ps(load8(w.add(i)), _mm256_loadu_ps(xp.add(i)), acc[0]);
            }
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum(s);
        // SAFETY: the tail indices are below k.
        let tail = unsafe { std::slice::from_raw_parts(w.add(i), k - i) };
        s += dot_scalar(&x[i..], tail);
        s
    }

    /// `out[j] = dot(x, w[j*ldw..][..k])`, 4 rows at a time.
    pub(super) fn dot_rows<W: WeightElem>(x: &[f32], w: &[W], ldw: usize, out: &mut [f32]) {
        super::by_four_rows(
            x.len(),
            w,
            ldw,
            out,
            // SAFETY: AVX2/FMA/F16C were detected before Isa::Avx2 was chosen; each row
            // slice holds x.len() elements.
            |r| unsafe { dot4(x, r.map(<[W]>::as_ptr)) },
            // SAFETY: as above, for one row.
            |r| unsafe { dot1(x, r.as_ptr()) },
        )
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::any::TypeId;
    use std::arch::aarch64::*;

    use half::bf16;

    use super::{MR, NR, WeightElem, dot_scalar};

    /// NEON 6x16 micro-kernel: 24 accumulator registers (4 per row), four B vectors,
    /// the A values broadcast from one load per step.
    ///
    /// # Safety
    /// Needs NEON. `a` must hold `kc*MR` floats, `b` `kc*NR`, and `c` a full `MR x NR`
    /// tile with row stride `ldc`.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn kernel_6x16(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc = [[vdupq_n_f32(0.0); 4]; MR];
        for k in 0..kc {
            // SAFETY: k < kc, so the 16 B values and the 6 A values of step k are inside
            // the panels.
            let (bv, ak) = unsafe {
                let bk = b.add(k * NR);
                (
                    [
                        vld1q_f32(bk),
                        vld1q_f32(bk.add(4)),
                        vld1q_f32(bk.add(8)),
                        vld1q_f32(bk.add(12)),
                    ],
                    a.add(k * MR),
                )
            };
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: r < MR, inside this step's A group.
                let av = unsafe { *ak.add(r) };
                for (reg, &bq) in row.iter_mut().zip(&bv) {
                    *reg = vfmaq_n_f32(*reg, bq, av);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (q, &v) in row.iter().enumerate() {
                // SAFETY: the tile has MR rows of NR floats at stride ldc; q*4+4 <= NR.
                unsafe {
                    let p = c.add(r * ldc + 4 * q);
                    let v = if accumulate {
                        vaddq_f32(v, vld1q_f32(p))
                    } else {
                        v
                    };
                    vst1q_f32(p, v);
                }
            }
        }
    }

    /// Loads 4 weights as f32 (f32 directly, bf16 by widening shifts, others lane by
    /// lane).
    ///
    /// # Safety
    /// Needs NEON; `p` must point at 4 readable elements of `W`.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load4<W: WeightElem>(p: *const W) -> float32x4_t {
        // SAFETY: p points at 4 elements (caller); the type checks pick the layout.
        unsafe {
            if TypeId::of::<W>() == TypeId::of::<f32>() {
                vld1q_f32(p as *const f32)
            } else if TypeId::of::<W>() == TypeId::of::<bf16>() {
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p as *const u16)))
            } else {
                let v = [
                    (*p).to_f32(),
                    (*p.add(1)).to_f32(),
                    (*p.add(2)).to_f32(),
                    (*p.add(3)).to_f32(),
                ];
                vld1q_f32(v.as_ptr())
            }
        }
    }

    /// Dot products of `x` with 4 rows at once (shared loads of `x`, 8 accumulators).
    ///
    /// # Safety
    /// Needs NEON; each `w[r]` must point at `x.len()` elements.
    #[target_feature(enable = "neon")]
    unsafe fn dot4<W: WeightElem>(x: &[f32], w: [*const W; 4]) -> [f32; 4] {
        let k = x.len();
        let xp = x.as_ptr();
        let mut acc0 = [vdupq_n_f32(0.0); 4];
        let mut acc1 = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 8 <= k {
            // SAFETY: i + 8 <= k, inside x and every row.
            unsafe {
                let x0 = vld1q_f32(xp.add(i));
                let x1 = vld1q_f32(xp.add(i + 4));
                for r in 0..4 {
                    acc0[r] = vfmaq_f32(acc0[r], load4(w[r].add(i)), x0);
                    acc1[r] = vfmaq_f32(acc1[r], load4(w[r].add(i + 4)), x1);
                }
            }
            i += 8;
        }
        let mut out = [0f32; 4];
        for r in 0..4 {
            let mut s = vaddvq_f32(vaddq_f32(acc0[r], acc1[r]));
            for (j, &xv) in x.iter().enumerate().skip(i) {
                // SAFETY: j < k = x.len(), inside row r.
                s += xv * unsafe { *w[r].add(j) }.to_f32();
            }
            out[r] = s;
        }
        out
    }

    /// `out[j] = dot(x, w[j*ldw..][..k])`, 4 rows at a time.
    pub(super) fn dot_rows<W: WeightElem>(x: &[f32], w: &[W], ldw: usize, out: &mut [f32]) {
        super::by_four_rows(
            x.len(),
            w,
            ldw,
            out,
            // SAFETY: NEON was detected before Isa::Neon was chosen; each row slice holds
            // x.len() elements.
            |r| unsafe { dot4(x, r.map(<[W]>::as_ptr)) },
            |r| dot_scalar(x, r),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn micro_kernels_agree() {
        for kc in [0usize, 1, 7, 64, 257] {
            let a = rand_vec(kc * MR, 1);
            let b = rand_vec(kc * NR, 2);
            let mut want = [0f32; MR * NR];
            for k in 0..kc {
                for r in 0..MR {
                    for j in 0..NR {
                        want[r * NR + j] += a[k * MR + r] * b[k * NR + j];
                    }
                }
            }
            for &isa in Isa::available() {
                for (rows, cols) in [(MR, NR), (1, 1), (5, 16), (6, 3), (2, 9)] {
                    let ldc = 20;
                    let mut c = vec![1f32; (rows - 1) * ldc + cols];
                    micro_kernel(isa, kc, &a, &b, &mut c, ldc, rows, cols, true);
                    for r in 0..rows {
                        for j in 0..cols {
                            let got = c[r * ldc + j];
                            let w = want[r * NR + j] + 1.0;
                            assert!(
                                (got - w).abs() <= 1e-4 * (1.0 + w.abs()),
                                "{isa:?} kc={kc} {r},{j}: {got} vs {w}"
                            );
                        }
                    }
                    // Cells outside the tile are untouched.
                    if cols < ldc && rows > 1 {
                        assert_eq!(c[cols], 1.0);
                    }
                }
            }
        }
    }

    #[test]
    fn dot_rows_agree() {
        for k in [0usize, 1, 7, 8, 15, 16, 31, 33, 576] {
            let x = rand_vec(k, 3);
            let rows = 7;
            let ldw = k + 3;
            let w32 = rand_vec(rows * ldw, 4);
            let w16: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
            let wb: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
            for &isa in Isa::available() {
                let mut o32 = vec![0f32; rows];
                let mut o16 = vec![0f32; rows];
                let mut ob = vec![0f32; rows];
                dot_rows(isa, &x, &w32, ldw, &mut o32);
                dot_rows(isa, &x, &w16, ldw, &mut o16);
                dot_rows(isa, &x, &wb, ldw, &mut ob);
                for j in 0..rows {
                    let row = &w32[j * ldw..j * ldw + k];
                    let r32: f64 = x.iter().zip(row).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let r16: f64 = x
                        .iter()
                        .zip(&w16[j * ldw..])
                        .map(|(&a, b)| a as f64 * b.to_f64())
                        .sum();
                    let rb: f64 = x
                        .iter()
                        .zip(&wb[j * ldw..])
                        .map(|(&a, b)| a as f64 * b.to_f64())
                        .sum();
                    let tol = 1e-5 * (k as f64 + 1.0);
                    assert!((o32[j] as f64 - r32).abs() < tol, "{isa:?} f32 k={k}");
                    assert!((o16[j] as f64 - r16).abs() < tol, "{isa:?} f16 k={k}");
                    assert!((ob[j] as f64 - rb).abs() < tol, "{isa:?} bf16 k={k}");
                }
            }
        }
    }
}
