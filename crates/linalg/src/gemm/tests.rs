use half::{bf16, f16};
use proptest::prelude::*;

use super::*;
use crate::test_util::{mat, rand_vec};

/// Which entry point a test runs a product through.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// [`gemm`].
    Gemm,
    /// [`gemm_split_depth`].
    SplitDepth,
}

impl Via {
    fn scratch_len(self, isa: Isa, g: &Gemm<'_>, threads: usize) -> usize {
        match self {
            Via::Gemm => scratch_len(isa, g, threads),
            Via::SplitDepth => split_depth_scratch_len(isa, g, threads),
        }
    }
}

/// The product `g` with the kernels of `isa` through `via`, into outputs of type `O`
/// (filled with `nan` first).
fn gemm_into<O: OutElem>(
    (pool, via): (&ThreadPool, Via),
    isa: Isa,
    g: &Gemm<'_>,
    scratch: &mut [f32],
    nan: O,
) -> Vec<O> {
    let mut out = vec![nan; g.a.rows * g.b.cols];
    match via {
        Via::Gemm => gemm(pool, isa, g, &mut out, scratch).unwrap(),
        Via::SplitDepth => {
            gemm_split_depth(pool, isa, g, DepthSplitB::View, &mut out, scratch).unwrap()
        }
    }
    out
}

/// Asserts `|got[i] - want[i]| <= tol(want[i])` for every output (`what` names the case).
fn assert_close<O: Copy + Into<f64> + std::fmt::Display>(
    got: &[O],
    want: &[f64],
    tol: impl Fn(f64) -> f64,
    what: &str,
) {
    for (idx, (&o, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (o.into() - w).abs() <= tol(w),
            "{what} at {idx}: {o} vs {w}"
        );
    }
}

/// Naive f64 reference of `alpha*A·B + beta*C` for the given views.
fn reference(g: &Gemm<'_>) -> Vec<f64> {
    let (m, n, k) = (g.a.rows, g.b.cols, g.a.cols);
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            for kk in 0..k {
                s += get(&g.a.data, g.a.offset + i * g.a.rs + kk * g.a.cs) as f64
                    * get(&g.b.data, g.b.offset + kk * g.b.rs + j * g.b.cs) as f64;
            }
            let mut v = g.alpha as f64 * s;
            if let Some((c, beta)) = &g.addend
                && *beta != 0.0
            {
                v += *beta as f64 * get(&c.data, c.offset + i * c.rs + j * c.cs) as f64;
            }
            out[i * n + j] = v;
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
enum Dt {
    F32,
    F16,
    Bf16,
}

fn convert(v: &[f32], dt: Dt) -> (Vec<f32>, Vec<f16>, Vec<bf16>) {
    match dt {
        Dt::F32 => (v.to_vec(), vec![], vec![]),
        Dt::F16 => (
            vec![],
            v.iter().map(|&x| f16::from_f32(x)).collect(),
            vec![],
        ),
        Dt::Bf16 => (
            vec![],
            vec![],
            v.iter().map(|&x| bf16::from_f32(x)).collect(),
        ),
    }
}

fn elems<'a>(c: &'a (Vec<f32>, Vec<f16>, Vec<bf16>), dt: Dt) -> Elems<'a> {
    match dt {
        Dt::F32 => Elems::F32(&c.0),
        Dt::F16 => Elems::F16(&c.1),
        Dt::Bf16 => Elems::BF16(&c.2),
    }
}

