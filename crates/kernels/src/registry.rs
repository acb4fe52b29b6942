//! The operator registry: `namespace::name.overload` to kernel function.

use std::collections::HashMap;

use crate::{Args, BatchKernelFn, KernelContext, KernelError};

/// A kernel: reads its arguments, writes its outputs, returns a typed error.
pub type KernelFn = fn(&KernelContext<'_>, &mut Args<'_>) -> Result<(), KernelError>;

/// Maps qualified operator names (`aten::add.out`) to kernels.
#[derive(Clone, Default)]
pub struct Registry {
    kernels: HashMap<&'static str, KernelFn>,
    /// Batched forms of some kernels (see [`crate::Batch`]).
    batched: HashMap<&'static str, BatchKernelFn>,
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every kernel etch ships.
    ///
    /// ```
    /// let r = etch_kernels::Registry::with_defaults();
    /// assert!(r.get("executorch_prim::et_view.default").is_some());
    /// ```
    pub fn with_defaults() -> Self {
        let mut r = Self::empty();
        crate::ops::register_all(&mut r);
        r
    }

    /// Adds (or replaces) a kernel.
    pub fn register(&mut self, name: &'static str, kernel: KernelFn) {
        self.kernels.insert(name, kernel);
    }

    /// Adds (or replaces) the batched form of a kernel: one instruction for several
    /// sessions at once, sharing one pass over constant weights.
    pub fn register_batched(&mut self, name: &'static str, kernel: BatchKernelFn) {
        self.batched.insert(name, kernel);
    }

    /// The batched form of a kernel, where it has one.
    pub fn get_batched(&self, name: &str) -> Option<BatchKernelFn> {
        self.batched.get(name).copied()
    }

    /// The kernel for a qualified name.
    pub fn get(&self, name: &str) -> Option<KernelFn> {
        self.kernels.get(name).copied()
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.kernels.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({} kernels)", self.kernels.len())
    }
}
