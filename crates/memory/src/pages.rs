//! Transparent huge pages for large, freshly allocated blocks.

/// Blocks of at least this many bytes are advised to use huge pages.
const MIN_BYTES: usize = 4 << 20;
/// The huge-page size of x86-64 and of aarch64 with 4 KiB base pages.
const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the whole 2 MiB pages inside `ptr..ptr + len` with
/// transparent huge pages (`madvise(MADV_HUGEPAGE)`, Linux only; advisory, so a kernel
/// without THP simply keeps small pages). Only for blocks of [`MIN_BYTES`] or more, fresh
/// from the allocator and not yet touched: a buffer streamed on every call (a KV cache)
/// then crosses 2 MiB pages, where the hardware prefetcher is not stopped every 4 KiB.
pub(crate) fn advise_huge_pages(ptr: *mut u8, len: usize) {
    if len < MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
        let end = (ptr as usize + len) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            // SAFETY: [start, end) lies inside the caller's live allocation and is
            // page-aligned; MADV_HUGEPAGE changes no contents and no mapping, only how
            // future faults are served.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len, HUGE_PAGE);
}
