//! The shapes and arena placement of a delegate's last call, reused while its input dims
//! repeat.
//!
//! Every call infers the shape of each value from the real input dims and places the
//! arena values for those shapes. Both depend on the input dims only, and an LLM's decode
//! steps call each delegate with the same dims token after token (a layer of SmolLM2 is
//! about ten delegate calls, so this bookkeeping was several percent of a decoded token).
//! The cache keeps one entry behind a mutex: sessions that share the program and call
//! with other dims simply recompute. Its vectors keep their capacity, so after the first
//! call a hit or a miss allocates nothing.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::dims::Dims;

/// The cached call (see the module documentation).
#[derive(Debug, Default)]
pub struct CallCache(Mutex<Entry>);

#[derive(Debug, Default)]
struct Entry {
    valid: bool,
    /// Dims of the external inputs, in the plan's input order.
    inputs: Vec<Dims>,
    /// Dims of every value.
    shapes: Vec<Dims>,
    /// Arena offset of every value (meaningful for arena values).
    offsets: Vec<usize>,
    /// Threads the scratch lengths were computed for.
    threads: usize,
    /// Arena elements and GEMM scratch elements of the call.
    lens: (usize, usize),
}

impl CallCache {
    fn lock(&self) -> MutexGuard<'_, Entry> {
        // The entry is plain data, rewritten whole by `store`: a panic elsewhere cannot
        // leave it half-updated in a way `restore` would trust (`valid` is set last).
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When the last stored call had the same thread count and the same input dims as
    /// `shapes` now holds at `inputs` (value, argument pairs), copies its shapes and
    /// offsets into `shapes` and `offsets` and returns its (arena, GEMM scratch) lengths.
    pub fn restore(
        &self,
        inputs: &[(usize, usize)],
        threads: usize,
        shapes: &mut [Dims],
        offsets: &mut [usize],
    ) -> Option<(usize, usize)> {
        let e = self.lock();
        let same = e.valid
            && e.threads == threads
            && e.inputs.len() == inputs.len()
            && e.shapes.len() == shapes.len()
            && e.offsets.len() == offsets.len()
            && inputs
                .iter()
                .zip(&e.inputs)
                .all(|(&(v, _), d)| shapes.get(v) == Some(d));
        if !same {
            return None;
        }
        shapes.copy_from_slice(&e.shapes);
        offsets.copy_from_slice(&e.offsets);
        Some(e.lens)
    }

    /// Remembers a call: its thread count, shapes (inputs included), placement and
    /// scratch lengths.
    pub fn store(
        &self,
        inputs: &[(usize, usize)],
        threads: usize,
        shapes: &[Dims],
        offsets: &[usize],
        lens: (usize, usize),
    ) {
        let mut e = self.lock();
        e.valid = false;
        e.inputs.clear();
        e.inputs.extend(
            inputs
                .iter()
                .map(|&(v, _)| shapes.get(v).copied().unwrap_or_default()),
        );
        e.shapes.clear();
        e.shapes.extend_from_slice(shapes);
        e.offsets.clear();
        e.offsets.extend_from_slice(offsets);
        e.threads = threads;
        e.lens = lens;
        e.valid = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(x: &[usize]) -> Dims {
        Dims::new(x).unwrap()
    }

    #[test]
    fn hits_only_on_the_same_input_dims() {
        let cache = CallCache::default();
        let inputs = [(0, 0), (2, 1)];
        let mut shapes = [d(&[1, 4]), d(&[4]), d(&[2, 2])];
        let mut offsets = [0, 16, 32];
        assert_eq!(cache.restore(&inputs, 1, &mut shapes, &mut offsets), None);
        cache.store(&inputs, 1, &shapes, &offsets, (48, 7));

        let mut shapes2 = [d(&[1, 4]), d(&[9]), d(&[2, 2])];
        let mut offsets2 = [0; 3];
        assert_eq!(
            cache.restore(&inputs, 1, &mut shapes2, &mut offsets2),
            Some((48, 7))
        );
        assert_eq!(shapes2[1], d(&[4]));
        assert_eq!(offsets2, offsets);
        // another thread count changes the scratch lengths
        assert_eq!(cache.restore(&inputs, 2, &mut shapes2, &mut offsets2), None);

        let mut shapes3 = [d(&[2, 4]), d(&[4]), d(&[2, 2])];
        assert_eq!(cache.restore(&inputs, 1, &mut shapes3, &mut offsets2), None);
        // a plan of another size never matches
        let mut short = [d(&[1, 4]), d(&[4])];
        assert_eq!(cache.restore(&[(0, 0)], 1, &mut short, &mut [0; 2]), None);
    }
}
