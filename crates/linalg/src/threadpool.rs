//! The runtime's thread pool and `parallel_for`.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// Elements below which splitting work is not worth a task (ATen's and ExecuTorch's
/// `GRAIN_SIZE`).
pub const GRAIN_SIZE: usize = 32768;

/// A fixed-size pool; one per runtime. With one thread everything runs inline.
pub struct ThreadPool {
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    pinned: bool,
}

/// The environment variable that says whether a pool pins its workers to CPUs: `1`
/// always, `0` never, unset (or anything else) when the pool has a worker for every CPU
/// the process may run on (see [`ThreadPool::new`]).
pub const PIN_THREADS_ENV: &str = "ETCH_PIN_THREADS";

/// Whether a pool of `threads` workers pins them, on a process allowed `cpus` CPUs, for
/// the setting of [`PIN_THREADS_ENV`].
fn pins_workers(threads: usize, cpus: usize, setting: Option<&str>) -> bool {
    match setting.map(str::trim) {
        Some("0") => false,
        Some("1") => threads > 1 && cpus > 0,
        _ => threads > 1 && threads == cpus,
    }
}

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
#[error("could not start a thread pool of {threads} threads: {message}")]
pub struct ThreadPoolError {
    pub threads: usize,
    pub message: String,
}

/// The default thread count: the machine's available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl ThreadPool {
    /// A pool of `threads` threads (0 means [`default_threads`]).
    ///
    /// When the pool has a worker for every CPU the process may run on (the default
    /// thread count), worker `i` is pinned to the `i`-th of those CPUs; the
    /// [`PIN_THREADS_ENV`] environment variable overrides this (`0` never pins, `1`
    /// always does). A call that follows an idle spell wakes the workers, and Linux
    /// tends to wake a worker onto the CPU of the one that woke it: until the load
    /// balancer moves it, milliseconds later, both share one CPU and a short call runs
    /// no faster than on one thread. Pinned, each wakes on its own CPU.
    pub fn new(threads: usize) -> Result<Self, ThreadPoolError> {
        Self::with_pin_setting(threads, std::env::var(PIN_THREADS_ENV).ok().as_deref())
    }

    /// [`ThreadPool::new`] with `setting` in place of the [`PIN_THREADS_ENV`] variable.
    pub fn with_pin_setting(
        threads: usize,
        setting: Option<&str>,
    ) -> Result<Self, ThreadPoolError> {
        let threads = if threads == 0 {
            default_threads()
        } else {
            threads
        };
        if threads == 1 {
            return Ok(Self::serial());
        }
        let cpus = core_affinity::get_core_ids().unwrap_or_default();
        let pinned = pins_workers(threads, cpus.len(), setting);
        let mut builder = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("etch-worker-{i}"));
        if pinned {
            builder = builder.start_handler(move |i| {
                if let Some(&cpu) = cpus.get(i % cpus.len().max(1)) {
                    // A worker left unpinned (the OS refused) still runs.
                    let _ = core_affinity::set_for_current(cpu);
                }
            });
        }
        let pool = builder.build().map_err(|e| ThreadPoolError {
            threads,
            message: e.to_string(),
        })?;
        // Every worker allocates as it starts (its job queues, its thread-locals). A
        // worker the OS starts late, on a loaded machine, would do that in the middle
        // of a later call, which then is no longer allocation-free: wait here until
        // each has run a job.
        pool.broadcast(|_| ());
        Ok(Self {
            pool: Some(pool),
            threads,
            pinned,
        })
    }

    /// Whether the workers were pinned to CPUs (see [`ThreadPool::new`]).
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// A pool that runs everything on the calling thread.
    pub fn serial() -> Self {
        Self {
            pool: None,
            threads: 1,
            pinned: false,
        }
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether this thread runs an [`ThreadPool::install_hot`] closure, so that this
    /// pool's loops split their work up front and spin ([`spin_join`]). Inside another
    /// pool's hot call they do too, on that pool's threads: waiting inside this pool
    /// instead could run that call's own unclaimed poller on this thread, which polls
    /// until the call returns, and the call would never return.
    fn runs_hot(&self) -> bool {
        self.pool.is_some() && is_hot()
    }

    /// Runs `f` inside the pool (kernels called from inside avoid a cross-thread hop).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// Runs `f` on one worker of the pool while the other workers poll for the work it
    /// forks (stealing it within microseconds) instead of going to sleep between its
    /// parallel loops, as XNNPACK's pthreadpool spins. A forward pass forks a parallel
    /// loop per operator, tens of microseconds apart; a sleeping worker takes longer
    /// than that to wake, and the pass would run on one thread. The pollers yield the
    /// CPU to the OS now and then while idle, and stop when `f` returns. Called from a
    /// thread of this pool, `f` just runs (an enclosing call keeps the workers polling
    /// already).
    ///
    /// The pollers are the second halves of nested `rayon::join`s around `f`, so that
    /// entering allocates nothing (the jobs live on this stack). They are the oldest
    /// jobs of this worker's queue, and idle workers steal oldest first, so every
    /// poller is taken before any work `f` forks can be: this worker never finds a
    /// poller under its own waiting work.
    ///
    /// Inside `f`, this pool's loops split their work into one run per thread up front
    /// (the first run on this thread, the others taken by the pollers) and this thread,
    /// its own run done, spins until the others are ([`spin_join`]) instead of waiting
    /// inside `rayon`, which would put it to sleep after a few dozen idle rounds.
    pub fn install_hot<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let Some(pool) = &self.pool else {
            return f();
        };
        if pool.current_thread_index().is_some() {
            return f();
        }
        let done = AtomicBool::new(false);
        pool.install(|| {
            with_pollers(self.threads - 1, &done, || {
                let _hot = HotGuard::enter();
                f()
            })
        })
    }

    /// Splits `range` into at most `threads` chunks of at least `grain` items and runs
    /// `f(task, chunk)` for each, returning when all are done. `task` is below
    /// [`ThreadPool::threads`], so it can index per-task scratch. Small ranges run
    /// inline as task 0.
    pub fn parallel_for<F>(&self, range: Range<usize>, grain: usize, f: F)
    where
        F: Fn(usize, Range<usize>) + Sync + Send,
    {
        let len = range.end.saturating_sub(range.start);
        let grain = grain.max(1);
        let Some(pool) = &self.pool else {
            if len > 0 {
                f(0, range);
            }
            return;
        };
        if len <= grain {
            if len > 0 {
                f(0, range);
            }
            return;
        }
        let chunk = grain.max(len.div_ceil(self.threads));
        let tasks = len.div_ceil(chunk);
        let start = range.start;
        let end = range.end;
        if self.runs_hot() {
            let none: (&mut [()], &mut [()]) = (&mut [], &mut []);
            split_runs((none.0, 0), (none.1, 0), 0..tasks, &|t, _, _| {
                f(t, start + t * chunk..(start + (t + 1) * chunk).min(end))
            });
            return;
        }
        pool.install(|| {
            (0..tasks).into_par_iter().for_each(|t| {
                let b = start + t * chunk;
                f(t, b..(b + chunk).min(end));
            })
        });
    }

    /// Runs `f(index, chunk)` over consecutive `chunk_len`-element chunks of `data`,
    /// in parallel when there are at least `min_chunks_per_task * 2` chunks.
    pub fn for_each_chunk_mut<T, F>(
        &self,
        data: &mut [T],
        chunk_len: usize,
        min_chunks_per_task: usize,
        f: F,
    ) where
        T: Send,
        F: Fn(usize, &mut [T]) + Sync + Send,
    {
        let chunk_len = chunk_len.max(1);
        let n_chunks = data.len().div_ceil(chunk_len);
        let min_chunks = min_chunks_per_task.max(1);
        let runs = (n_chunks / min_chunks).min(self.threads);
        match &self.pool {
            Some(_) if runs >= 2 && self.runs_hot() => {
                let per_run = n_chunks.div_ceil(runs);
                let run = |t: usize, part: &mut [T], _: &mut [()]| {
                    for (j, c) in part.chunks_mut(chunk_len).enumerate() {
                        f(t * per_run + j, c);
                    }
                };
                split_runs((data, per_run * chunk_len), (&mut [], 0), 0..runs, &run);
            }
            Some(pool) if n_chunks >= 2 * min_chunks => pool.install(|| {
                data.par_chunks_mut(chunk_len)
                    .with_min_len(min_chunks_per_task.max(1))
                    .enumerate()
                    .for_each(|(i, c)| f(i, c))
            }),
            _ => data
                .chunks_mut(chunk_len)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
        }
    }
}

