//! Column blocks of one row-major matrix, written by several tasks at once.
//!
//! A blocked matrix product splits its output's columns over threads: task `t` owns
//! columns `t * block_cols ..` of every row. Those windows are disjoint, but none of
//! them is a contiguous slice, so safe Rust cannot hand them out with `split_at_mut`.
//! [`ColumnBlocks`] does, checked: each block is taken at most once, and a
//! [`ColumnBlock`] only reaches its own columns. A product too narrow to split by
//! columns alone splits its rows too ([`ColumnBlocks::grid`]): block `b` is then row
//! block `b / column_blocks`, column block `b % column_blocks`.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// A row-major matrix (`rows x cols`, row stride `ld`) split into column blocks of
/// `block_cols` columns (the last one may be narrower), and possibly into row blocks
/// of `block_rows` rows, each of which one task may take and write while the others
/// write theirs.
pub struct ColumnBlocks<'a, T> {
    ptr: *mut T,
    rows: usize,
    cols: usize,
    ld: usize,
    block_rows: usize,
    block_cols: usize,
    /// Bit `b` is set once block `b` has been taken.
    taken: AtomicU64,
    _data: PhantomData<&'a mut [T]>,
}

// SAFETY: a ColumnBlocks hands each block out at most once (the `taken` bits are
// claimed atomically) and blocks cover disjoint elements, so sharing it between
// threads gives each thread exclusive access to the elements of the blocks it took,
// as `&mut [T]` sent to that thread would.
unsafe impl<T: Send> Sync for ColumnBlocks<'_, T> {}
// SAFETY: it owns a unique borrow of the data, as `&mut [T]` does.
unsafe impl<T: Send> Send for ColumnBlocks<'_, T> {}

impl<'a, T> ColumnBlocks<'a, T> {
    /// Most blocks one matrix is split into.
    pub const MAX_BLOCKS: usize = 64;

    /// Splits `data` (`rows` rows of `cols` elements at stride `ld`) into blocks of
    /// `block_cols` columns. `None` when the rows do not fit in `data`, `ld < cols`,
    /// `block_cols` is 0, or the split has more than [`Self::MAX_BLOCKS`] blocks.
    pub fn new(
        data: &'a mut [T],
        rows: usize,
        cols: usize,
        ld: usize,
        block_cols: usize,
    ) -> Option<Self> {
        Self::grid(data, (rows, cols), ld, (rows.max(1), block_cols))
    }

    /// Splits `data` (`rows` rows of `cols` elements at stride `ld`) into blocks of
    /// `block_rows x block_cols` elements (those of the last row and column may be
    /// smaller). `None` as for [`Self::new`], or when `block_rows` is 0.
    pub fn grid(
        data: &'a mut [T],
        (rows, cols): (usize, usize),
        ld: usize,
        (block_rows, block_cols): (usize, usize),
    ) -> Option<Self> {
        if block_cols == 0 || block_rows == 0 || ld < cols {
            return None;
        }
        let blocks = rows
            .div_ceil(block_rows)
            .max(1)
            .checked_mul(cols.div_ceil(block_cols))?;
        if blocks > Self::MAX_BLOCKS {
            return None;
        }
        let need = match rows {
            0 => 0,
            r => (r - 1).checked_mul(ld)?.checked_add(cols)?,
        };
        if need > data.len() {
            return None;
        }
        Some(ColumnBlocks {
            ptr: data.as_mut_ptr(),
            rows,
            cols,
            ld,
            block_rows,
            block_cols,
            taken: AtomicU64::new(0),
            _data: PhantomData,
        })
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.rows.div_ceil(self.block_rows).max(1) * self.column_blocks()
    }

    /// Number of column blocks (blocks per row block).
    fn column_blocks(&self) -> usize {
        self.cols.div_ceil(self.block_cols)
    }

    /// The columns of block `index`.
    pub fn columns(&self, index: usize) -> Range<usize> {
        let start = ((index % self.column_blocks().max(1)) * self.block_cols).min(self.cols);
        start..(start + self.block_cols).min(self.cols)
    }

    /// The rows of block `index`.
    pub fn rows(&self, index: usize) -> Range<usize> {
        let start = ((index / self.column_blocks().max(1)) * self.block_rows).min(self.rows);
        start..(start + self.block_rows).min(self.rows)
    }

