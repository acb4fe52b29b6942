//! System blocks recycled across resets: size classes, a byte budget, LRU trimming.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use super::{AllocatorStats, MemoryAllocator};
use crate::AllocError;
use crate::align::check_alignment;

/// The alignment every caching-allocator block has at least (a cache line). Larger
/// alignments are honoured too.
pub const DEFAULT_CACHING_ALIGNMENT: usize = 64;

/// log2 of the smallest class (64 bytes): every request up to 64 bytes shares it.
const MIN_CLASS_SHIFT: u32 = 6;
const MIN_CLASS: usize = 1 << MIN_CLASS_SHIFT;
/// log2 of the number of classes between two powers of two.
const STEPS_LOG2: u32 = 2;
const STEPS: usize = 1 << STEPS_LOG2;
/// Classes 64, 80, 96, 112, 128, 160, ... up to the largest that fits in usize.
const NUM_CLASSES: usize = (usize::BITS - MIN_CLASS_SHIFT) as usize * STEPS + 1;
/// How many classes above its own a request may take a cached block from (4 steps: a
/// block at most twice the request's class).
const LARGER_CLASSES: usize = STEPS;

/// Index and capacity of the size class serving `size` bytes, or `None` when the
/// capacity would overflow `usize`.
fn class_of(size: usize) -> Option<(usize, usize)> {
    if size <= MIN_CLASS {
        return Some((0, MIN_CLASS));
    }
    let s = size - 1;
    // floor(log2(s)) >= MIN_CLASS_SHIFT because s >= MIN_CLASS.
    let k = usize::BITS - 1 - s.leading_zeros();
    let shift = k - STEPS_LOG2;
    // The smallest multiple of 2^shift that is >= size: m is in STEPS+1 ..= 2*STEPS.
    let m = (s >> shift) + 1;
    let bytes = m.checked_mul(1usize << shift)?;
    let index = (k - MIN_CLASS_SHIFT) as usize * STEPS + (m - STEPS);
    Some((index, bytes))
}

/// The capacity of the block the [`CachingAllocator`] hands out for a `size`-byte
/// request: 64 bytes up to 64, then the next of 4 equal steps between consecutive
/// powers of two (so at most 25% is wasted, and a shape that grows by one element per
/// decode step keeps hitting the same class until it crosses the next step). `None`
/// when the class would overflow `usize`.
///
/// ```
/// use etch_memory::allocator::size_class;
/// assert_eq!(size_class(0), Some(64));
/// assert_eq!(size_class(65), Some(80));
/// assert_eq!(size_class(4096), Some(4096));
/// assert_eq!(size_class(4097), Some(5120));
/// assert_eq!(size_class(16 * 1024 + 4), Some(20 * 1024));
/// assert_eq!(size_class(usize::MAX), None);
/// ```
pub fn size_class(size: usize) -> Option<usize> {
    class_of(size).map(|(_, bytes)| bytes)
}

/// A block owned by the allocator, live or cached.
#[derive(Clone, Copy)]
struct Block {
    ptr: NonNull<u8>,
    /// The exact layout it was allocated with (size = its class capacity).
    layout: Layout,
    class: usize,
    /// Value of the use counter when it was last handed out (for LRU).
    last_use: u64,
}

// SAFETY: a Block is the sole owner of a heap allocation; nothing about it is tied to
// the thread that allocated it (the system allocator is thread-safe).
unsafe impl Send for Block {}

#[derive(Default)]
struct Class {
    /// Cached blocks, least recently used at the front. Its capacity is kept at least
    /// `owned`, so that returning blocks at reset never allocates.
    free: VecDeque<Block>,
    /// Blocks of this class the allocator owns (live or cached).
    owned: usize,
}

struct Inner {
    /// One entry per size class, created once.
    classes: Vec<Class>,
    /// Blocks handed out since the last reset, in order of allocation. Its capacity is
    /// kept at least `owned_blocks`, so a cache hit never allocates.
    live: Vec<Block>,
    owned_blocks: usize,
    /// Use counter: incremented by every allocation.
    tick: u64,
    max_cached_bytes: usize,
    stats: AllocatorStats,
}

