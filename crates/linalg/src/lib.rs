//! etch's numeric kernel library: plain functions over slices and strided views, with no
//! knowledge of operators, and one table of the best kernels for this CPU.
//!
//! NHWC image kernels (used by the XNNPACK delegate, and later the portable
//! convolution ops): [`conv`] (im2col, depthwise, transposed, a direct reference),
//! [`pool`] (max, average, global average), [`resize`] (bilinear); [`dense`] holds
//! scalar reference matrix products.

pub mod conv;
pub mod dense;
pub mod pool;
pub mod resize;