    /// Block `index`, unless it does not exist or was already taken.
    pub fn take(&self, index: usize) -> Option<ColumnBlock<'_, T>> {
        if index >= self.blocks() {
            return None;
        }
        let bit = 1u64 << index;
        if self.taken.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return None;
        }
        let (rows, cols) = (self.rows(index), self.columns(index));
        // SAFETY: index < blocks(), so the block's first row is a row of the matrix
        // (or row 0 of an empty one), whose elements were checked to fit in `data`
        // (grid); cols.start <= self.cols <= ld keeps the offset inside that row (or one
        // past it). Blocks cover disjoint elements and this one was taken once.
        Some(unsafe {
            let first = self.ptr.add(rows.start * self.ld);
            ColumnBlock::window(first, rows.len(), cols, self.ld)
        })
    }
}

/// The columns one task took from a [`ColumnBlocks`]: `rows x cols` elements at row
/// stride `ld`, no other task's among them.
pub struct ColumnBlock<'b, T> {
    ptr: *mut T,
    rows: usize,
    cols: usize,
    ld: usize,
    _block: PhantomData<&'b mut T>,
}

// SAFETY: the block is a unique borrow of its elements (see ColumnBlocks::take).
unsafe impl<T: Send> Send for ColumnBlock<'_, T> {}

