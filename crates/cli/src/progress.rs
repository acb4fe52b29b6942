//! A progress line on stderr while a large model loads: how much of the file is in
//! memory so far and the time spent, redrawn in place.
//!
//! The loader reads the whole file in one `read` call (whose byte count the kernel
//! reports only at its end), so progress is measured as the growth of this process's
//! resident memory (Linux `VmRSS`): the pages the read has filled, or, for a memory
//! map, the pages touched so far.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Files from this size on get a progress line.
const LARGE_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Loads shorter than this print nothing.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// How often the line is redrawn.
const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// This process's resident memory in bytes, where known.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// Runs `load`, showing a progress line on stderr meanwhile when stderr is a terminal
/// and `model` is large. The line is erased when `load` returns.
pub fn while_loading<T>(model: &Path, load: impl FnOnce() -> T) -> T {
    let size = std::fs::metadata(model).map_or(0, |m| m.len());
    if size < LARGE_FILE_BYTES || !std::io::stderr().is_terminal() {
        return load();
    }
    let done = AtomicBool::new(false);
    let name = model.file_name().map_or_else(
        || model.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let start = Instant::now();
            let resident_at_start = resident_bytes();
            let mut shown = false;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(REDRAW_EVERY);
                let elapsed = start.elapsed();
                if elapsed < QUIET_FOR || done.load(Ordering::Relaxed) {
                    continue;
                }
                let loaded = match (resident_bytes(), resident_at_start) {
                    (Some(now), Some(then)) => {
                        format!("{:.0}/", mib(now.saturating_sub(then).min(size)))
                    }
                    _ => String::new(),
                };
                eprint!(
                    "\r\x1b[Kloading {name}: {loaded}{:.0} MiB in memory, {:.1} s",
                    mib(size),
                    elapsed.as_secs_f64()
                );
                let _ = std::io::stderr().flush();
                shown = true;
            }
            if shown {
                eprint!("\r\x1b[K");
                let _ = std::io::stderr().flush();
            }
        });
        let result = load();
        done.store(true, Ordering::Relaxed);
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_files_load_without_a_line_and_give_the_result_back() {
        let missing = Path::new("/nonexistent/model.pte");
        assert_eq!(while_loading(missing, || 7), 7);
        assert!(mib(3 * 1048576) == 3.0);
    }
}