impl Inner {
    /// Takes the most recently used cached block of `class` whose address is aligned to
    /// `align`.
    fn take_cached(&mut self, class: usize, align: usize) -> Option<Block> {
        let free = &mut self.classes[class].free;
        if align <= DEFAULT_CACHING_ALIGNMENT {
            // Every block is at least this aligned.
            return free.pop_back();
        }
        let i = free
            .iter()
            .rposition(|b| b.ptr.as_ptr().addr() % align == 0)?;
        free.remove(i)
    }

    /// Takes a cached block for a request of `class`: one of that class, else the
    /// smallest cached one of the next [`LARGER_CLASSES`] classes (so a pass whose
    /// requests vary in size, like a CNN's layers, reuses the blocks it freed instead of
    /// cycling through the system allocator).
    fn take_cached_fit(&mut self, class: usize, align: usize) -> Option<Block> {
        let last = (class + LARGER_CLASSES).min(NUM_CLASSES - 1);
        (class..=last).find_map(|c| self.take_cached(c, align))
    }

    fn note_live(&mut self, mut block: Block) {
        self.tick += 1;
        block.last_use = self.tick;
        // Capacity >= owned_blocks > live.len(), so this never reallocates.
        debug_assert!(self.live.len() < self.live.capacity());
        self.live.push(block);
        let stats = &mut self.stats;
        stats.allocations += 1;
        stats.bytes_live += block.layout.size();
        stats.peak_bytes_live = stats.peak_bytes_live.max(stats.bytes_live);
    }

    /// Frees cached blocks, least recently used first, until at most `target` bytes
    /// are cached. Returns the bytes freed.
    fn trim_to(&mut self, target: usize) -> usize {
        let mut released = 0;
        while self.stats.bytes_cached > target {
            // The front of each class queue is its least recently used block; take the
            // oldest of those.
            let oldest = self
                .classes
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.free.front().map(|b| (b.last_use, i)))
                .min();
            let Some((_, i)) = oldest else { break };
            let class = &mut self.classes[i];
            let Some(block) = class.free.pop_front() else {
                break;
            };
            class.owned -= 1;
            self.owned_blocks -= 1;
            // SAFETY: the block came from `alloc` with exactly this layout, it is cached
            // (not handed out since the last reset), and it has just been removed from
            // the cache, so it is freed exactly once and nobody uses it.
            unsafe { std::alloc::dealloc(block.ptr.as_ptr(), block.layout) };
            self.stats.system_frees += 1;
            self.stats.bytes_cached -= block.layout.size();
            released += block.layout.size();
        }
        released
    }

    fn return_live(&mut self) {
        let Inner { classes, live, .. } = self;
        for block in live.drain(..) {
            // The class queue's capacity is at least its owned count, and this block is
            // owned but not queued, so this never reallocates.
            classes[block.class].free.push_back(block);
        }
        self.stats.bytes_cached += self.stats.bytes_live;
        self.stats.bytes_live = 0;
    }
}

/// A temp allocator that keeps system blocks across resets and hands them out again,
/// fixing the weaknesses of ExecuTorch's `CPUCachingAllocator`:
///
/// * Requests are rounded up to **size classes** (see [`size_class`]: 4 steps between
///   powers of two), not cached by exact size, so scratch that grows by a few bytes per
///   decode step keeps reusing the same blocks. A request whose class has no cached
///   block takes one from the next four classes (at most twice its class), so a pass
///   whose requests vary in size (a CNN's layers) reuses what it freed.
/// * Blocks keep their real `Layout` (at least [`DEFAULT_CACHING_ALIGNMENT`]-aligned,
///   no `align - 1` padding); a request for a larger alignment reuses any cached block
///   of its class whose address happens to be aligned, or gets a new block with that
///   alignment.
/// * `max_cached_bytes` bounds the **cached** (free) bytes only, never the live ones,
///   and is a `usize`. At `reset`, every live block goes back to the cache, and if the
///   cache is then over budget only the excess is freed, **least recently used first**
///   (upstream frees everything). [`CachingAllocator::trim`] and
///   [`CachingAllocator::release_all`] free cached memory on demand.
/// * Steady state is allocation-free: the bookkeeping keeps its capacity, so a cycle
///   of cache hits and a reset makes no heap allocation (`tests/zero_alloc.rs` proves
///   it with [`crate::counting::CountingAllocator`]).
/// * `allocate(&self)` is thread-safe (a mutex held only for a few list operations;
///   system allocations on a miss happen outside it).
///
/// Stats: `allocations`, `hits`, `misses`, `system_allocations`, `system_frees`,
/// `bytes_cached`, `bytes_live` and `peak_bytes_live` (both in class capacities),
/// `resets`.
///
/// ```
/// use etch_memory::MemoryAllocator;
/// use etch_memory::allocator::CachingAllocator;
///
/// let mut cache = CachingAllocator::new(16 << 20);
/// // Decode: attention scratch grows by one key row (512 bytes) per step.
/// for step in 0..100 {
///     let p = cache.allocate(100_000 + step * 512, 64).unwrap();
///     assert_eq!(p.as_ptr() as usize % 64, 0);
///     cache.reset();
/// }
/// let s = cache.stats();
/// // 100 000 -> 150 688 bytes spans three classes (114 688, 131 072, 163 840 bytes):
/// assert_eq!(s.system_allocations, 3);
/// assert_eq!(s.hits, 97);
/// assert!(s.bytes_cached <= 16 << 20);
/// ```
pub struct CachingAllocator {
    inner: Mutex<Inner>,
}

