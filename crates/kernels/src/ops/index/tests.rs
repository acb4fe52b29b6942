use etch_base::ScalarType;
use proptest::prelude::*;

use crate::testing::{Harness, unravel};

/// A small deterministic generator for test cases.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn strides(sizes: &[usize]) -> Vec<usize> {
    let mut s = vec![1; sizes.len()];
    for d in (0..sizes.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * sizes[d + 1];
    }
    s
}

fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|d| {
            let x = if d + a.len() >= r {
                a[d + a.len() - r]
            } else {
                1
            };
            let y = if d + b.len() >= r {
                b[d + b.len() - r]
            } else {
                1
            };
            assert!(x == y || x == 1 || y == 1);
            x.max(y)
        })
        .collect()
}

/// Value of a broadcast index tensor at broadcast position `pos`.
fn idx_at(shape: &[usize], data: &[i64], pos: &[usize]) -> i64 {
    let lead = pos.len() - shape.len();
    let st = strides(shape);
    let off: usize = shape
        .iter()
        .enumerate()
        .map(|(d, &s)| if s == 1 { 0 } else { pos[d + lead] * st[d] })
        .sum();
    data[off]
}

type Item = Option<(Vec<usize>, Vec<i64>)>;

/// Naive advanced indexing: returns (out sizes, for each output element the flat
/// input offset).
fn reference(sizes: &[usize], items: &[Item]) -> (Vec<usize>, Vec<usize>) {
    let rank = sizes.len();
    let indexed: Vec<usize> = items
        .iter()
        .enumerate()
        .filter_map(|(d, it)| it.as_ref().map(|_| d))
        .collect();
    let mut b: Vec<usize> = Vec::new();
    for it in items.iter().flatten() {
        b = broadcast(&b, &it.0);
    }
    let adjacent = indexed.windows(2).all(|w| w[1] == w[0] + 1);
    let first = indexed.first().copied().unwrap_or(0);
    let nonidx: Vec<usize> = (0..rank).filter(|d| !indexed.contains(d)).collect();
    let (p, q): (Vec<usize>, Vec<usize>) = if adjacent && !indexed.is_empty() {
        nonidx.iter().partition(|&&d| d < first)
    } else {
        (vec![], nonidx.clone())
    };
    let mut out: Vec<usize> = p.iter().map(|&d| sizes[d]).collect();
    out.extend(&b);
    out.extend(q.iter().map(|&d| sizes[d]));
    let st = strides(sizes);
    let n: usize = out.iter().product();
    let offs = (0..n)
        .map(|f| {
            let o = unravel(f, &out);
            let mut ii = vec![0usize; rank];
            for (k, &d) in p.iter().enumerate() {
                ii[d] = o[k];
            }
            let bpos = &o[p.len()..p.len() + b.len()];
            for &d in &indexed {
                let (shape, data) = items[d].as_ref().unwrap();
                let v = idx_at(shape, data, bpos);
                ii[d] = if v < 0 {
                    (v + sizes[d] as i64) as usize
                } else {
                    v as usize
                };
            }
            for (k, &d) in q.iter().enumerate() {
                ii[d] = o[p.len() + b.len() + k];
            }
            ii.iter().zip(&st).map(|(i, s)| i * s).sum()
        })
        .collect();
    (out, offs)
}

/// A random indexing case from a seed.
fn random_case(seed: u64) -> (Vec<usize>, Vec<Item>) {
    let mut g = Lcg(seed);
    let rank = 1 + g.below(4);
    let sizes: Vec<usize> = (0..rank).map(|_| 1 + g.below(4)).collect();
    let brank = g.below(3);
    let b: Vec<usize> = (0..brank).map(|_| 1 + g.below(3)).collect();
    let len = 1 + g.below(rank);
    let mut items: Vec<Item> = Vec::new();
    for &size in sizes.iter().take(len) {
        if g.below(3) == 0 {
            items.push(None);
            continue;
        }
        let drop = g.below(b.len() + 1);
        let shape: Vec<usize> = b[drop..]
            .iter()
            .map(|&s| if g.below(3) == 0 { 1 } else { s })
            .collect();
        let n: usize = shape.iter().product();
        let data: Vec<i64> = (0..n)
            .map(|_| g.below(2 * size) as i64 - size as i64)
            .collect();
        items.push(Some((shape, data)));
    }
    (sizes, items)
}