#[allow(clippy::too_many_arguments)]
fn check(
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    dt: Dt,
    addend: u8,
    (threads, via): (usize, Via),
    seed: u64,
) {
    let av = convert(&rand_vec(m * k + 3, seed), dt);
    let bv = convert(&rand_vec(k * n + 5, seed + 1), dt);
    let cv = convert(&rand_vec(m * n + 1, seed + 2), dt);
    // A stored [m, k] (or [k, m] when transposed), at offset 3; B likewise at offset 5.
    let a = MatRef {
        data: elems(&av, dt),
        offset: 3,
        rows: m,
        cols: k,
        rs: if ta { 1 } else { k },
        cs: if ta { m } else { 1 },
    };
    let b = MatRef {
        data: elems(&bv, dt),
        offset: 5,
        rows: k,
        cols: n,
        rs: if tb { 1 } else { n },
        cs: if tb { k } else { 1 },
    };
    let add = match addend {
        0 => None,
        1 => Some((
            MatRef {
                data: elems(&cv, dt),
                offset: 0,
                rows: m,
                cols: n,
                rs: 0,
                cs: 1,
            },
            1.0,
        )),
        2 => Some((
            MatRef {
                data: elems(&cv, dt),
                offset: 1,
                rows: m,
                cols: n,
                rs: n,
                cs: 1,
            },
            -0.5,
        )),
        _ => Some((
            MatRef {
                data: elems(&cv, dt),
                offset: 0,
                rows: m,
                cols: n,
                rs: 1,
                cs: 0,
            },
            0.0,
        )),
    };
    let g = Gemm {
        a,
        b,
        alpha: if addend == 2 { 2.0 } else { 1.0 },
        addend: add,
        clamp: None,
    };
    let want = reference(&g);
    let pool = ThreadPool::new(threads).unwrap();
    for &isa in Isa::available() {
        // NaN scratch: callers pass stale scratch, so nothing may be read unwritten.
        let mut scratch = vec![f32::NAN; via.scratch_len(isa, &g, threads)];
        let tol = |w: f64| match dt {
            Dt::F32 => 1e-4 * (1.0 + w.abs()) * (1.0 + (k as f64).sqrt()),
            Dt::F16 => 2e-3 * (1.0 + w.abs()) + 1e-4 * k as f64,
            Dt::Bf16 => 1e-2 * (1.0 + w.abs()) + 1e-3 * k as f64,
        };
        let what =
            format!("{isa:?} {via:?} {dt:?} {m}x{n}x{k} ta={ta} tb={tb} add={addend} t={threads}");
        let (s, pool) = (&mut scratch, (&pool, via));
        match dt {
            Dt::F32 => assert_close(&gemm_into(pool, isa, &g, s, f32::NAN), &want, tol, &what),
            Dt::F16 => assert_close(&gemm_into(pool, isa, &g, s, f16::NAN), &want, tol, &what),
            Dt::Bf16 => assert_close(&gemm_into(pool, isa, &g, s, bf16::NAN), &want, tol, &what),
        }
    }
}

#[test]
fn gemm_edge_shapes() {
    for (m, n, k) in [
        (1, 1, 1),
        (1, 17, 33),
        (7, 1, 9),
        (6, 16, 256),
        (7, 17, 257),
        (13, 300, 5),
        (2, 3, 0),
        (0, 4, 4),
        (4, 0, 4),
        (260, 40, 20),
        // More rows than read B in place, and a block of B too large for L1: packed.
        (100, 70, 200),
        // A read in place (whole panels at 6 and 8 rows) in blocks of more than 256 rows.
        (528, 40, 300),
        // A short K: rows of whole tiles in one kernel call, a narrower last tile and
        // rows of panels past the last whole one.
        (20, 130, 8),
        (48, 200, 24),
    ] {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for how in [(2, Via::Gemm), (3, Via::SplitDepth)] {
                check(m, n, k, ta, tb, Dt::F32, (m + n) as u8 % 4, how, 7);
            }
        }
    }
}

#[test]
fn gemm_half_types() {
    for dt in [Dt::F16, Dt::Bf16] {
        for (m, n, k) in [(1, 40, 70), (9, 33, 300), (3, 1, 17)] {
            check(m, n, k, false, true, dt, 1, (2, Via::Gemm), 11);
            check(m, n, k, false, false, dt, 2, (1, Via::Gemm), 12);
            check(m, n, k, false, false, dt, 2, (2, Via::SplitDepth), 13);
        }
    }
}

