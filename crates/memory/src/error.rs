//! Errors of the memory layer.

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("alignment {align} is not a power of two")]
    InvalidAlignment { align: usize },
    #[error("allocation size overflows: {size} bytes at alignment {align}")]
    SizeOverflow { size: usize, align: usize },
    #[error("allocator exhausted: requested {requested} bytes, {remaining} bytes remaining")]
    Exhausted { requested: usize, remaining: usize },
    #[error("the system allocator could not provide {size} bytes")]
    SystemOutOfMemory { size: usize },
}

/// Why a tensor's bytes could not be borrowed from a [`crate::Storage`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("region {region} does not exist")]
    UnknownRegion { region: u32 },
    #[error("bytes {offset}..{offset}+{len} are outside region {region} of {region_len} bytes")]
    OutOfBounds {
        region: u32,
        offset: usize,
        len: usize,
        region_len: usize,
    },
    #[error("region {region} is read-only (constant data)")]
    ReadOnly { region: u32 },
    #[error(
        "bytes {offset}..{offset}+{len} of region {region} are already borrowed by another argument of this call"
    )]
    Aliased {
        region: u32,
        offset: usize,
        len: usize,
    },
    #[error(
        "bytes at offset {offset} of region {region} are not aligned to {align} for this element type"
    )]
    Misaligned {
        region: u32,
        offset: usize,
        align: usize,
    },
    #[error("{len} bytes is not a whole number of {element_size}-byte elements")]
    Size { len: usize, element_size: usize },
    #[error("too many simultaneous borrows in one call (limit {limit})")]
    TooManyBorrows { limit: usize },
}
