//! Out-of-band cancellation for the worker: 8-byte little-endian request ids arriving on
//! the control pipe the official server passes in `EXECUTORCH_LLM_WORKER_CONTROL_FD`,
//! and the rule that decides which request, if any, a frame cancels.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The environment variable naming the control pipe's file descriptor.
pub const CONTROL_FD_VARIABLE: &str = "EXECUTORCH_LLM_WORKER_CONTROL_FD";

/// Bytes of one cancel frame.
pub const FRAME_BYTES: usize = 8;

/// Reassembles 8-byte frames from reads of any length.
#[derive(Debug, Default)]
pub struct FrameReader {
    partial: [u8; FRAME_BYTES],
    filled: usize,
}

impl FrameReader {
    /// Feeds `bytes`; calls `on_id` with each complete frame's id.
    ///
    /// ```
    /// use etch_serve::worker::FrameReader;
    /// let mut r = FrameReader::default();
    /// let mut ids = Vec::new();
    /// let bytes = [7u64.to_le_bytes(), 9u64.to_le_bytes()].concat();
    /// r.feed(&bytes[..5], &mut |id| ids.push(id));
    /// r.feed(&bytes[5..], &mut |id| ids.push(id));
    /// assert_eq!(ids, [7, 9]);
    /// ```
    pub fn feed(&mut self, mut bytes: &[u8], on_id: &mut dyn FnMut(u64)) {
        while !bytes.is_empty() {
            let take = (FRAME_BYTES - self.filled).min(bytes.len());
            self.partial[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == FRAME_BYTES {
                self.filled = 0;
                on_id(u64::from_le_bytes(self.partial));
            }
        }
    }
}

/// Why a generate request's `cancel_request_id` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CancelIdError {
    #[error("cancel_request_id is not supported")]
    NotSupported,
    #[error("cancel_request_id is stale or duplicate")]
    Stale,
    #[error("worker cancellation request already active")]
    AlreadyActive,
}

#[derive(Debug, Default)]
struct Book {
    /// The running request's id and its cancel flag.
    active: Option<(u64, Arc<AtomicBool>)>,
    /// A frame that arrived while nothing ran, for a request not yet started.
    pending: Option<u64>,
    /// The highest id of a finished request.
    last_completed: u64,
}

/// Which request a cancel frame stops. While a request runs, only its own id cancels it
/// (other ids are dropped, never kept for later). While none runs, an id at or below the
/// last finished one is stale and dropped; the first newer id waits in a single slot and
/// cancels the next request only if that request has its id.
#[derive(Debug, Clone, Default)]
pub struct CancelBook {
    book: Arc<Mutex<Book>>,
}

impl CancelBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A frame arrived.
    pub fn on_frame(&self, id: u64) {
        if id == 0 {
            return;
        }
        let mut book = self.lock();
        if let Some((active, flag)) = &book.active {
            if *active == id {
                flag.store(true, Ordering::Relaxed);
            }
            return;
        }
        if id > book.last_completed && book.pending.is_none() {
            book.pending = Some(id);
        }
    }

    /// Checks a request's id before it starts.
    pub fn check(&self, id: u64) -> Result<(), CancelIdError> {
        let book = self.lock();
        if book.active.is_some() {
            Err(CancelIdError::AlreadyActive)
        } else if id <= book.last_completed {
            Err(CancelIdError::Stale)
        } else {
            Ok(())
        }
    }

    /// Request `id` starts with cancel flag `flag` (set at once if its frame came early).
    pub fn activate(&self, id: u64, flag: &Arc<AtomicBool>) {
        let mut book = self.lock();
        if book.pending.take() == Some(id) {
            flag.store(true, Ordering::Relaxed);
        }
        book.active = Some((id, Arc::clone(flag)));
    }

    /// Request `id` finished (whatever the outcome).
    pub fn complete(&self, id: u64) {
        let mut book = self.lock();
        book.active = None;
        book.last_completed = book.last_completed.max(id);
        if book.pending.is_some_and(|p| p <= book.last_completed) {
            book.pending = None;
        }
    }

    /// Activates request `id` (as [`CancelBook::activate`]) until the returned guard
    /// drops, which completes it, on an early return or an unwinding panic too.
    pub fn active(&self, id: u64, flag: &Arc<AtomicBool>) -> ActiveRequest {
        self.activate(id, flag);
        ActiveRequest {
            book: self.clone(),
            id,
        }
    }
}