#[test]
fn gemm_rejects_bad_views() {
    let a = vec![0f32; 6];
    let b = vec![0f32; 6];
    let pool = ThreadPool::serial();
    let good = Gemm {
        a: MatRef {
            data: Elems::F32(&a),
            offset: 0,
            rows: 2,
            cols: 3,
            rs: 3,
            cs: 1,
        },
        b: MatRef {
            data: Elems::F32(&b),
            offset: 0,
            rows: 3,
            cols: 2,
            rs: 2,
            cs: 1,
        },
        alpha: 1.0,
        addend: None,
        clamp: None,
    };
    let mut out = vec![0f32; 4];
    let mut scratch = vec![0f32; scratch_len(Isa::Scalar, &good, 1)];
    gemm(&pool, Isa::Scalar, &good, &mut out, &mut scratch).unwrap();
    let mut bad = good;
    bad.a.offset = 1;
    assert!(gemm(&pool, Isa::Scalar, &bad, &mut out, &mut scratch).is_err());
    let mut bad = good;
    bad.b.rows = 2;
    assert!(gemm(&pool, Isa::Scalar, &bad, &mut out, &mut scratch).is_err());
    let mut small = vec![0f32; 3];
    assert!(gemm(&pool, Isa::Scalar, &good, &mut small, &mut scratch).is_err());
    assert!(gemm(&pool, Isa::Scalar, &good, &mut out, &mut []).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn gemm_matches_reference(
        m in 0usize..40, n in 0usize..70, k in 0usize..300,
        ta in any::<bool>(), tb in any::<bool>(), addend in 0u8..4, threads in 1usize..4, seed in any::<u64>(),
    ) {
        check(m, n, k, ta, tb, Dt::F32, addend, (threads, Via::Gemm), seed);
    }

    /// The depth-split product: the same values (within rounding) on any thread count,
    /// with every finish, strided and transposed operands.
    #[test]
    fn split_depth_matches_reference(
        m in 0usize..40, n in 0usize..70, k in 0usize..300,
        ta in any::<bool>(), tb in any::<bool>(), addend in 0u8..4, threads in 1usize..5, seed in any::<u64>(),
    ) {
        check(m, n, k, ta, tb, Dt::F32, addend, (threads, Via::SplitDepth), seed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// One row against B with contiguous rows (the row-by-row path), across its
    /// 512-column blocks and thread splits, of the columns or (deep enough) the depth.
    #[test]
    fn row_times_contiguous_rows_matches_reference(
        n in 2usize..1200, k in 1usize..700, ta in any::<bool>(), addend in 0u8..4,
        threads in 1usize..4, seed in any::<u64>(),
    ) {
        check(1, n, k, ta, false, Dt::F32, addend, (threads, Via::Gemm), seed);
    }
}

/// Naive f64 `clamp(A·B + bias)` with B as `[k, n]`.
fn reference_f32(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b_kn: &[f32],
    bias: Option<&[f32]>,
    clamp: Option<(f32, f32)>,
) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s: f64 = (0..k)
                .map(|kk| a[i * k + kk] as f64 * b_kn[kk * n + j] as f64)
                .sum();
            if let Some(b) = bias {
                s += b[j] as f64;
            }
            if let Some((lo, hi)) = clamp {
                s = s.clamp(lo as f64, hi as f64);
            }
            out[i * n + j] = s;
        }
    }
    out
}

