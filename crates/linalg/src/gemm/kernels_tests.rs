use super::*;
use crate::test_util::rand_vec;

/// Every micro-kernel against the scalar twin of its own tile shape.
#[test]
fn micro_kernels_agree() {
    for &isa in Isa::available() {
        let t = Tile::of(isa);
        for kc in [0usize, 1, 7, 64, 257] {
            let a = rand_vec(kc * t.mr, 1);
            let b = rand_vec(kc * t.nr, 2);
            let mut want = vec![0f32; t.mr * t.nr];
            kernel_scalar(kc, t, APanel::Packed(&a), (&b, t.nr), &mut want);
            for (rows, cols) in [
                (t.mr, t.nr),
                (1, 1),
                (t.mr - 1, t.nr),
                (t.mr, 3),
                (2, 9),
                (t.mr, t.nr - 1),
                (t.mr, t.nr / 2 + 1),
            ] {
                let ldc = t.nr + 4;
                let mut c = vec![1f32; (rows - 1) * ldc + cols];
                micro_kernel_into_slice(isa, kc, &a, &b, &mut c, ldc, rows, cols, true);
                for r in 0..rows {
                    for j in 0..cols {
                        let got = c[r * ldc + j];
                        let w = want[r * t.nr + j] + 1.0;
                        assert!(
                            (got - w).abs() <= 1e-4 * (1.0 + w.abs()),
                            "{isa:?} kc={kc} {r},{j}: {got} vs {w}"
                        );
                    }
                }
                // Cells outside the tile are untouched (masked lanes store nothing).
                for r in 0..rows - 1 {
                    let outside = &c[r * ldc + cols..(r + 1) * ldc];
                    assert!(outside.iter().all(|&v| v == 1.0), "{isa:?} {rows}x{cols}");
                }
            }
        }
    }
}

