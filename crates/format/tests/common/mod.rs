//! Test helpers: a FlatBuffers writer and `.pte`/`.ptd` descriptions.
#![allow(dead_code)]

pub mod data_file;
pub mod flatbuffers;
pub mod program;

/// The repository's `tests/fixtures` folder.
pub fn fixtures_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The `.pte` files under `tests/fixtures`, sorted (none when the folder is missing).
pub fn fixture_files() -> Vec<std::path::PathBuf> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(fixtures_dir())
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "pte"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}