/// The public f32 entry point, every layout of B and every instruction set, against
/// the naive product.
fn check_f32_api(
    m: usize,
    n: usize,
    k: usize,
    with_bias: bool,
    with_clamp: bool,
    threads: usize,
    seed: u64,
) {
    let a = rand_vec(m * k, seed);
    let b_kn = rand_vec(k * n, seed + 1);
    let mut b_nk = vec![0f32; n * k];
    for kk in 0..k {
        for j in 0..n {
            b_nk[j * k + kk] = b_kn[kk * n + j];
        }
    }
    let bias = rand_vec(n, seed + 2);
    let bias = with_bias.then_some(&bias[..]);
    let clamp = with_clamp.then_some((-0.5f32, 0.75f32));
    let want = reference_f32(m, n, k, &a, &b_kn, bias, clamp);
    let pool = ThreadPool::new(threads).unwrap();
    for &isa in Isa::available() {
        let packed = PackedB::pack(isa, &b_nk, n, k, true).unwrap();
        let packed_kn = PackedB::pack(isa, &b_kn, n, k, false).unwrap();
        for b in [
            RhsF32::NK(&b_nk),
            RhsF32::KN(&b_kn),
            RhsF32::Packed(&packed),
            RhsF32::Packed(&packed_kn),
        ] {
            let p = GemmF32 {
                m,
                n,
                k,
                a: &a,
                lda: k,
                b,
                bias,
                clamp,
            };
            let mut scratch = vec![0f32; p.scratch_len_with(isa, threads)];
            let mut out = vec![f32::NAN; m * n];
            gemm_f32_with(&pool, isa, &p, &mut out, &mut scratch).unwrap();
            let tol = |w: f64| 1e-4 * (1.0 + w.abs()) * (1.0 + (k as f64).sqrt());
            assert_close(&out, &want, tol, &format!("{isa:?} {b:?} {m}x{n}x{k}"));
        }
    }
}

#[test]
fn gemm_f32_api_shapes() {
    for (m, n, k) in [
        (1, 1, 1),
        (1, 70, 33),
        (5, 1, 9),
        (8, 32, 256),
        (13, 300, 5),
        (2, 3, 0),
        (0, 4, 4),
        (9, 65, 300),
        // One row against a packed B, split over threads, with a ragged last panel.
        (1, 1000, 300),
    ] {
        check_f32_api(m, n, k, true, true, 2, 3);
        check_f32_api(m, n, k, false, false, 1, 4);
    }
}

#[test]
fn gemm_f32_api_rejects_bad_operands() {
    let pool = ThreadPool::serial();
    let a = vec![0f32; 6];
    let w = vec![0f32; 6];
    let good = GemmF32 {
        m: 2,
        n: 2,
        k: 3,
        a: &a,
        lda: 3,
        b: RhsF32::NK(&w),
        bias: None,
        clamp: None,
    };
    let mut out = vec![0f32; 4];
    let mut scratch = vec![0f32; good.scratch_len(1)];
    gemm_f32(&pool, &good, &mut out, &mut scratch).unwrap();
    let short = GemmF32 {
        b: RhsF32::NK(&w[..5]),
        ..good
    };
    assert!(gemm_f32(&pool, &short, &mut out, &mut scratch).is_err());
    let bias = [1f32; 3];
    let bad_bias = GemmF32 {
        bias: Some(&bias),
        ..good
    };
    assert!(gemm_f32(&pool, &bad_bias, &mut out, &mut scratch).is_err());
    let bad_clamp = GemmF32 {
        clamp: Some((1.0, -1.0)),
        ..good
    };
    assert!(gemm_f32(&pool, &bad_clamp, &mut out, &mut scratch).is_err());
    let packed = PackedB::from_nk(&w, 3, 2).unwrap();
    let wrong_pack = GemmF32 {
        b: RhsF32::Packed(&packed),
        ..good
    };
    assert!(gemm_f32(&pool, &wrong_pack, &mut out, &mut scratch).is_err());
    assert!(gemm_f32(&pool, &good, &mut out[..3], &mut scratch).is_err());
    assert!(PackedB::from_nk(&w, 4, 2).is_err());
    let big = GemmF32 {
        m: 7,
        n: 40,
        ..good
    };
    assert!(gemm_f32(&pool, &big, &mut out, &mut []).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn gemm_f32_api_matches_reference(
        m in 0usize..30, n in 0usize..80, k in 0usize..200,
        bias in any::<bool>(), clamp in any::<bool>(), threads in 1usize..4, seed in any::<u64>(),
    ) {
        check_f32_api(m, n, k, bias, clamp, threads, seed);
    }

    /// Every instruction set's GEMM against the scalar twin's, on the same operands.
    #[test]
    fn gemm_matches_the_scalar_twin(
        m in 1usize..40, n in 1usize..90, k in 1usize..300, seed in any::<u64>(),
    ) {
        let a = rand_vec(m * k, seed);
        let b = rand_vec(k * n, seed + 1);
        let pool = ThreadPool::new(2).unwrap();
        let p = GemmF32 { m, n, k, a: &a, lda: k, b: RhsF32::KN(&b), bias: None, clamp: None };
        let mut want = vec![0f32; m * n];
        let mut scratch = vec![0f32; p.scratch_len_with(Isa::Scalar, 2)];
        gemm_f32_with(&pool, Isa::Scalar, &p, &mut want, &mut scratch).unwrap();
        for &isa in Isa::available() {
            let mut got = vec![0f32; m * n];
            let mut scratch = vec![0f32; p.scratch_len_with(isa, 2)];
            gemm_f32_with(&pool, isa, &p, &mut got, &mut scratch).unwrap();
            for (g, w) in got.iter().zip(&want) {
                prop_assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()) * (1.0 + (k as f32).sqrt()));
            }
        }
    }
}