fn push_items(h: &mut Harness, items: &[Item], i32_idx: bool) -> usize {
    let ids: Vec<Option<usize>> = items
        .iter()
        .map(|it| {
            it.as_ref().map(|(shape, data)| {
                if i32_idx {
                    h.tensor(shape, &data.iter().map(|&v| v as i32).collect::<Vec<_>>())
                } else {
                    h.tensor(shape, data)
                }
            })
        })
        .collect();
    h.opt_tensor_list(&ids)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn index_tensor_matches_reference(seed in any::<u64>()) {
        let (sizes, items) = random_case(seed);
        let (out_sizes, offs) = reference(&sizes, &items);
        let n: usize = sizes.iter().product();
        let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut h = Harness::new();
        let x = h.tensor(&sizes, &data);
        let list = push_items(&mut h, &items, seed % 2 == 0);
        let out = h.out(ScalarType::Float, &out_sizes);
        h.call("aten::index.Tensor_out", &[x, list, out, out]).unwrap();
        prop_assert_eq!(h.tensor_meta(out).sizes().to_vec(), out_sizes);
        let want: Vec<f32> = offs.iter().map(|&o| data[o]).collect();
        prop_assert_eq!(h.read::<f32>(out), want);
    }

    #[test]
    fn index_put_matches_reference(seed in any::<u64>(), accumulate in any::<bool>()) {
        let (sizes, items) = random_case(seed);
        let (out_sizes, offs) = reference(&sizes, &items);
        let n: usize = sizes.iter().product();
        let data: Vec<i64> = (0..n).map(|i| i as i64 * 100).collect();
        let vn: usize = out_sizes.iter().product();
        let values: Vec<i64> = (0..vn).map(|i| i as i64 + 1).collect();
        let mut want = data.clone();
        for (k, &o) in offs.iter().enumerate() {
            if accumulate { want[o] += values[k] } else { want[o] = values[k] }
        }
        // With duplicates and no accumulation, the last write wins (serial order).
        let mut h = Harness::new();
        let x = h.tensor(&sizes, &data);
        let list = push_items(&mut h, &items, false);
        let v = h.tensor(&out_sizes, &values);
        let acc = h.bool(accumulate);
        let out = h.out(ScalarType::Long, &sizes);
        h.call("aten::index_put.out", &[x, list, v, acc, out, out]).unwrap();
        prop_assert_eq!(h.read::<i64>(out), want.clone());
        // In place.
        h.call("aten::index_put_", &[x, list, v, acc, x]).unwrap();
        prop_assert_eq!(h.read::<i64>(x), want);
    }
}

#[test]
fn index_rope_table_row() {
    // freqs_cos[input_pos]: a [64, 4] table, i64 index of shape [1].
    let mut h = Harness::new();
    let table: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let x = h.tensor(&[64, 4], &table);
    let pos = h.tensor(&[1], &[9i64]);
    let list = h.opt_tensor_list(&[Some(pos)]);
    let out = h.out(ScalarType::Float, &[1, 4]);
    h.call("aten::index.Tensor_out", &[x, list, out, out])
        .unwrap();
    assert_eq!(h.read::<f32>(out), table[36..40].to_vec());
}