impl ThreadPool {
    /// [`ThreadPool::for_each_chunk_mut`] for kernels that need per-task scratch: the
    /// chunks are split into at most `scratch.len() / scratch_len` tasks (and at most
    /// one per thread), and `f(index, chunk, task_scratch)` gets its task's own
    /// `scratch_len` elements of `scratch`. Without room for one task's scratch, `f`
    /// gets an empty slice.
    pub fn for_each_chunk_mut_with_scratch<T, S, F>(
        &self,
        data: &mut [T],
        chunk_len: usize,
        min_chunks_per_task: usize,
        scratch: &mut [S],
        scratch_len: usize,
        f: F,
    ) where
        T: Send,
        S: Send,
        F: Fn(usize, &mut [T], &mut [S]) + Sync + Send,
    {
        let chunk_len = chunk_len.max(1);
        if scratch_len == 0 || scratch.len() < scratch_len {
            self.for_each_chunk_mut(data, chunk_len, min_chunks_per_task, |i, c| {
                f(i, c, &mut [])
            });
            return;
        }
        let n_chunks = data.len().div_ceil(chunk_len);
        let tasks = (n_chunks / min_chunks_per_task.max(1))
            .min(self.threads)
            .min(scratch.len() / scratch_len)
            .max(1);
        let chunks_per_task = n_chunks.div_ceil(tasks).max(1);
        let run = |t: usize, part: &mut [T], s: &mut [S]| {
            for (j, c) in part.chunks_mut(chunk_len).enumerate() {
                f(t * chunks_per_task + j, c, &mut *s);
            }
        };
        match &self.pool {
            Some(_) if tasks >= 2 && self.runs_hot() => {
                let scratch = &mut scratch[..tasks * scratch_len];
                let parts = chunks_per_task * chunk_len;
                split_runs((data, parts), (scratch, scratch_len), 0..tasks, &run);
            }
            Some(pool) if tasks >= 2 => pool.install(|| {
                data.par_chunks_mut(chunks_per_task * chunk_len)
                    .zip(scratch.par_chunks_exact_mut(scratch_len))
                    .enumerate()
                    .for_each(|(t, (part, s))| run(t, part, s))
            }),
            _ => run(0, data, &mut scratch[..scratch_len]),
        }
    }
}