/// The finish the micro-kernels apply as they store (a bias per row or per column, then
/// a clamp) gives exactly the bits of finishing the plain product afterwards with
/// `output_clamp(v + bias)`, on every instruction set, for partial tiles, several
/// blocks of K and several tasks.
#[test]
fn the_finish_in_the_micro_kernel_is_the_finish_afterwards() {
    for (m, n, k) in [
        (8, 32, 16),
        (13, 70, 300),
        (37, 600, 40),
        (3, 5, 7),
        (96, 196, 24),
        (21, 130, 8),
    ] {
        let a = rand_vec(m * k, 3);
        let b = rand_vec(k * n, 4);
        let bias = rand_vec(m.max(n), 5);
        let plain = product_of(mat(&a, m, k, k, 1), mat(&b, k, n, n, 1));
        for (threads, via) in [1, 2, 3]
            .into_iter()
            .flat_map(|t| [(t, Via::Gemm), (t, Via::SplitDepth)])
        {
            let pool = ThreadPool::new(threads).unwrap();
            let pool = (&pool, via);
            for &isa in Isa::available() {
                let mut scratch = vec![f32::NAN; via.scratch_len(isa, &plain, threads)];
                let p = gemm_into(pool, isa, &plain, &mut scratch, f32::NAN);
                for (per_row, clamp) in [
                    (true, Some((-0.5, 0.75))),
                    (false, Some((0.0, f32::INFINITY))),
                    (true, None),
                ] {
                    let addend = if per_row {
                        mat(&bias, m, n, 1, 0)
                    } else {
                        mat(&bias, m, n, 0, 1)
                    };
                    let g = Gemm {
                        addend: Some((addend, 1.0)),
                        clamp,
                        ..plain
                    };
                    let got = gemm_into(pool, isa, &g, &mut scratch, f32::NAN);
                    for (idx, (&got, &v)) in got.iter().zip(&p).enumerate() {
                        let (i, j) = (idx / n, idx % n);
                        let add = if per_row { bias[i] } else { bias[j] };
                        let want = clamp.map_or(v + add, |c| output_clamp(v + add, c));
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{isa:?} {via:?} {m}x{n}x{k} t={threads} ({i}, {j})"
                        );
                    }
                }
            }
        }
    }
}

/// `a · b` with no finish.
fn product_of<'a>(a: MatRef<'a>, b: MatRef<'a>) -> Gemm<'a> {
    Gemm {
        a,
        b,
        alpha: 1.0,
        addend: None,
        clamp: None,
    }
}

/// However many threads the pool has, a round never has more column blocks than an
/// output can be split into.
#[test]
fn a_round_has_at_most_the_column_blocks_an_output_splits_into() {
    for &isa in Isa::available() {
        for threads in [1, 2, 64, 65, 200] {
            let p = Plan::new(Tile::of(isa), 64, 1_000_000, threads);
            assert!(p.tasks >= 1 && p.tasks <= threads.min(ColumnBlocks::<f32>::MAX_BLOCKS));
        }
    }
}