/// A running request's place in the [`CancelBook`]; completes it when dropped.
#[derive(Debug)]
pub struct ActiveRequest {
    book: CancelBook,
    id: u64,
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        self.book.complete(self.id);
    }
}

/// Opens the control pipe named by [`CONTROL_FD_VARIABLE`] and reads frames from it on a
/// thread of its own until the server closes it. Returns whether cancellation is
/// supported (a valid pipe was given).
///
/// The descriptor is opened through `/dev/fd/N` (a new handle on the same pipe), so the
/// worker needs no unsafe code to adopt it.
pub fn listen_for_cancels(book: &CancelBook) -> bool {
    let Ok(value) = std::env::var(CONTROL_FD_VARIABLE) else {
        return false;
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        eprintln!("etch-worker: ignoring {CONTROL_FD_VARIABLE}={value:?}: not a descriptor number");
        return false;
    }
    let Ok(fd) = value.parse::<u32>() else {
        return false;
    };
    if fd <= 2 {
        return false;
    }
    let Some(pipe) = open_fifo(fd) else {
        eprintln!("etch-worker: {CONTROL_FD_VARIABLE}={fd} is not a readable pipe");
        return false;
    };
    let book = book.clone();
    let spawned = std::thread::Builder::new()
        .name("cancel-frames".into())
        .spawn(move || read_frames(pipe, &book));
    spawned.is_ok()
}

#[cfg(unix)]
fn open_fifo(fd: u32) -> Option<std::fs::File> {
    use std::os::unix::fs::FileTypeExt;
    let file = std::fs::File::open(format!("/dev/fd/{fd}")).ok()?;
    file.metadata()
        .ok()
        .filter(|m| m.file_type().is_fifo())
        .map(|_| file)
}

#[cfg(not(unix))]
fn open_fifo(_fd: u32) -> Option<std::fs::File> {
    None
}

/// Reads frames until end of file or an error.
pub fn read_frames(mut pipe: impl Read, book: &CancelBook) {
    let mut frames = FrameReader::default();
    let mut buf = [0u8; 256];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => frames.feed(&buf[..n], &mut |id| book.on_frame(id)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag() -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(false))
    }

    #[test]
    fn only_the_running_requests_id_cancels_it() {
        let book = CancelBook::default();
        let f = flag();
        book.check(1).unwrap();
        book.activate(1, &f);
        book.on_frame(2);
        assert!(!f.load(Ordering::Relaxed));
        book.on_frame(1);
        assert!(f.load(Ordering::Relaxed));
        book.complete(1);
        // The frame for 2 that arrived while 1 ran was dropped, not kept.
        let g = flag();
        book.activate(2, &g);
        assert!(!g.load(Ordering::Relaxed));
        book.complete(2);
    }

    #[test]
    fn an_early_frame_cancels_its_request_when_it_starts() {
        let book = CancelBook::default();
        book.on_frame(3);
        book.on_frame(4); // the slot holds one id: ignored
        let f = flag();
        book.activate(3, &f);
        assert!(f.load(Ordering::Relaxed));
        book.complete(3);
        let g = flag();
        book.activate(4, &g);
        assert!(!g.load(Ordering::Relaxed));
        book.complete(4);
    }

    #[test]
    fn stale_and_late_frames_are_dropped() {
        let book = CancelBook::default();
        let f = flag();
        book.activate(5, &f);
        book.complete(5);
        book.on_frame(5); // late: after its done
        book.on_frame(4); // stale
        book.on_frame(0); // never an id
        let g = flag();
        book.activate(6, &g);
        assert!(!g.load(Ordering::Relaxed));
        assert_eq!(book.check(7), Err(CancelIdError::AlreadyActive));
        book.complete(6);
        assert_eq!(book.check(6), Err(CancelIdError::Stale));
        assert_eq!(book.check(2), Err(CancelIdError::Stale));
        assert_eq!(book.check(7), Ok(()));
        // A pending id for a request that then finishes without it is dropped.
        book.on_frame(8);
        let h = flag();
        book.activate(9, &h);
        assert!(!h.load(Ordering::Relaxed));
        book.complete(9);
        let i = flag();
        book.activate(10, &i);
        assert!(!i.load(Ordering::Relaxed));
    }

    #[test]
    fn frames_are_read_from_a_stream_in_pieces() {
        let book = CancelBook::default();
        let f = flag();
        book.activate(77, &f);
        let bytes = [1u64.to_le_bytes(), 77u64.to_le_bytes()].concat();
        read_frames(&bytes[..], &book);
        assert!(f.load(Ordering::Relaxed));
    }
}
