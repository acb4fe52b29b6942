//! Named limits on everything a file can make the loader allocate or walk.
//!
//! A `.pte` is untrusted input: every count read from it is checked against one of
//! these before anything is allocated, so a corrupt or hostile file fails with
//! [`FormatError::LimitExceeded`](crate::FormatError::LimitExceeded) instead of
//! exhausting memory. The values are far above what real programs use (a llama
//! export has 8 plans, ~400 values and ~150 instructions).

/// Execution plans (methods) in one program.
pub const MAX_PLANS: usize = 4096;
/// Values (EValues) in one plan.
pub const MAX_VALUES: usize = 1 << 22;
/// Chains in one plan.
pub const MAX_CHAINS: usize = 1 << 16;
/// Instructions in one chain.
pub const MAX_INSTRUCTIONS: usize = 1 << 22;
/// Operator table entries in one plan.
pub const MAX_OPERATORS: usize = 1 << 16;
/// Delegates in one plan.
pub const MAX_DELEGATES: usize = 1 << 16;
/// Compile specs of one delegate.
pub const MAX_COMPILE_SPECS: usize = 1 << 16;
/// Arguments of one instruction, items of one list value, inputs/outputs of a plan
/// or chain.
pub const MAX_LIST_ITEMS: usize = 1 << 24;
/// Entries of `non_const_buffer_sizes` (planned memory buffers + the placeholder).
pub const MAX_PLANNED_BUFFERS: usize = 1 << 16;
/// Bytes of one planned memory buffer (1 TiB).
pub const MAX_PLANNED_BUFFER_BYTES: u64 = 1 << 40;
/// Segments of a program or `.ptd` file.
pub const MAX_SEGMENTS: usize = 1 << 20;
/// Entries of a constant or mutable-data offset table, or of `constant_buffer`.
pub const MAX_CONSTANTS: usize = 1 << 24;
/// Named-data entries.
pub const MAX_NAMED_DATA: usize = 1 << 20;
/// Inline delegate payloads.
pub const MAX_INLINE_DELEGATE_DATA: usize = 1 << 16;
/// Test cases of one method in a bundled program (`.bpte`).
pub const MAX_BUNDLED_TEST_CASES: usize = 1 << 16;
/// Inputs, or expected outputs, of one bundled test case.
pub const MAX_BUNDLED_VALUES: usize = 1 << 16;
/// Tensor rank (`kTensorDimensionLimit` in ExecuTorch).
pub const MAX_RANK: usize = etch_base::MAX_RANK;
/// Bytes of one tensor at its stored (upper-bound) sizes.
pub const MAX_TENSOR_BYTES: u64 = 1 << 48;
/// Nesting depth of tables below the root. The schema nests at most 6 deep; the
/// limit only matters for files that point tables back at their ancestors.
pub const MAX_TABLE_DEPTH: u32 = 32;
/// Decoded items (tables, vector elements, string bytes) allowed per byte of
/// FlatBuffers data. FlatBuffers may share one vector between many referrers, so
/// without this budget a small file could decode to an unbounded model.
pub const MAX_DECODED_ITEMS_PER_BYTE: u64 = 8;
/// The decode budget of a tiny file is at least this many items.
pub const MIN_DECODE_BUDGET: u64 = 1 << 20;
