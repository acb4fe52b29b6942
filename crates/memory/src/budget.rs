//! A memory budget: how many bytes a loaded program may hold (its file when read into
//! memory, each session's planned memory, delegates' packed weights), checked before the
//! bytes are allocated.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a reservation was refused: what needed the memory, how much, and the budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} needs {} but the memory budget is {} ({} already in use); raise it with --max-memory / max_memory()",
    format_bytes(*.needed), format_bytes(*.budget), format_bytes(*.in_use)
)]
pub struct BudgetExceeded {
    /// What asked for the memory ("planned memory of method \"forward\"", ...).
    pub what: String,
    /// Bytes it needs.
    pub needed: u64,
    /// The budget's limit in bytes.
    pub budget: u64,
    /// Bytes already reserved by others when it asked.
    pub in_use: u64,
}

/// A limit shared by everything one program allocates. Cheap to clone (one `Arc`);
/// reservations return a [`Reservation`] that gives its bytes back when dropped.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: Option<u64>,
    used: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self::with_limit(Some(limit))
    }

    /// No limit: every reservation succeeds (and is still counted).
    pub fn unlimited() -> Self {
        Self::with_limit(None)
    }

    /// The default budget: the memory the system reports as available
    /// (`MemAvailable` in `/proc/meminfo` on Linux), unlimited where it reports none.
    pub fn system_available() -> Self {
        Self::with_limit(system_available_bytes())
    }

    fn with_limit(limit: Option<u64>) -> Self {
        MemoryBudget {
            inner: Arc::new(Inner {
                limit,
                used: AtomicU64::new(0),
            }),
        }
    }

    /// The limit in bytes (`None`: unlimited).
    pub fn limit(&self) -> Option<u64> {
        self.inner.limit
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> u64 {
        self.inner.used.load(Ordering::Acquire)
    }

    /// Reserves `bytes` for `what` (a phrase naming the user of the memory) or says
    /// why not, before anything is allocated.
    pub fn reserve(
        &self,
        what: impl FnOnce() -> String,
        bytes: u64,
    ) -> Result<Reservation, BudgetExceeded> {
        let mut used = self.inner.used.load(Ordering::Acquire);
        loop {
            let next = used.checked_add(bytes);
            let fits = match (next, self.inner.limit) {
                (Some(n), Some(limit)) => n <= limit,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if !fits {
                return Err(BudgetExceeded {
                    what: what(),
                    needed: bytes,
                    budget: self.inner.limit.unwrap_or(u64::MAX),
                    in_use: used,
                });
            }
            let next = next.unwrap_or(u64::MAX);
            match self.inner.used.compare_exchange_weak(
                used,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(Reservation {
                        budget: self.clone(),
                        bytes,
                    });
                }
                Err(now) => used = now,
            }
        }
    }
}

/// Bytes held against a [`MemoryBudget`]; given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: MemoryBudget,
    bytes: u64,
}

impl Reservation {
    /// Bytes this reservation holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .inner
            .used
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
fn system_available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&meminfo)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Parses a byte count as users write it: `1048576`, `512K`, `300M`, `2G`, `1.5GiB`
/// (binary multiples; `B`, `iB` suffixes optional; case-insensitive).
pub fn parse_byte_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return None,
    };
    if number.is_empty() {
        return None;
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(1u64 << shift);
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * (1u64 << shift) as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// `1.5 GiB`, `300.0 MiB`, `12 B`: a byte count for messages.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_and_give_back() {
        let budget = MemoryBudget::new(100);
        let a = budget.reserve(|| "a".into(), 60).unwrap();
        assert_eq!(budget.in_use(), 60);
        let err = budget.reserve(|| "b".into(), 50).unwrap_err();
        assert_eq!(
            (err.what.as_str(), err.needed, err.budget, err.in_use),
            ("b", 50, 100, 60)
        );
        drop(a);
        assert_eq!(budget.in_use(), 0);
        let _b = budget.reserve(|| "b".into(), 50).unwrap();
        assert_eq!(budget.in_use(), 50);
    }

    #[test]
    fn overflowing_requests_are_refused() {
        let budget = MemoryBudget::unlimited();
        let _a = budget.reserve(|| "a".into(), u64::MAX - 1).unwrap();
        assert!(budget.reserve(|| "b".into(), 2).is_err());
    }

    #[test]
    fn the_message_names_need_and_budget() {
        let budget = MemoryBudget::new(1 << 20);
        let err = budget
            .reserve(|| "planned memory of method \"forward\"".into(), 100 << 30)
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("100.0 GiB"), "{msg}");
        assert!(msg.contains("1.0 MiB"), "{msg}");
        assert!(msg.contains("forward"), "{msg}");
    }

    #[test]
    fn byte_sizes_parse_as_users_write_them() {
        assert_eq!(parse_byte_size("1048576"), Some(1 << 20));
        assert_eq!(parse_byte_size("512K"), Some(512 << 10));
        assert_eq!(parse_byte_size("300MiB"), Some(300 << 20));
        assert_eq!(parse_byte_size("2g"), Some(2 << 30));
        assert_eq!(parse_byte_size("1.5GB"), Some(3 << 29));
        assert_eq!(parse_byte_size("12 MB"), Some(12 << 20));
        assert_eq!(parse_byte_size("lots"), None);
        assert_eq!(parse_byte_size("3X"), None);
        assert_eq!(parse_byte_size(""), None);
        assert_eq!(parse_byte_size("99999999999T"), None);
    }

    #[test]
    fn mem_available_is_read_in_kib() {
        let meminfo = "MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    }
}
