//! etch runtime layer.
