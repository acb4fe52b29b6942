//! etch's numeric kernel library: plain functions over slices and strided views, with no
//! knowledge of operators, and one table of the best kernels for this CPU.
