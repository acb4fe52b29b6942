//! The `--load` option shared by `run` and `generate`.

use etch_runtime::LoadMode;

/// How to bring the `.pte` file into memory.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LoadArg {
    /// Memory-map the file: fastest load, weights paged in from the page cache. The file
    /// must not change while in use (truncating it kills the process with SIGBUS).
    Mmap,
    /// Memory-map and lock the pages in RAM (fails if the lock limit is too low).
    MmapLocked,
    /// Read the file into private memory (safe if the file changes afterwards).
    Read,
    /// Read the file into private memory on transparent huge pages (Linux): fewer TLB
    /// misses when every weight is streamed per token; a slower load.
    HugePages,
    /// Choose by the program: huge pages for one without delegates (its kernels stream
    /// the file's weights per token); a map for a delegated one, whose weights are packed
    /// at load into memory of etch's own, the file's pages released afterwards.
    Auto,
}

impl From<LoadArg> for LoadMode {
    fn from(a: LoadArg) -> LoadMode {
        match a {
            LoadArg::Mmap => LoadMode::Mmap,
            LoadArg::MmapLocked => LoadMode::MmapLocked,
            LoadArg::Read => LoadMode::Read,
            LoadArg::HugePages => LoadMode::HugePages,
            LoadArg::Auto => LoadMode::Auto,
        }
    }
}

/// Help of `--no-fold`, shared by the commands that load a program.
pub const NO_FOLD_HELP: &str = "Run the program's instructions as they are. By default, \
steps whose inputs are all constants (a permute of a weight) run once at load and become \
constants, batch norms after f32 convolutions are folded into their weights and \
biases, activations after them into their stores, and max poolings whose indices nothing \
reads write their values alone; --stats reports the bytes this keeps";

/// Parses `--max-memory` (`2G`, `512M`, `1048576`).
pub fn parse_max_memory(text: &str) -> Result<u64, String> {
    etch_memory::parse_byte_size(text).ok_or_else(|| {
        format!("{text:?} is not a byte size (write it as 1048576, 512K, 300M, 2G or 1.5GiB)")
    })
}

/// Help of `--max-memory`, shared by the commands that load a program.
pub const MAX_MEMORY_HELP: &str = "The most memory the program may hold (file when read, \
planned memory and KV cache, packed and folded weights), e.g. 2G or 512M; a load that needs \
more fails before allocating and says how much it needs. Default: the memory the system \
reports available";

/// Names `path` in an error about loading it, unless the message already names it or
/// one of `also` (I/O and tokenizer errors carry their file), so that every failure to
/// load says which file was wrong.
pub fn naming_file<T, E>(
    result: Result<T, E>,
    path: &std::path::Path,
    also: &[&std::path::Path],
) -> anyhow::Result<T>
where
    E: Into<anyhow::Error>,
{
    result.map_err(|e| {
        let e: anyhow::Error = e.into();
        let message = format!("{e:#}");
        let named = std::iter::once(path)
            .chain(also.iter().copied())
            .any(|p| message.contains(&p.display().to_string()));
        if named {
            e
        } else {
            e.context(path.display().to_string())
        }
    })
}