/// A block whose columns split unevenly over the threads (a 14x14 plane's 196
/// columns, 7 panels, over two) or whose rows are not whole cache lines is split by
/// rows instead, as is one where both cost the same; a wide one by columns only; the
/// parts cover the block.
#[test]
fn an_uneven_column_split_gives_way_to_a_row_split() {
    let tile = Tile { mr: 8, nr: 32 };
    let plan = Plan::into_output(tile, 384, 196, 2, true);
    assert_eq!(plan.grid(384, 196), (192, 224));
    assert_eq!(plan.grid(384, 12544), (384, 6272));
    // A tie (784 columns, whole lines: 2 x 1 and 1 x 2 cost the same) goes to rows.
    let plan = Plan::into_output(tile, 192, 784, 2, true);
    assert_eq!(plan.grid(192, 784), (96, 800));
    // 49 columns would share a cache line in every row between two column spans.
    let plan = Plan::into_output(tile, 960, 49, 2, true);
    assert_eq!(plan.grid(960, 49), (480, 64));
    assert_eq!(plan.grid(8, 49), (8, 64));
    // 64 columns fill whole lines: two spans of one panel each.
    assert_eq!(plan.grid(960, 64), (960, 32));
    for threads in [1, 2, 3, 7, 16, 64, 100] {
        for (mb, n) in [(1, 1), (8, 49), (384, 196), (13, 1000), (512, 3136)] {
            let plan = Plan::into_output(tile, mb, n, threads, true);
            let (rows, cols) = plan.grid(mb, n);
            let parts = mb.div_ceil(rows) * n.div_ceil(cols);
            assert!(parts <= plan.most_tasks && plan.most_tasks <= threads.clamp(1, 64));
            assert!(
                rows % tile.mr == 0 && cols % tile.nr == 0,
                "{threads} {mb}x{n}"
            );
            // The scratch bound covers the tasks that write the output directly ...
            let bound = Plan::new(tile, mb, n, threads);
            assert!(bound.tasks_len() >= plan.most_tasks * plan.task_len());
            assert!(bound.tasks_len() >= bound.tasks * bound.task_len());
        }
    }
    // ... without a private tile for each of them: 49 columns on 16 threads have 2
    // tiled tasks, not 16.
    let bound = Plan::new(tile, 960, 49, 16);
    assert!(bound.tasks_len() < bound.most_tasks * bound.task_len());
}

/// An im2col operand whose planes are shorter than its geometry, or whose shape is not
/// the geometry's, is refused with an error, not read out of bounds.
#[test]
fn gemm_im2col_refuses_planes_that_do_not_fit() {
    use crate::conv::ConvGeometry;
    use crate::conv_nchw::Im2col;
    let g = ConvGeometry::same_on_both_axes((4, 4), (3, 3), (1, 1), (1, 2, 8));
    let (patch, px) = (g.patch_len(), g.out_pixels());
    let filter = vec![0.5f32; 8 * patch];
    let mm = product_of(mat(&filter, 8, patch, patch, 1), mat(&[], patch, px, px, 1));
    let pool = ThreadPool::new(1).unwrap();
    let isa = Isa::Scalar;
    let mut scratch = vec![0f32; im2col_scratch_len(isa, &mm, 1)];
    let mut out = vec![0f32; 8 * px];
    let short = vec![1f32; 2 * 16 - 1];
    let image = Im2col::new(g, &short);
    let err = gemm_im2col(&pool, isa, &mm, &image, &mut out, &mut scratch).unwrap_err();
    assert!(err.to_string().contains("planes of 31 values"), "{err}");
    let planes = vec![1f32; 2 * 16];
    let wrong = product_of(
        mat(&filter, 8, patch - 1, patch, 1),
        mat(&[], patch - 1, px, px, 1),
    );
    let image = Im2col::new(g, &planes);
    assert!(gemm_im2col(&pool, isa, &wrong, &image, &mut out, &mut scratch).is_err());
    gemm_im2col(&pool, isa, &mm, &image, &mut out, &mut scratch).unwrap();
}