#[test]
fn index_with_masks() {
    let mut h = Harness::new();
    let data: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let x = h.tensor(&[2, 3], &data);
    let m = h.tensor_raw(ScalarType::Bool, &[2, 3], &[1, 0, 1, 0, 1, 0]);
    let list = h.opt_tensor_list(&[Some(m)]);
    let out = h.out(ScalarType::Float, &[6]);
    h.call("aten::index.Tensor_out", &[x, list, out, out])
        .unwrap();
    assert_eq!(h.read::<f32>(out), vec![0., 2., 4.]);
    // x[:, mask] with a 1-d mask on dim 1.
    let n = h.none();
    let m1 = h.tensor_raw(ScalarType::Bool, &[3], &[0, 1, 1]);
    let list = h.opt_tensor_list(&[Some(n), Some(m1)]);
    let out = h.out(ScalarType::Float, &[2, 3]);
    h.call("aten::index.Tensor_out", &[x, list, out, out])
        .unwrap();
    assert_eq!(h.tensor_meta(out).sizes(), &[2, 2]);
    assert_eq!(h.read::<f32>(out), vec![1., 2., 4., 5.]);
    // Mask shape mismatch.
    let bad = h.tensor_raw(ScalarType::Bool, &[2], &[1, 1]);
    let list = h.opt_tensor_list(&[Some(n), Some(bad)]);
    assert!(
        h.call("aten::index.Tensor_out", &[x, list, out, out])
            .is_err()
    );
    // index_put with a mask and a broadcast scalar value.
    let v = h.tensor(&[], &[-1f32]);
    let list = h.opt_tensor_list(&[Some(m)]);
    let acc = h.bool(false);
    let o2 = h.out(ScalarType::Float, &[2, 3]);
    h.call("aten::index_put.out", &[x, list, v, acc, o2, o2])
        .unwrap();
    assert_eq!(h.read::<f32>(o2), vec![-1., 1., -1., 3., -1., 5.]);
}

#[test]
fn index_bad_calls() {
    let mut h = Harness::new();
    let x = h.tensor(&[2, 3], &[0f32; 6]);
    let out = h.out(ScalarType::Float, &[6]);
    let oob = h.tensor(&[1], &[2i64]);
    let list = h.opt_tensor_list(&[Some(oob)]);
    let o1 = h.out(ScalarType::Float, &[1, 3]);
    assert!(
        h.call("aten::index.Tensor_out", &[x, list, o1, o1])
            .is_err()
    );
    let neg = h.tensor(&[1], &[-3i64]);
    let list = h.opt_tensor_list(&[Some(neg)]);
    assert!(
        h.call("aten::index.Tensor_out", &[x, list, o1, o1])
            .is_err()
    );
    let f = h.tensor(&[1], &[0f32]);
    let list = h.opt_tensor_list(&[Some(f)]);
    assert!(
        h.call("aten::index.Tensor_out", &[x, list, out, out])
            .is_err()
    );
    let i = h.tensor(&[1], &[0i64]);
    let list = h.opt_tensor_list(&[Some(i), Some(i), Some(i)]);
    assert!(
        h.call("aten::index.Tensor_out", &[x, list, out, out])
            .is_err()
    );
    let a = h.tensor(&[2], &[0i64, 1]);
    let b = h.tensor(&[3], &[0i64, 1, 2]);
    let list = h.opt_tensor_list(&[Some(a), Some(b)]);
    assert!(
        h.call("aten::index.Tensor_out", &[x, list, out, out])
            .is_err()
    );
    let list = h.opt_tensor_list(&[Some(i)]);
    let oi = h.out(ScalarType::Int, &[1, 3]);
    assert!(
        h.call("aten::index.Tensor_out", &[x, list, oi, oi])
            .is_err()
    );
    assert!(h.call("aten::index.Tensor_out", &[x, list, o1]).is_err());
    // index_put: values that do not broadcast, wrong dtype.
    let v = h.tensor(&[2], &[1f32, 2.]);
    let acc = h.bool(false);
    let o = h.out(ScalarType::Float, &[2, 3]);
    assert!(
        h.call("aten::index_put.out", &[x, list, v, acc, o, o])
            .is_err()
    );
    let vi = h.tensor(&[3], &[1i64, 2, 3]);
    assert!(
        h.call("aten::index_put.out", &[x, list, vi, acc, o, o])
            .is_err()
    );
}

