//! Time per node inside delegates, when a session profiles: the delegate reports each
//! node it runs through [`NodeProfiler`], and the session adds the times up by backend
//! and node name.

use std::sync::{Mutex, PoisonError};

use etch_kernels::NodeProfiler;

/// The time one kind of delegate node took, over every call since profiling began.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelegateNodeProfile {
    /// The backend's id, e.g. `XnnpackBackend`.
    pub backend: String,
    /// The node as the backend names it, e.g. `Conv2d qs8`.
    pub node: String,
    pub runs: u64,
    pub nanos: u64,
}

/// The sums of one session, in the order the nodes first ran.
#[derive(Debug, Default)]
pub(crate) struct NodeTimes {
    rows: Mutex<Vec<DelegateNodeProfile>>,
}

impl NodeTimes {
    /// A profiler for the calls of one backend.
    pub(crate) fn of<'a>(&'a self, backend: &'a str) -> BackendNodeTimes<'a> {
        BackendNodeTimes {
            times: self,
            backend,
        }
    }

    pub(crate) fn rows(&self) -> Vec<DelegateNodeProfile> {
        self.rows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// [`NodeTimes`] seen from one backend's calls.
pub(crate) struct BackendNodeTimes<'a> {
    times: &'a NodeTimes,
    backend: &'a str,
}

impl NodeProfiler for BackendNodeTimes<'_> {
    fn record(&self, name: &str, nanos: u64) {
        let mut rows = self
            .times
            .rows
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match rows
            .iter_mut()
            .find(|r| r.node == name && r.backend == self.backend)
        {
            Some(row) => {
                row.runs += 1;
                row.nanos += nanos;
            }
            None => rows.push(DelegateNodeProfile {
                backend: self.backend.to_string(),
                node: name.to_string(),
                runs: 1,
                nanos,
            }),
        }
    }
}