/// [`gemm_f32_rows_alone`] and [`gemm_rows_alone`]: `m` rows in one call give the bits
/// each row gives alone through the ordinary product, for a packed B, a `[n, k]` B of
/// f32 and bf16, and a `[k, n]` B (row by row), on 1 to 3 threads.
#[test]
fn rows_alone_give_the_bits_of_one_row() {
    use crate::{GemmF32, PackedB, RhsF32, gemm_f32, gemm_f32_rows_alone};
    let shapes = [
        (4usize, 576usize, 576usize),
        (3, 70, 1536),
        (8, 33, 96),
        (2, 200, 64),
    ];
    for (m, n, k) in shapes {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 + 11) % 201) as f32 / 50.0 - 2.1)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 13 + 5) % 97) as f32 / 40.0 - 1.2)
            .collect();
        let bias: Vec<f32> = (0..n).map(|j| j as f32 / 10.0 - 0.3).collect();
        let packed = PackedB::from_nk(&w, n, k).unwrap();
        let w_bf16: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            for rhs in [RhsF32::Packed(&packed), RhsF32::NK(&w), RhsF32::KN(&w)] {
                let problem = |rows: usize, row: usize| GemmF32 {
                    m: rows,
                    n,
                    k,
                    a: &a[row * k..],
                    lda: k,
                    b: rhs,
                    bias: Some(&bias),
                    clamp: Some((-40.0, 40.0)),
                };
                let g = problem(m, 0);
                let mut together = vec![0f32; m * n];
                let mut scratch = vec![0f32; g.rows_alone_scratch_len(threads)];
                gemm_f32_rows_alone(&pool, &g, &mut together, &mut scratch).unwrap();
                for r in 0..m {
                    let one = problem(1, r);
                    let mut alone = vec![0f32; n];
                    let mut scratch = vec![0f32; one.scratch_len(threads)];
                    gemm_f32(&pool, &one, &mut alone, &mut scratch).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&together[r * n..(r + 1) * n]),
                        bits(&alone),
                        "{rhs:?} m{m} n{n} k{k} threads {threads}: row {r}"
                    );
                }
            }
            // A bf16 `[n, k]` weight into bf16 outputs (a half-precision linear).
            let isa = crate::dispatch().gemm;
            let problem = |rows: usize, offset: usize| Gemm {
                a: MatRef {
                    data: Elems::F32(&a),
                    offset,
                    rows,
                    cols: k,
                    rs: k,
                    cs: 1,
                },
                b: MatRef {
                    data: Elems::BF16(&w_bf16),
                    offset: 0,
                    rows: k,
                    cols: n,
                    rs: 1,
                    cs: k,
                },
                alpha: 1.0,
                addend: Some((
                    MatRef {
                        data: Elems::F32(&bias),
                        offset: 0,
                        rows,
                        cols: n,
                        rs: 0,
                        cs: 1,
                    },
                    1.0,
                )),
                clamp: None,
            };
            let g = problem(m, 0);
            let mut together = vec![bf16::ZERO; m * n];
            let mut scratch = vec![0f32; rows_alone_scratch_len(isa, &g, threads)];
            gemm_rows_alone(&pool, isa, &g, &mut together, &mut scratch).unwrap();
            for r in 0..m {
                let one = problem(1, r * k);
                let mut alone = vec![bf16::ZERO; n];
                let mut scratch = vec![0f32; scratch_len(isa, &one, threads)];
                gemm(&pool, isa, &one, &mut alone, &mut scratch).unwrap();
                assert_eq!(
                    &together[r * n..(r + 1) * n],
                    &alone[..],
                    "bf16 m{m} row {r}"
                );
            }
        }
    }
}
