//! Immutable, cheaply clonable byte sources: a static slice, an owned aligned buffer,
//! or a memory-mapped file.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// Read-only bytes whose address never changes while any clone is alive.
///
/// ```
/// let b = etch_memory::SharedBytes::from_vec_aligned(vec![1, 2, 3]).unwrap();
/// assert_eq!(b.as_slice(), &[1, 2, 3]);
/// ```
#[derive(Clone, Debug)]
pub enum SharedBytes {
    Static(&'static [u8]),
    Heap(Arc<crate::AlignedBuffer>),
    Mapped(Arc<MappedFile>),
}

/// Alignment of file contents read into memory (cache-line, enough for every dtype).
pub const FILE_ALIGNMENT: usize = 64;

impl SharedBytes {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            SharedBytes::Static(s) => s,
            SharedBytes::Heap(b) => b.as_slice(),
            SharedBytes::Mapped(m) => m.as_slice(),
        }
    }

    /// Copies `bytes` into a 64-byte-aligned buffer.
    pub fn from_vec_aligned(bytes: Vec<u8>) -> Result<Self, crate::AllocError> {
        Ok(SharedBytes::Heap(Arc::new(
            crate::AlignedBuffer::copy_from(&bytes, FILE_ALIGNMENT)?,
        )))
    }

    /// Reads a whole file into a 64-byte-aligned buffer.
    pub fn read_file(path: &Path) -> std::io::Result<Self> {
        use std::io::Read;
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let len = usize::try_from(len)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "file too large"))?;
        let mut buf = crate::AlignedBuffer::zeroed(len, FILE_ALIGNMENT)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e.to_string()))?;
        file.read_exact(buf.as_mut_slice())?;
        Ok(SharedBytes::Heap(Arc::new(buf)))
    }

    /// Memory-maps a file read-only; with `lock`, also `mlock`s its pages
    /// (errors from mlock are reported, not ignored).
    pub fn map_file(path: &Path, lock: bool) -> std::io::Result<Self> {
        Ok(SharedBytes::Mapped(Arc::new(MappedFile::open(path, lock)?)))
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// A read-only memory map of a whole file.
#[derive(Debug)]
pub struct MappedFile {
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path, lock: bool) -> std::io::Result<Self> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            // mmap of an empty file fails on Linux; an empty file is just empty bytes.
            return Ok(Self { map: None });
        }
        // SAFETY: the map is read-only. A concurrent modification of the file by
        // another process is outside what Rust can guard; etch documents that files
        // must not be modified while loaded, as every mmap-based loader does.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        if lock {
            map.lock()?;
        }
        Ok(Self { map: Some(map) })
    }

    /// The mapped bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