impl CachingAllocator {
    /// An empty cache that keeps at most `max_cached_bytes` of free blocks across
    /// resets (live blocks are not limited).
    ///
    /// ```
    /// use etch_memory::allocator::CachingAllocator;
    /// let cache = CachingAllocator::new(10 << 20);
    /// assert_eq!(cache.max_cached_bytes(), 10 << 20);
    /// ```
    pub fn new(max_cached_bytes: usize) -> Self {
        let mut classes = Vec::with_capacity(NUM_CLASSES);
        classes.resize_with(NUM_CLASSES, Class::default);
        Self {
            inner: Mutex::new(Inner {
                classes,
                live: Vec::new(),
                owned_blocks: 0,
                tick: 0,
                max_cached_bytes,
                stats: AllocatorStats::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Critical sections never leave the state inconsistent (no panics between
        // related updates), so a poisoned lock is still safe to use.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn inner_mut(&mut self) -> &mut Inner {
        self.inner.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// The cache budget in bytes.
    pub fn max_cached_bytes(&self) -> usize {
        self.lock().max_cached_bytes
    }

    /// Changes the cache budget, freeing least recently used cached blocks at once if
    /// the cache is over the new budget. Returns the bytes freed.
    ///
    /// ```
    /// use etch_memory::MemoryAllocator;
    /// use etch_memory::allocator::CachingAllocator;
    /// let mut cache = CachingAllocator::new(1 << 20);
    /// cache.allocate(1000, 64).unwrap();
    /// cache.reset();
    /// assert_eq!(cache.set_max_cached_bytes(0), 1024);
    /// assert_eq!(cache.stats().bytes_cached, 0);
    /// ```
    pub fn set_max_cached_bytes(&self, max_cached_bytes: usize) -> usize {
        let mut inner = self.lock();
        inner.max_cached_bytes = max_cached_bytes;
        inner.trim_to(max_cached_bytes)
    }

    /// Frees cached blocks, least recently used first, until at most `target_bytes`
    /// are cached. Live blocks are untouched. Returns the bytes freed.
    ///
    /// ```
    /// use etch_memory::MemoryAllocator;
    /// use etch_memory::allocator::CachingAllocator;
    /// let mut cache = CachingAllocator::new(1 << 20);
    /// let old = cache.allocate(4096, 64).unwrap(); // used first
    /// let new = cache.allocate(8192, 64).unwrap(); // used last
    /// cache.reset();
    /// assert_eq!(cache.trim(10_000), 4096); // the least recently used block goes
    /// assert_eq!(cache.allocate(8192, 64).unwrap(), new);
    /// ```
    pub fn trim(&self, target_bytes: usize) -> usize {
        self.lock().trim_to(target_bytes)
    }

    /// Frees every cached block (live blocks stay valid until the next reset).
    /// Returns the bytes freed.
    ///
    /// ```
    /// use etch_memory::MemoryAllocator;
    /// use etch_memory::allocator::CachingAllocator;
    /// let mut cache = CachingAllocator::new(1 << 20);
    /// cache.allocate(100, 64).unwrap();
    /// cache.reset();
    /// assert_eq!(cache.release_all(), 112); // the 100-byte request's class
    /// assert_eq!(cache.cached_blocks(), 0);
    /// ```
    pub fn release_all(&self) -> usize {
        self.trim(0)
    }

    /// Number of free blocks in the cache.
    pub fn cached_blocks(&self) -> usize {
        let inner = self.lock();
        inner.owned_blocks - inner.live.len()
    }

    /// Number of blocks handed out since the last reset.
    pub fn live_blocks(&self) -> usize {
        self.lock().live.len()
    }
}

// SAFETY: every block comes from `std::alloc::alloc` with a layout of at least the
// requested size (its class capacity) and alignment, or is a cached block of the same
// class whose address is checked to be aligned. A block is in exactly one place: the
// live list (handed out once since the last reset) or a class's free queue (not handed
// out); moves between them happen under the mutex, so no block is handed out twice.
// Live blocks are only recycled by `reset(&mut self)` and only freed by drop; trimming
// frees cached blocks only.
unsafe impl MemoryAllocator for CachingAllocator {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        check_alignment(align)?;
        let align = align.max(DEFAULT_CACHING_ALIGNMENT);
        let overflow = AllocError::SizeOverflow { size, align };
        let (class, capacity) = class_of(size).ok_or(overflow.clone())?;

        {
            let mut inner = self.lock();
            if let Some(block) = inner.take_cached_fit(class, align) {
                inner.stats.hits += 1;
                inner.stats.bytes_cached -= block.layout.size();
                inner.note_live(block);
                return Ok(block.ptr);
            }
        }

        // Miss: ask the system without holding the lock.
        let layout = Layout::from_size_align(capacity, align).map_err(|_| overflow)?;
        // Zeroed, so every block is initialised memory (`initialised_blocks`); large
        // blocks come as fresh zero pages, so this costs nothing on the hot path.
        // SAFETY: the layout has a non-zero size (capacity >= 64).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(AllocError::SystemOutOfMemory { size })?;
        let mut inner = self.lock();
        // Grow the bookkeeping now, on the slow path, so that hits and resets never
        // allocate: live list >= all blocks owned, class queue >= its blocks owned.
        let owned = inner.owned_blocks + 1;
        let live_len = inner.live.len();
        let class_owned = inner.classes[class].owned + 1;
        let queued = inner.classes[class].free.len();
        let reserved = inner.live.try_reserve(owned - live_len).is_ok()
            && inner.classes[class]
                .free
                .try_reserve(class_owned - queued)
                .is_ok();
        if !reserved {
            drop(inner);
            // SAFETY: just allocated with this layout and never handed out.
            unsafe { std::alloc::dealloc(raw, layout) };
            return Err(AllocError::SystemOutOfMemory { size });
        }
        inner.owned_blocks = owned;
        inner.classes[class].owned = class_owned;
        inner.stats.misses += 1;
        inner.stats.system_allocations += 1;
        inner.note_live(Block {
            ptr,
            layout,
            class,
            last_use: 0,
        });
        Ok(ptr)
    }

    fn reset(&mut self) {
        let inner = self.inner_mut();
        inner.return_live();
        inner.stats.resets += 1;
        let budget = inner.max_cached_bytes;
        inner.trim_to(budget);
    }

    fn stats(&self) -> AllocatorStats {
        self.lock().stats
    }

    fn name(&self) -> &'static str {
        "caching"
    }

    /// Blocks are zeroed when first allocated and recycled as they were left.
    fn initialised_blocks(&self) -> bool {
        true
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        let inner = self.inner_mut();
        inner.return_live();
        inner.trim_to(0);
        debug_assert_eq!(inner.owned_blocks, 0);
    }
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("CachingAllocator")
            .field("max_cached_bytes", &inner.max_cached_bytes)
            .field("stats", &inner.stats)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_contiguous() {
        let mut last = (0, MIN_CLASS);
        assert_eq!(class_of(1), Some((0, 64)));
        let sizes = if cfg!(miri) { 5_000 } else { 100_000usize };
        for size in 1..sizes {
            let (i, bytes) = class_of(size).unwrap();
            assert!(bytes >= size);
            assert!(i == last.0 || i == last.0 + 1, "size {size}");
            if i == last.0 {
                assert_eq!(bytes, last.1);
            } else {
                assert!(bytes > last.1 && last.1 == size - 1, "size {size}");
            }
            // At most 25% waste above the minimum class.
            assert!(size <= MIN_CLASS || (bytes - size) * 4 < bytes);
            last = (i, bytes);
        }
        let (top, _) = class_of(isize::MAX as usize).unwrap();
        assert!(top < NUM_CLASSES);
        assert_eq!(class_of(usize::MAX), None);
    }
}
