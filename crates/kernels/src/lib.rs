//! etch kernels layer.