#[test]
fn copy_broadcasts_and_casts() {
    let mut h = Harness::new();
    let dst = h.tensor(&[2, 3], &[0f32; 6]);
    let src = h.tensor(&[3], &[1i64, 2, 3]);
    let f = h.bool(false);
    h.call("aten::copy_", &[dst, src, f, dst]).unwrap();
    assert_eq!(h.read::<f32>(dst), vec![1., 2., 3., 1., 2., 3.]);
    let s2 = h.tensor(&[2, 1], &[7f32, 8.]);
    h.call("aten::copy_", &[dst, s2, f, dst]).unwrap();
    assert_eq!(h.read::<f32>(dst), vec![7., 7., 7., 8., 8., 8.]);
    // Float into int truncates.
    let di = h.tensor(&[2], &[0i32; 2]);
    let sf = h.tensor(&[2], &[1.7f32, -2.5]);
    h.call("aten::copy_", &[di, sf, f, di]).unwrap();
    assert_eq!(h.read::<i32>(di), vec![1, -2]);
    // Same tensor: a no-op.
    h.call("aten::copy_", &[dst, dst, f, dst]).unwrap();
    let bad = h.tensor(&[4], &[0f32; 4]);
    assert!(h.call("aten::copy_", &[dst, bad, f, dst]).is_err());
    assert!(h.call("aten::copy_", &[dst, bad, f]).is_err());
}

#[test]
fn index_select_cases() {
    let mut h = Harness::new();
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let x = h.tensor(&[3, 4], &data);
    let idx = h.tensor(&[3], &[2i64, 0, 2]);
    let d = h.int(0);
    let out = h.out(ScalarType::Float, &[3, 4]);
    h.call("aten::index_select.out", &[x, d, idx, out, out])
        .unwrap();
    assert_eq!(
        h.read::<f32>(out),
        [&data[8..12], &data[0..4], &data[8..12]].concat()
    );
    let d1 = h.int(-1);
    let idx2 = h.tensor(&[2], &[3i32, 1]);
    let o2 = h.out(ScalarType::Float, &[3, 2]);
    h.call("aten::index_select.out", &[x, d1, idx2, o2, o2])
        .unwrap();
    assert_eq!(h.read::<f32>(o2), vec![3., 1., 7., 5., 11., 9.]);
    let bad = h.tensor(&[1], &[4i64]);
    assert!(
        h.call("aten::index_select.out", &[x, d1, bad, o2, o2])
            .is_err()
    );
    let neg = h.tensor(&[1], &[-1i64]);
    assert!(
        h.call("aten::index_select.out", &[x, d1, neg, o2, o2])
            .is_err()
    );
    let two_d = h.tensor(&[1, 1], &[0i64]);
    assert!(
        h.call("aten::index_select.out", &[x, d1, two_d, o2, o2])
            .is_err()
    );
}

#[test]
fn gather_cases() {
    let mut h = Harness::new();
    let x = h.tensor(&[2, 2], &[1f32, 2., 3., 4.]);
    let idx = h.tensor(&[2, 2], &[0i64, 0, 1, 0]);
    let d = h.int(1);
    let f = h.bool(false);
    let out = h.out(ScalarType::Float, &[2, 2]);
    h.call("aten::gather.out", &[x, d, idx, f, out, out])
        .unwrap();
    assert_eq!(h.read::<f32>(out), vec![1., 1., 4., 3.]);
    let d0 = h.int(0);
    h.call("aten::gather.out", &[x, d0, idx, f, out, out])
        .unwrap();
    assert_eq!(h.read::<f32>(out), vec![1., 2., 3., 2.]);
    let bad = h.tensor(&[2, 2], &[0i64, 2, 0, 0]);
    assert!(
        h.call("aten::gather.out", &[x, d, bad, f, out, out])
            .is_err()
    );
    let big = h.tensor(&[3, 1], &[0i64, 0, 0]);
    let o3 = h.out(ScalarType::Float, &[3, 1]);
    assert!(h.call("aten::gather.out", &[x, d, big, f, o3, o3]).is_err());
}
