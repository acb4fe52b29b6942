//! How a tensor's shape may change at run time (ExecuTorch's `TensorShapeDynamism`).

/// How a tensor's shape may change at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShapeDynamism {
    #[default]
    /// Sizes never change.
    Static,
    /// Sizes in the file are upper bounds (by element count).
    DynamicBound,
    /// Any size; the stock runtime rejects it when loading a method.
    DynamicUnbound,
}