impl<T> ColumnBlock<'_, T> {
    /// Rows of the block.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the block.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row stride of the underlying matrix.
    pub fn ld(&self) -> usize {
        self.ld
    }

    /// Row `i` of the block (its `cols` elements). Panics when `i >= rows`.
    pub fn row_mut(&mut self, i: usize) -> &mut [T] {
        assert!(i < self.rows, "row {i} of a {}-row block", self.rows);
        // SAFETY: i < rows, so row i's `cols` elements lie inside the matrix
        // (checked in ColumnBlocks::new) and inside this block's columns, which no
        // other block reaches; `&mut self` keeps the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.ld), self.cols) }
    }

    /// Columns `cols` of this block as a block of their own, borrowed from it. `None`
    /// when the range is not inside the block's columns.
    pub fn columns_mut(&mut self, cols: Range<usize>) -> Option<ColumnBlock<'_, T>> {
        if cols.start > cols.end || cols.end > self.cols {
            return None;
        }
        // SAFETY: cols.start <= self.cols, so the offset stays inside row 0 of this
        // block (or one past its last column); the new block reaches only columns of
        // this one, and `&mut self` keeps it the only way to reach them.
        Some(unsafe { ColumnBlock::window(self.ptr, self.rows, cols, self.ld) })
    }

    /// Columns `cols` of the `rows x ld` window at `ptr`.
    ///
    /// # Safety
    /// `ptr + cols.start` is inside (or one past) row 0 of a matrix of `rows` rows at
    /// stride `ld` holding columns `cols`, which nothing else reaches while the block
    /// lives.
    unsafe fn window(ptr: *mut T, rows: usize, cols: Range<usize>, ld: usize) -> Self {
        ColumnBlock {
            // SAFETY: the caller's promise.
            ptr: unsafe { ptr.add(cols.start) },
            rows,
            cols: cols.len(),
            ld,
            _block: PhantomData,
        }
    }

    /// A pointer to element `(row, col)` of the block, for writes to the
    /// `rows x cols` window there: element `(i, j)` of the window is at
    /// `ptr + i * ld + j`, inside this block for `i < rows`, `j < cols`. `None` when
    /// the window does not fit in the block.
    pub fn window_ptr(
        &mut self,
        (row, col): (usize, usize),
        (rows, cols): (usize, usize),
    ) -> Option<*mut T> {
        let fits = rows > 0
            && cols > 0
            && row.checked_add(rows).is_some_and(|e| e <= self.rows)
            && col.checked_add(cols).is_some_and(|e| e <= self.cols);
        // SAFETY: row < self.rows and col < self.cols, so the offset lies inside the
        // matrix (checked in ColumnBlocks::new).
        fits.then(|| unsafe { self.ptr.add(row * self.ld + col) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_their_columns_once_and_reject_a_second_take() {
        let mut data = vec![0u32; 3 * 10];
        let blocks = ColumnBlocks::new(&mut data, 3, 9, 10, 4).unwrap();
        assert_eq!(blocks.blocks(), 3);
        assert_eq!(blocks.columns(2), 8..9);
        std::thread::scope(|s| {
            for b in 0..blocks.blocks() {
                let blocks = &blocks;
                s.spawn(move || {
                    let mut block = blocks.take(b).unwrap();
                    assert!(blocks.take(b).is_none());
                    for i in 0..block.rows() {
                        for v in block.row_mut(i) {
                            *v += b as u32 + 1;
                        }
                    }
                });
            }
        });
        assert!(blocks.take(3).is_none());
        for row in data.chunks(10) {
            assert_eq!(row, [1, 1, 1, 1, 2, 2, 2, 2, 3, 0]);
        }
    }

    #[test]
    fn a_grid_hands_out_row_and_column_blocks_once_each() {
        let mut data = vec![0u32; 5 * 6];
        let blocks = ColumnBlocks::grid(&mut data, (5, 5), 6, (2, 3)).unwrap();
        assert_eq!(blocks.blocks(), 6);
        assert_eq!((blocks.rows(5), blocks.columns(5)), (4..5, 3..5));
        std::thread::scope(|s| {
            for b in 0..blocks.blocks() {
                let blocks = &blocks;
                s.spawn(move || {
                    let mut block = blocks.take(b).unwrap();
                    for i in 0..block.rows() {
                        block.row_mut(i).fill(b as u32 + 1);
                    }
                });
            }
        });
        assert!(blocks.take(6).is_none());
        let rows: Vec<&[u32]> = data.chunks(6).collect();
        assert_eq!(rows[0], [1, 1, 1, 2, 2, 0]);
        assert_eq!(rows[3], [3, 3, 3, 4, 4, 0]);
        assert_eq!(rows[4], [5, 5, 5, 6, 6, 0]);
        assert!(ColumnBlocks::grid(&mut data, (5, 5), 6, (0, 3)).is_none());
        assert!(ColumnBlocks::grid(&mut data, (65, 1), 1, (1, 1)).is_none());
    }

    #[test]
    fn a_block_lends_its_own_columns_only() {
        let mut data = vec![0u32; 2 * 8];
        let blocks = ColumnBlocks::new(&mut data, 2, 8, 8, 4).unwrap();
        let mut block = blocks.take(1).unwrap();
        assert!(block.columns_mut(2..5).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 3..2;
        assert!(block.columns_mut(backwards).is_none());
        let mut sub = block.columns_mut(1..3).unwrap();
        assert_eq!((sub.rows(), sub.cols(), sub.ld()), (2, 2, 8));
        for i in 0..sub.rows() {
            sub.row_mut(i).fill(7);
        }
        assert_eq!(data, [0, 0, 0, 0, 0, 7, 7, 0, 0, 0, 0, 0, 0, 7, 7, 0]);
    }

    #[test]
    fn a_matrix_that_does_not_fit_is_refused() {
        let mut data = vec![0f32; 19];
        assert!(ColumnBlocks::new(&mut data, 2, 10, 10, 4).is_none());
        assert!(ColumnBlocks::new(&mut data, 2, 9, 10, 4).is_some());
        assert!(ColumnBlocks::new(&mut data, 2, 9, 8, 4).is_none());
        assert!(ColumnBlocks::new(&mut data, 1, 19, 19, 0).is_none());
        let mut wide = vec![0u8; 65];
        assert!(ColumnBlocks::new(&mut wide, 1, 65, 65, 1).is_none());
    }

    #[test]
    fn windows_stay_inside_the_block() {
        let mut data = vec![0f32; 4 * 8];
        let blocks = ColumnBlocks::new(&mut data, 4, 8, 8, 4).unwrap();
        let mut block = blocks.take(1).unwrap();
        assert!(block.window_ptr((0, 0), (4, 4)).is_some());
        assert!(block.window_ptr((1, 1), (3, 3)).is_some());
        assert!(block.window_ptr((1, 1), (4, 3)).is_none());
        assert!(block.window_ptr((0, 1), (1, 4)).is_none());
        assert!(block.window_ptr((0, 0), (0, 4)).is_none());
    }
}