/// Every panel product against the scalar twin, over depths around the unrolling.
#[test]
fn panel_dots_agree() {
    for &isa in Isa::available() {
        let nr = Tile::of(isa).nr;
        for k in [0usize, 1, 3, 4, 5, 8, 63, 576] {
            let x = rand_vec(k, 5);
            let panel = rand_vec(k * nr, 6);
            let mut want = vec![0f32; nr];
            panel_dot_scalar(&x, &panel, &mut want);
            let mut got = vec![f32::NAN; nr];
            panel_dot(isa, &x, &panel, &mut got);
            for (c, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + k as f32),
                    "{isa:?} k={k} column {c}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn dot_rows_agree() {
    for k in [0usize, 1, 7, 8, 15, 16, 31, 33, 63, 64, 65, 576] {
        let x = rand_vec(k, 3);
        let rows = 7;
        let ldw = k + 3;
        let w32 = rand_vec(rows * ldw, 4);
        let w16: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
        let wb: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
        let w64: Vec<f64> = w32.iter().map(|&v| v as f64).collect();
        for &isa in Isa::available() {
            let mut o32 = vec![0f32; rows];
            let mut o16 = vec![0f32; rows];
            let mut ob = vec![0f32; rows];
            let mut o64 = vec![0f32; rows];
            dot_rows(isa, &x, &w32, ldw, &mut o32);
            dot_rows(isa, &x, &w16, ldw, &mut o16);
            dot_rows(isa, &x, &wb, ldw, &mut ob);
            dot_rows(isa, &x, &w64, ldw, &mut o64);
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
                assert!((o64[j] as f64 - r32).abs() < tol, "{isa:?} f64 k={k}");
                assert!((o16[j] as f64 - r16).abs() < tol, "{isa:?} f16 k={k}");
                assert!((ob[j] as f64 - rb).abs() < tol, "{isa:?} bf16 k={k}");
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// The SIMD dot-product rows against the scalar twin on random lengths.
    #[test]
    fn dot_rows_match_the_scalar_twin(k in 0usize..300, rows in 1usize..12, pad in 0usize..5, seed in 0u64..1000) {
        let x = rand_vec(k, seed);
        let ldw = k + pad;
        let w = rand_vec((rows - 1) * ldw + k, seed + 1);
        let mut want = vec![0f32; rows];
        dot_rows(Isa::Scalar, &x, &w, ldw, &mut want);
        for &isa in Isa::available() {
            let mut got = vec![0f32; rows];
            dot_rows(isa, &x, &w, ldw, &mut got);
            for (g, w) in got.iter().zip(&want) {
                proptest::prop_assert!((g - w).abs() <= 1e-4 * (1.0 + (k as f32).sqrt()), "{:?}: {} vs {}", isa, g, w);
            }
        }
    }

    /// Every micro-kernel against the scalar twin on random depths and corners.
    #[test]
    fn micro_kernel_matches_the_scalar_twin(kc in 0usize..300, seed in 0u64..1000, rows_cut in 0usize..8, cols_cut in 0usize..32) {
        for &isa in Isa::available() {
            let t = Tile::of(isa);
            let a = rand_vec(kc * t.mr, seed);
            let b = rand_vec(kc * t.nr, seed + 7);
            let rows = t.mr - rows_cut % t.mr;
            let cols = t.nr - cols_cut % t.nr;
            let mut want = vec![0f32; t.mr * t.nr];
            kernel_scalar(kc, t, APanel::Packed(&a), (&b, t.nr), &mut want);
            let mut c = vec![0f32; (rows - 1) * t.nr + cols];
            micro_kernel_into_slice(isa, kc, &a, &b, &mut c, t.nr, rows, cols, false);
            for r in 0..rows {
                for j in 0..cols {
                    let (g, w) = (c[r * t.nr + j], want[r * t.nr + j]);
                    proptest::prop_assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()) * (1.0 + (kc as f32).sqrt()));
                }
            }
        }
    }
}

/// The `mr x nr` tile (row-major) that `isa`'s micro-kernel makes of `a · b` over `kc`
/// steps, added to 0.5 in every element.
fn tile_plus_half(
    isa: Isa,
    kc: usize,
    a: APanel<'_>,
    b: BPanel<'_>,
    (mr, nr): (usize, usize),
) -> Vec<f32> {
    let mut c = vec![0.5f32; mr * nr];
    let blocks = etch_memory::ColumnBlocks::new(&mut c, mr, nr, nr, nr).unwrap();
    let mut block = blocks.take(0).unwrap();
    micro_kernel(isa, kc, a, b, &mut block, (0, 0), (mr, nr), (true, None));
    c
}

/// Whether `x` and `y` hold the same values to the bit.
fn same_bits(x: &[f32], y: &[f32]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// Every micro-kernel reads rows of A in place to the same bits as the packed panel of
/// those rows.
#[test]
fn rows_of_a_in_place_give_the_bits_of_the_packed_panel() {
    for &isa in Isa::available() {
        let t = Tile::of(isa);
        for (kc, lda) in [(1usize, 3usize), (7, 7), (64, 80), (257, 300)] {
            let rows = rand_vec((t.mr - 1) * lda + kc, 9);
            let mut packed = vec![0f32; kc * t.mr];
            for r in 0..t.mr {
                for k in 0..kc {
                    packed[k * t.mr + r] = rows[r * lda + k];
                }
            }
            let b = rand_vec(kc * t.nr, 10);
            for (r_cut, c_cut) in [(0, 0), (1, 5)] {
                let (mr, nr) = (t.mr - r_cut, t.nr - c_cut);
                let run = |a: APanel<'_>| tile_plus_half(isa, kc, a, BPanel::Packed(&b), (mr, nr));
                let (in_place, from_panel) =
                    (run(APanel::Rows(&rows, lda)), run(APanel::Packed(&packed)));
                assert!(
                    same_bits(&in_place, &from_panel),
                    "{isa:?} kc={kc} lda={lda} {mr}x{nr}"
                );
            }
        }
    }
}

/// Every micro-kernel reads columns of B in place (rows `ldb` apart) to the same bits as
/// the packed panel of those columns.
#[test]
fn rows_of_b_in_place_give_the_bits_of_the_packed_panel() {
    for &isa in Isa::available() {
        let t = Tile::of(isa);
        for (kc, ldb) in [
            (1usize, t.nr),
            (7, t.nr + 3),
            (64, 3 * t.nr + 1),
            (257, 300),
        ] {
            let rows = rand_vec((kc - 1) * ldb + t.nr, 11);
            let mut packed = vec![0f32; kc * t.nr];
            for k in 0..kc {
                packed[k * t.nr..(k + 1) * t.nr].copy_from_slice(&rows[k * ldb..k * ldb + t.nr]);
            }
            let a = rand_vec(kc * t.mr, 12);
            for (r_cut, c_cut) in [(0, 0), (1, 5)] {
                let (mr, nr) = (t.mr - r_cut, t.nr - c_cut);
                let run = |b: BPanel<'_>| tile_plus_half(isa, kc, APanel::Packed(&a), b, (mr, nr));
                let (in_place, from_panel) =
                    (run(BPanel::Rows(&rows, ldb)), run(BPanel::Packed(&packed)));
                assert!(
                    same_bits(&in_place, &from_panel),
                    "{isa:?} kc={kc} ldb={ldb} {mr}x{nr}"
                );
            }
        }
    }
}
