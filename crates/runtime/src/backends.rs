//! The delegate backends a program's `DelegateCall`s resolve against at load, and the
//! named data they read their weights from.

use std::collections::BTreeMap;
use std::sync::Arc;

use etch_format::{DataFile, ProgramFile};
use etch_kernels::Backend;
use etch_kernels::backend::{NamedBytes, NamedDataMap};

/// Backends by id (`XnnpackBackend`, ...).
#[derive(Clone, Default)]
pub struct BackendRegistry {
    backends: BTreeMap<&'static str, Arc<dyn Backend>>,
}

impl BackendRegistry {
    /// A registry with no backends: every delegated program fails to load.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every backend etch ships.
    ///
    /// A new backend crate registers itself here, one line per backend.
    pub fn with_defaults() -> Self {
        let mut r = Self::empty();
        r.register(Arc::new(etch_xnnpack::XnnpackBackend::new()));
        r
    }

    /// Adds (or replaces) a backend under its id.
    pub fn register(&mut self, backend: Arc<dyn Backend>) {
        self.backends.insert(backend.id(), backend);
    }

    /// The backend of this id, if registered and available on this machine.
    pub fn get(&self, id: &str) -> Option<&Arc<dyn Backend>> {
        self.backends.get(id).filter(|b| b.is_available())
    }

    /// Registered ids, sorted.
    pub fn ids(&self) -> Vec<&'static str> {
        self.backends.keys().copied().collect()
    }
}

impl std::fmt::Debug for BackendRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.backends.keys()).finish()
    }
}

/// The named data of a program's own segments, then of its `.ptd` files, in that order.
pub(crate) struct ProgramNamedData<'a> {
    pub(crate) file: &'a ProgramFile,
    pub(crate) data_files: &'a [DataFile],
}

impl NamedDataMap for ProgramNamedData<'_> {
    fn get(&self, key: &str) -> Option<NamedBytes<'_>> {
        if let Some(range) = self.file.named_data(key) {
            return Some(NamedBytes {
                source: self.file.bytes(),
                offset: range.offset,
                len: range.len,
            });
        }
        self.data_files.iter().find_map(|d| {
            d.get(key).map(|(range, _)| NamedBytes {
                source: d.bytes(),
                offset: range.offset,
                len: range.len,
            })
        })
    }
}
