//! The `--load` option shared by `run` and `generate`.

use etch_runtime::LoadMode;

/// How to bring the `.pte` file into memory.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LoadArg {
    /// Memory-map the file: fastest load, weights paged in from the page cache.
    Mmap,
    /// Memory-map and lock the pages in RAM (fails if the lock limit is too low).
    MmapLocked,
    /// Read the file into private memory.
    Read,
    /// Read the file into private memory on transparent huge pages (Linux): fewer TLB
    /// misses when every weight is streamed per token; a slower load.
    HugePages,
}

impl From<LoadArg> for LoadMode {
    fn from(a: LoadArg) -> LoadMode {
        match a {
            LoadArg::Mmap => LoadMode::Mmap,
            LoadArg::MmapLocked => LoadMode::MmapLocked,
            LoadArg::Read => LoadMode::File,
            LoadArg::HugePages => LoadMode::HugePages,
        }
    }
}
