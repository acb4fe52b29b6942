//! Owned values passed into and out of methods.

use etch_format::ScalarType;

/// A tensor owned by the caller: dtype, sizes and contiguous little-endian bytes.
///
/// ```
/// use etch_runtime::HostTensor;
/// let t = HostTensor::from_slice(&[2, 2], &[1.0f32, 2.0, 3.0, 4.0]);
/// assert_eq!(t.as_slice::<f32>().unwrap()[3], 4.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub dtype: ScalarType,
    pub sizes: Vec<usize>,
    pub data: Vec<u8>,
}

impl HostTensor {
    /// A tensor of element type `T` copied from `data`.
    pub fn from_slice<T: etch_kernels::Element>(sizes: &[usize], data: &[T]) -> Self {
        Self {
            dtype: T::DTYPE,
            sizes: sizes.to_vec(),
            data: bytemuck::cast_slice(data).to_vec(),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    /// The elements as `T` (None if `T` is not the dtype).
    pub fn as_slice<T: etch_kernels::Element>(&self) -> Option<Vec<T>> {
        (T::DTYPE == self.dtype).then(|| bytemuck::pod_collect_to_vec(&self.data))
    }
}

/// A method input or output.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Int(i64),
    Double(f64),
    Bool(bool),
    String(String),
    Tensor(HostTensor),
}

impl Value {
    /// The tag name, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Int(_) => "Int",
            Value::Double(_) => "Double",
            Value::Bool(_) => "Bool",
            Value::String(_) => "String",
            Value::Tensor(_) => "Tensor",
        }
    }
}
