//! A small harness for calling kernels outside a method, for tests and benches.
//!
//! ```
//! use etch_kernels::testing::Harness;
//! use etch_base::ScalarType;
//! let mut h = Harness::new();
//! let x = h.tensor(&[2], &[1.0f32, 2.0]);
//! let d = h.int(0);
//! let out = h.int(-1);
//! h.call("aten::sym_size.int", &[x, d, out]).unwrap();
//! assert_eq!(h.value(out), &etch_kernels::EValue::Int(2));
//! ```

use std::sync::Arc;

use etch_base::{ScalarType, ShapeDynamism};
use etch_memory::{AlignedBuffer, MemoryAllocator, Span, Storage, TempScope};

use crate::{
    Args, EValue, Element, Epilogue, KernelContext, KernelError, Registry, Tensor, ThreadPool,
};

/// Row-major multi-index of flat position `f` in `sizes` (for element-by-element
/// references in tests).
pub fn unravel(mut f: usize, sizes: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; sizes.len()];
    for d in (0..sizes.len()).rev() {
        idx[d] = f % sizes[d];
        f /= sizes[d];
    }
    idx
}

/// Flat row-major position of multi-index `idx` in `sizes` (the inverse of [`unravel`]).
pub fn ravel(idx: &[usize], sizes: &[usize]) -> usize {
    idx.iter().zip(sizes).fold(0, |acc, (&i, &s)| acc * s + i)
}

/// Owns storage, a value table, a pool and a registry; builds values and runs kernels.
pub struct Harness {
    pub storage: Storage,
    pub values: Vec<EValue>,
    pub pool: ThreadPool,
    pub registry: Registry,
    pub temp: Option<Box<dyn MemoryAllocator>>,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// A serial harness with every default kernel and no temp allocator (scratch
    /// falls back to the heap).
    pub fn new() -> Self {
        Self::with_pool(ThreadPool::serial())
    }

    /// A harness over a given pool.
    pub fn with_pool(pool: ThreadPool) -> Self {
        Self {
            storage: Storage::new(),
            values: Vec::new(),
            pool,
            registry: Registry::with_defaults(),
            temp: None,
        }
    }

    /// Adds a value and returns its index.
    pub fn push(&mut self, v: EValue) -> usize {
        self.values.push(v);
        self.values.len() - 1
    }

    /// An Int value.
    pub fn int(&mut self, v: i64) -> usize {
        self.push(EValue::Int(v))
    }

    /// A Double value.
    pub fn double(&mut self, v: f64) -> usize {
        self.push(EValue::Double(v))
    }

    /// A Bool value.
    pub fn bool(&mut self, v: bool) -> usize {
        self.push(EValue::Bool(v))
    }

    /// A None value.
    pub fn none(&mut self) -> usize {
        self.push(EValue::None)
    }

    /// An IntList of fresh Int values.
    pub fn int_list(&mut self, items: &[i64]) -> usize {
        let idx: Vec<usize> = items.iter().map(|&v| self.int(v)).collect();
        self.push(EValue::IntList(Arc::from(idx)))
    }

    /// A TensorList of existing tensor values.
    pub fn tensor_list(&mut self, items: &[usize]) -> usize {
        self.push(EValue::TensorList(Arc::from(items.to_vec())))
    }

    /// An OptionalTensorList of existing tensor values.
    pub fn opt_tensor_list(&mut self, items: &[Option<usize>]) -> usize {
        self.push(EValue::OptionalTensorList(Arc::from(items.to_vec())))
    }

    fn region(&mut self, nbytes: usize) -> Span {
        let buf = AlignedBuffer::zeroed(nbytes, 64).expect("test buffer");
        let region = self.storage.add_buffer(buf);
        Span {
            region,
            offset: 0,
            len: nbytes,
        }
    }

    /// A static contiguous tensor holding `data`.
    pub fn tensor<T: Element>(&mut self, sizes: &[usize], data: &[T]) -> usize {
        self.tensor_raw(T::DTYPE, sizes, bytemuck::cast_slice(data))
    }

    /// A read-only contiguous tensor holding `data` on transparent huge pages (as a
    /// program's weights are when loaded with huge pages), for benchmarks.
    pub fn tensor_huge_pages<T: Element>(&mut self, sizes: &[usize], data: &[T]) -> usize {
        let bytes = bytemuck::cast_slice(data);
        let shared = etch_memory::SharedBytes::copy_to_huge_pages(bytes).expect("huge-page buffer");
        let region = self.storage.add_shared(shared);
        let span = Span {
            region,
            offset: 0,
            len: bytes.len(),
        };
        let t = Tensor::new(T::DTYPE, sizes, Some(span)).expect("valid test shape");
        assert_eq!(t.nbytes(), bytes.len(), "data length must match the shape");
        self.push(EValue::Tensor(t))
    }