/// Sets the flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `f` with `pollers` jobs beside it that poll for work until `f` has returned
/// (see [`ThreadPool::install_hot`]).
fn with_pollers<R: Send>(pollers: usize, done: &AtomicBool, f: impl FnOnce() -> R + Send) -> R {
    if pollers == 0 {
        // Set even if `f` panics, so that the pollers stop and the panic surfaces.
        let _stop = SetOnDrop(done);
        return f();
    }
    rayon::join(|| with_pollers(pollers - 1, done, f), || poll_until(done)).0
}

/// Runs the pool's pending work until `done` is set; yields the CPU to the OS every
/// few hundred idle polls.
fn poll_until(done: &AtomicBool) {
    let mut idle = 0u32;
    while !done.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            idle = 0;
            continue;
        }
        idle = idle.wrapping_add(1);
        if idle.is_multiple_of(256) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

thread_local! {
    /// Whether this thread runs the closure of an [`ThreadPool::install_hot`] (whose
    /// other workers poll for work).
    static HOT: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread runs the closure of an [`ThreadPool::install_hot`].
fn is_hot() -> bool {
    HOT.with(Cell::get)
}

/// Marks this thread as running an [`ThreadPool::install_hot`] closure until dropped
/// (restoring what it was, for a nested call).
struct HotGuard(bool);

impl HotGuard {
    fn enter() -> HotGuard {
        HotGuard(HOT.with(|h| h.replace(true)))
    }
}

impl Drop for HotGuard {
    fn drop(&mut self) {
        HOT.with(|h| h.set(self.0));
    }
}

/// How long the first half of a [`spin_join`] waits for a poller to start the second
/// half before it returns and lets the pool run it on this thread.
const START_WAIT: Duration = Duration::from_micros(50);

/// `rayon::join(a, b)` for a thread whose pool's other workers poll for work
/// ([`ThreadPool::install_hot`]): once `a` is done, this thread spins until `b`, taken
/// by a poller, has finished, rather than waiting inside the pool, which after a few
/// dozen idle rounds puts the thread to sleep: the poller then has to wake it, and on a
/// virtual machine that takes tens of microseconds, at every parallel step that ends
/// on the other thread. If no poller has started `b` within [`START_WAIT`], the thread
/// stops spinning and the pool runs `b` here.
fn spin_join(a: impl FnOnce() + Send, b: impl FnOnce() + Send) {
    let (started, finished) = (AtomicBool::new(false), AtomicBool::new(false));
    rayon::join(
        || {
            a();
            let since = Instant::now();
            let mut polls = 0u32;
            while !finished.load(Ordering::Acquire) {
                polls = polls.wrapping_add(1);
                if !started.load(Ordering::Acquire)
                    && polls.is_multiple_of(64)
                    && since.elapsed() > START_WAIT
                {
                    return;
                }
                std::hint::spin_loop();
            }
        },
        || {
            started.store(true, Ordering::Release);
            // Set even if `b` panics, so that the first half stops spinning.
            let _finished = SetOnDrop(&finished);
            b()
        },
    );
}

/// Runs `run(t, part, scratch)` for each task `t` of `tasks` with its run of `data`
/// (`data.1` elements each, the last run whatever is left, possibly none) and its run
/// of `scratch` (`scratch.1` each): the first half of the tasks on this thread and the
/// second half taken by a poller, halving again inside each ([`spin_join`]). With two
/// threads, task 0 runs here and task 1 on the other worker, as `rayon` splits them.
fn split_runs<T: Send, S: Send>(
    (data, data_len): (&mut [T], usize),
    (scratch, scratch_len): (&mut [S], usize),
    tasks: Range<usize>,
    run: &(impl Fn(usize, &mut [T], &mut [S]) + Sync),
) {
    let len = tasks.end.saturating_sub(tasks.start);
    if len <= 1 {
        if len == 1 {
            run(tasks.start, data, scratch);
        }
        return;
    }
    let left = len / 2;
    let (lo, hi) = data.split_at_mut((left * data_len).min(data.len()));
    let (slo, shi) = scratch.split_at_mut((left * scratch_len).min(scratch.len()));
    spin_join(
        || {
            split_runs(
                (lo, data_len),
                (slo, scratch_len),
                tasks.start..tasks.start + left,
                run,
            )
        },
        || {
            split_runs(
                (hi, data_len),
                (shi, scratch_len),
                tasks.start + left..tasks.end,
                run,
            )
        },
    );
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pinned = if self.pinned { ", pinned" } else { "" };
        write!(f, "ThreadPool({} threads{pinned})", self.threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn workers_are_pinned_when_they_cover_every_cpu_or_when_asked() {
        assert!(pins_workers(4, 4, None));
        assert!(pins_workers(4, 4, Some("auto")));
        assert!(!pins_workers(2, 4, None));
        assert!(!pins_workers(4, 4, Some("0")));
        assert!(pins_workers(2, 4, Some(" 1 ")));
        assert!(pins_workers(8, 4, Some("1")));
        // One thread has no workers; no CPUs known, nothing to pin to.
        assert!(!pins_workers(1, 1, Some("1")));
        assert!(!pins_workers(2, 0, Some("1")));
    }

    #[test]
    fn a_pinned_pool_runs_each_worker_on_one_cpu() {
        let cpus = core_affinity::get_core_ids().unwrap_or_default().len();
        let pool = ThreadPool::with_pin_setting(2, Some("1")).unwrap();
        assert_eq!(pool.pinned(), cpus > 0);
        let widest = AtomicUsize::new(0);
        pool.parallel_for(0..64, 1, |_, _| {
            let mine = core_affinity::get_core_ids().unwrap_or_default().len();
            widest.fetch_max(mine, Ordering::Relaxed);
        });
        if cpus > 0 {
            assert_eq!(widest.load(Ordering::Relaxed), 1);
        }
        let free = ThreadPool::with_pin_setting(2, Some("0")).unwrap();
        assert!(!free.pinned());
    }

    #[test]
    fn install_hot_runs_the_closure_once_and_its_parallel_work() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            let calls = AtomicUsize::new(0);
            let total = pool.install_hot(|| {
                calls.fetch_add(1, Ordering::Relaxed);
                let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
                for _ in 0..50 {
                    pool.parallel_for(0..1000, 7, |_, r| {
                        for i in r {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
                // Nested: runs inline.
                pool.install_hot(|| {
                    hits.iter()
                        .map(|h| h.load(Ordering::Relaxed))
                        .sum::<usize>()
                })
            });
            assert_eq!(total, 50_000);
            assert_eq!(calls.load(Ordering::Relaxed), 1);
        }
    }

    #[test]
    fn hot_loops_cover_every_chunk_once_and_run_the_first_on_the_calling_thread() {
        for threads in [2, 3, 4] {
            let pool = ThreadPool::new(threads).unwrap();
            pool.install_hot(|| {
                let me = std::thread::current().id();
                for len in [0usize, 1, 7, 64, 1000] {
                    let mut v = vec![usize::MAX; len];
                    let first_here = AtomicBool::new(len == 0);
                    pool.for_each_chunk_mut(&mut v, 3, 1, |i, c| {
                        if i == 0 && std::thread::current().id() == me {
                            first_here.store(true, Ordering::Relaxed);
                        }
                        c.iter_mut().for_each(|x| *x = i);
                    });
                    assert!(
                        v.iter().enumerate().all(|(j, &i)| i == j / 3),
                        "{threads} {len}"
                    );
                    assert!(first_here.load(Ordering::Relaxed));

                    let mut w = vec![usize::MAX; len];
                    let mut scratch = vec![0usize; 4 * threads];
                    pool.for_each_chunk_mut_with_scratch(
                        &mut w,
                        5,
                        1,
                        &mut scratch,
                        4,
                        |i, c, s| {
                            assert_eq!(s.len(), 4);
                            s[0] += 1;
                            c.iter_mut().for_each(|x| *x = i);
                        },
                    );
                    assert!(
                        w.iter().enumerate().all(|(j, &i)| i == j / 5),
                        "{threads} {len}"
                    );
                    assert_eq!(scratch.iter().step_by(4).sum::<usize>(), len.div_ceil(5));
                }
            });
        }
    }

    #[test]
    fn another_pools_loop_inside_a_hot_call_covers_its_chunks_and_returns() {
        let (hot, other) = (ThreadPool::new(2).unwrap(), ThreadPool::new(2).unwrap());
        for _ in 0..20 {
            hot.install_hot(|| {
                let mut v = vec![usize::MAX; 100];
                other.for_each_chunk_mut(&mut v, 10, 1, |i, c| c.iter_mut().for_each(|x| *x = i));
                assert!(v.iter().enumerate().all(|(j, &i)| i == j / 10));
            });
        }
    }

    #[test]
    fn a_panic_in_a_hot_task_on_another_worker_surfaces() {
        let pool = ThreadPool::new(2).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install_hot(|| {
                let mut v = vec![0u8; 64];
                pool.for_each_chunk_mut(&mut v, 32, 1, |i, _| assert!(i == 0, "task {i}"));
            })
        }));
        assert!(r.is_err());
        assert_eq!(pool.install_hot(|| 7), 7);
    }

    #[test]
    fn install_hot_passes_a_panic_on_and_the_pool_still_works() {
        let pool = ThreadPool::new(2).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install_hot(|| panic!("inside"))
        }));
        assert!(r.is_err());
        assert_eq!(pool.install_hot(|| 7), 7);
    }

    #[test]
    fn parallel_for_covers_the_range_once() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            pool.parallel_for(0..1000, 7, |task, r| {
                assert!(task < threads);
                for i in r {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn chunks_cover_the_slice() {
        let pool = ThreadPool::new(2).unwrap();
        let mut v = vec![0usize; 103];
        pool.for_each_chunk_mut(&mut v, 10, 1, |i, c| c.iter_mut().for_each(|x| *x = i));
        assert_eq!(v[0], 0);
        assert_eq!(v[102], 10);
    }
}
