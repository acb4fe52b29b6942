//! The kernels, one file per op family. Each family exposes `register`.

pub mod binary;
pub mod channel_norm;
pub mod compare;
pub mod conv;
pub mod convert;
pub mod create;
pub mod cumsum;
pub mod distance;
pub mod elementwise;
pub mod embedding;
pub mod glu;
pub mod grid_sample;
pub mod index;
pub mod layout;
pub mod llama;
pub mod matmul;
pub mod norm;
pub mod pad;
pub mod pool;
pub mod prim;
pub mod quantized;
pub mod random;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod topk;
pub mod unary;
pub mod unary_math;
pub mod upsample;
pub mod window;

use crate::{KernelError, Registry, Tensor};

/// Fails with [`KernelError::DtypeMismatch`] unless `found` has `expected`'s dtype.
pub(crate) fn same_dtype(expected: &Tensor, found: &Tensor) -> Result<(), KernelError> {
    if expected.dtype() == found.dtype() {
        Ok(())
    } else {
        Err(KernelError::DtypeMismatch {
            expected: expected.dtype(),
            found: found.dtype(),
        })
    }
}

/// Fails with [`KernelError::UnsupportedDtype`] (naming `what`) unless `t` is f32.
pub(crate) fn f32_only(t: &Tensor, what: &'static str) -> Result<(), KernelError> {
    if t.dtype() == etch_base::ScalarType::Float {
        Ok(())
    } else {
        Err(KernelError::UnsupportedDtype {
            dtype: t.dtype(),
            what,
        })
    }
}

/// Registers every kernel etch ships.
pub fn register_all(r: &mut Registry) {
    prim::register(r);
    binary::register(r);
    compare::register(r);
    unary::register(r);
    unary_math::register(r);
    reduce::register(r);
    cumsum::register(r);
    softmax::register(r);
    glu::register(r);
    norm::register(r);
    create::register(r);
    convert::register(r);
    shape::register(r);
    index::register(r);
    embedding::register(r);
    matmul::register(r);
    quantized::register(r);
    llama::register(r);
    conv::register(r);
    channel_norm::register(r);
    pool::register(r);
    pad::register(r);
    upsample::register(r);
    topk::register(r);
    distance::register(r);
    grid_sample::register(r);
    random::register(r);
}
