//! Immutable, cheaply clonable byte sources: a static slice, an owned aligned buffer,
//! a memory-mapped file, or weights made at load.

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
    /// Bytes made at load and streamed on every call (folded weights): large ones on
    /// transparent huge pages, carved from shared slabs (see [`crate::WeightBuffer`]).
    Weights(Arc<crate::WeightBuffer<u8>>),
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
            SharedBytes::Weights(w) => w,
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

    /// Reads a whole file into fresh anonymous memory that asks the kernel for
    /// transparent huge pages (`madvise(MADV_HUGEPAGE)` on Linux; elsewhere plain
    /// pages). Weights streamed once per token then cross 2 MiB pages instead of 4 KiB
    /// ones: 512 times fewer TLB misses. The memory is private (not page cache) and
    /// read-only once filled.
    pub fn read_file_huge_pages(path: &Path) -> std::io::Result<Self> {
        use std::io::Read;
        let mut file = File::open(path)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "file too large"))?;
        if len == 0 {
            return Ok(SharedBytes::Static(&[]));
        }
        let mut map = huge_page_map(len)?;
        file.read_exact(&mut map)?;
        Ok(SharedBytes::Mapped(Arc::new(MappedFile {
            map: Some(map.make_read_only()?),
            is_file: false,
        })))
    }

    /// Copies `bytes` into fresh read-only memory on transparent huge pages where the OS
    /// offers them (as [`SharedBytes::read_file_huge_pages`] does for a file).
    pub fn copy_to_huge_pages(bytes: &[u8]) -> std::io::Result<Self> {
        if bytes.is_empty() {
            return Ok(SharedBytes::Static(&[]));
        }
        let mut map = huge_page_map(bytes.len())?;
        map.copy_from_slice(bytes);
        Ok(SharedBytes::Mapped(Arc::new(MappedFile {
            map: Some(map.make_read_only()?),
            is_file: false,
        })))
    }

    /// Gives the resident pages of a memory-mapped file back to the page cache
    /// (`madvise(MADV_DONTNEED)`; Unix only), so that they stop counting in this process's
    /// resident memory. The bytes do not change: a later read maps the pages again from
    /// the page cache or the file. Owned bytes are left alone (dropping their pages
    /// would lose them). Returns whether pages were released.
    pub fn release_pages(&self) -> bool {
        match self {
            SharedBytes::Mapped(m) => m.release_pages(),
            _ => false,
        }
    }

    /// Memory-maps a file read-only; with `lock`, also `mlock`s its pages
    /// (errors from mlock are reported, not ignored).
    pub fn map_file(path: &Path, lock: bool) -> std::io::Result<Self> {
        Ok(SharedBytes::Mapped(Arc::new(MappedFile::open(path, lock)?)))
    }
}

/// `len` bytes of zeroed anonymous memory, advised to use transparent huge pages.
fn huge_page_map(len: usize) -> std::io::Result<memmap2::MmapMut> {
    let map = memmap2::MmapMut::map_anon(len)?;
    #[cfg(target_os = "linux")]
    {
        // Advisory: without THP support the kernel keeps small pages.
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    Ok(map)
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
    /// A map of a file (not anonymous memory holding a copy).
    is_file: bool,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path, lock: bool) -> std::io::Result<Self> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            // mmap of an empty file fails on Linux; an empty file is just empty bytes.
            return Ok(Self {
                map: None,
                is_file: true,
            });
        }
        // SAFETY: the map is read-only. A concurrent modification of the file by
        // another process is outside what Rust can guard; etch documents that files
        // must not be modified while loaded, as every mmap-based loader does.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        if lock {
            map.lock()?;
        }
        Ok(Self {
            map: Some(map),
            is_file: true,
        })
    }

    /// See [`SharedBytes::release_pages`]: only a map of a file releases its pages.
    fn release_pages(&self) -> bool {
        #[cfg(unix)]
        if self.is_file
            && let Some(map) = &self.map
        {
            // SAFETY: the map is a read-only map of a file, so no page holds data of
            // this process's own: after MADV_DONTNEED a read faults the same bytes back
            // in from the page cache or the file (the file must not change while loaded,
            // as for every map). Concurrent readers see the same bytes throughout.
            return unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) }.is_ok();
        }
        false
    }

    /// The mapped bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("etch-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    #[cfg_attr(miri, ignore)] // file I/O and mmap
    fn every_way_of_loading_a_file_gives_its_bytes() {
        let data: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
        let path = temp_file("load", &data);
        for bytes in [
            SharedBytes::read_file(&path).unwrap(),
            SharedBytes::map_file(&path, false).unwrap(),
            SharedBytes::read_file_huge_pages(&path).unwrap(),
            SharedBytes::copy_to_huge_pages(&data).unwrap(),
        ] {
            assert_eq!(bytes.as_slice(), &data[..]);
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore)] // file I/O
    fn empty_and_missing_files() {
        let path = temp_file("empty", &[]);
        assert!(
            SharedBytes::read_file_huge_pages(&path)
                .unwrap()
                .as_slice()
                .is_empty()
        );
        assert!(
            SharedBytes::map_file(&path, false)
                .unwrap()
                .as_slice()
                .is_empty()
        );
        std::fs::remove_file(&path).unwrap();
        assert!(SharedBytes::read_file_huge_pages(&path).is_err());
    }

    #[test]
    #[cfg_attr(miri, ignore)] // file I/O and mmap
    fn released_pages_of_a_map_read_back_the_same_bytes() {
        let data: Vec<u8> = (0..3 * 4096 + 17).map(|i| (i * 7 % 251) as u8).collect();
        let path = temp_file("release", &data);
        let map = SharedBytes::map_file(&path, false).unwrap();
        assert_eq!(map.as_slice(), &data[..]);
        assert!(map.release_pages());
        assert_eq!(map.as_slice(), &data[..]);
        // A copy in this process's memory is left alone.
        let copy = SharedBytes::copy_to_huge_pages(&data).unwrap();
        assert!(!copy.release_pages());
        assert_eq!(copy.as_slice(), &data[..]);
        std::fs::remove_file(&path).unwrap();
    }
}
