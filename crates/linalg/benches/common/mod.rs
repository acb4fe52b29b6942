//! Input data shared by the benches of this crate.

/// `n` values in `[-0.5, 0.5)` hashed from their index and `seed`.
pub fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0 - 0.5
        })
        .collect()
}