    /// A static contiguous tensor of `dtype` holding raw bytes (bool as 0/1 bytes).
    pub fn tensor_raw(&mut self, dtype: ScalarType, sizes: &[usize], bytes: &[u8]) -> usize {
        let span = self.region(bytes.len());
        self.storage
            .bytes_mut(span)
            .expect("fresh region")
            .copy_from_slice(bytes);
        let t = Tensor::new(dtype, sizes, Some(span)).expect("valid test shape");
        assert_eq!(t.nbytes(), bytes.len(), "data length must match the shape");
        self.push(EValue::Tensor(t))
    }

    /// A zero-filled output tensor with `bound` sizes; dynamic so kernels may resize it.
    pub fn out(&mut self, dtype: ScalarType, bound: &[usize]) -> usize {
        let numel: usize = bound.iter().product();
        let span = self.region(numel * dtype.element_size());
        let order: Vec<u8> = (0..bound.len() as u8).collect();
        let t = Tensor::with_layout(
            dtype,
            bound,
            &order,
            ShapeDynamism::DynamicBound,
            Some(span),
        )
        .expect("valid test shape");
        self.push(EValue::Tensor(t))
    }

    /// A static tensor with `sizes` and the given dim order, holding `data` given in
    /// row-major logical order (stored permuted into the dim order).
    pub fn tensor_with_order<T: Element>(
        &mut self,
        sizes: &[usize],
        dim_order: &[u8],
        data: &[T],
    ) -> usize {
        let bytes = std::mem::size_of_val(data);
        let span = self.region(bytes);
        let t = Tensor::with_layout(
            T::DTYPE,
            sizes,
            dim_order,
            ShapeDynamism::Static,
            Some(span),
        )
        .expect("valid test shape");
        assert_eq!(t.nbytes(), bytes, "data length must match the shape");
        let mem: &mut [T] =
            bytemuck::cast_slice_mut(self.storage.bytes_mut(span).expect("fresh region"));
        for (logical, &v) in data.iter().enumerate() {
            mem[t.storage_index(logical)] = v;
        }
        self.push(EValue::Tensor(t))
    }

    /// A zero-filled, resizable output tensor with `bound` sizes and the given dim order.
    pub fn out_with_order(
        &mut self,
        dtype: ScalarType,
        bound: &[usize],
        dim_order: &[u8],
    ) -> usize {
        let numel: usize = bound.iter().product();
        let span = self.region(numel * dtype.element_size());
        let t = Tensor::with_layout(
            dtype,
            bound,
            dim_order,
            ShapeDynamism::DynamicBound,
            Some(span),
        )
        .expect("valid test shape");
        self.push(EValue::Tensor(t))
    }

    /// Runs a registered kernel on the given value indices.
    pub fn call(&mut self, op: &str, args: &[usize]) -> Result<(), KernelError> {
        self.call_with_epilogue(op, args, Epilogue::default())
    }

    /// Runs a registered kernel on the given value indices, as a step with `epilogue`
    /// folded into it.
    pub fn call_with_epilogue(
        &mut self,
        op: &str,
        args: &[usize],
        epilogue: Epilogue,
    ) -> Result<(), KernelError> {
        let kernel = self
            .registry
            .get(op)
            .ok_or_else(|| KernelError::invalid(format!("no kernel for {op}")))?;
        let temp = TempScope::new(self.temp.as_deref());
        let ctx =
            KernelContext::new(self.storage.access(), temp, &self.pool).with_epilogue(epilogue);
        let mut a = Args::new(&mut self.values, args);
        let r = kernel(&ctx, &mut a);
        drop(ctx);
        if let Some(t) = self.temp.as_mut() {
            t.reset();
        }
        r
    }

    /// A value.
    pub fn value(&self, idx: usize) -> &EValue {
        &self.values[idx]
    }

    /// A tensor value's metadata.
    pub fn tensor_meta(&self, idx: usize) -> Tensor {
        *self.values[idx].as_tensor().expect("a tensor value")
    }

    /// A tensor's elements (current shape) as `T`.
    pub fn read<T: Element>(&mut self, idx: usize) -> Vec<T> {
        let bytes = self.read_bytes(idx);
        bytemuck::pod_collect_to_vec(&bytes)
    }

    /// A tensor's elements (current shape) in row-major logical order, whatever its
    /// dim order.
    pub fn read_logical<T: Element>(&mut self, idx: usize) -> Vec<T> {
        let t = self.tensor_meta(idx);
        let mem = self.read::<T>(idx);
        (0..t.numel()).map(|i| mem[t.storage_index(i)]).collect()
    }

    /// A tensor's bytes (current shape).
    pub fn read_bytes(&mut self, idx: usize) -> Vec<u8> {
        let t = self.tensor_meta(idx);
        let span = t.data().expect("tensor with data");
        let span = Span {
            len: t.nbytes(),
            ..span
        };
        self.storage.bytes(span).expect("in bounds").to_vec()
    }
}
