//! etch's base types, below every other crate: dtypes (`ScalarType`), shape dynamism,
//! the one element trait, `Bool8`, `MAX_RANK`, and the strided-view / broadcast helper.
