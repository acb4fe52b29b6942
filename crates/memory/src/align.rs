//! Alignment arithmetic shared by the allocators.

use crate::AllocError;

/// Checks that `align` is a power of two.
pub fn check_alignment(align: usize) -> Result<(), AllocError> {
    if align.is_power_of_two() {
        Ok(())
    } else {
        Err(AllocError::InvalidAlignment { align })
    }
}

/// Rounds `value` up to a multiple of `align` (a power of two), or `None` on overflow.
pub fn align_up(value: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    value.checked_add(align - 1).map(|v| v & !(align - 1))
}
