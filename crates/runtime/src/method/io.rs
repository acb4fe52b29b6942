//! Setting inputs and reading outputs.

use etch_format::ScalarType;
use etch_kernels::{EValue, Tensor};
use etch_memory::Span;

use super::Method;
use crate::{HostTensor, RuntimeError, Value};

/// A read-only view of an output tensor in the method's memory, valid until the next
/// `execute`. `bytes` are in the tensor's storage order (its dim order: a
/// channels-last output is stored pixel by pixel); [`TensorView::to_host`] gives
/// row-major logical order.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub tensor: Tensor,
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    /// The elements as `T` in storage order (None if `T` is not the dtype or the bytes
    /// are misaligned).
    pub fn as_slice<T: etch_kernels::Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.tensor.dtype() {
            return None;
        }
        bytemuck::try_cast_slice(self.bytes).ok()
    }

    /// An owned copy in row-major logical order (as numpy's C order), whatever the
    /// tensor's dim order.
    pub fn to_host(&self) -> HostTensor {
        let data = if self.tensor.is_contiguous() {
            self.bytes.to_vec()
        } else {
            let mut data = vec![0u8; self.bytes.len()];
            permute_elements(&self.tensor, self.bytes, &mut data, Direction::ToLogical);
            data
        };
        HostTensor {
            dtype: self.tensor.dtype(),
            sizes: self.tensor.sizes().to_vec(),
            data,
        }
    }
}

/// Which way [`permute_elements`] moves elements.
#[derive(Clone, Copy)]
enum Direction {
    /// Row-major logical order into the tensor's storage (dim) order.
    ToStorage,
    /// The tensor's storage order into row-major logical order.
    ToLogical,
}

/// Copies the elements of `t` between row-major logical order and its storage order.
/// Both slices hold `t.nbytes()` bytes (the caller checks).
fn permute_elements(t: &Tensor, src: &[u8], dst: &mut [u8], direction: Direction) {
    let size = t.dtype().element_size().max(1);
    for logical in 0..t.numel() {
        let stored = t.storage_index(logical);
        let (from, to) = match direction {
            Direction::ToStorage => (logical, stored),
            Direction::ToLogical => (stored, logical),
        };
        if let (Some(s), Some(d)) = (
            src.get(from * size..(from + 1) * size),
            dst.get_mut(to * size..(to + 1) * size),
        ) {
            d.copy_from_slice(s);
        }
    }
}

impl Method {
    /// Number of inputs.
    pub fn input_count(&self) -> usize {
        self.plan.inputs.len()
    }

    /// Number of outputs.
    pub fn output_count(&self) -> usize {
        self.plan.outputs.len()
    }

    fn input_slot(&self, index: usize) -> Result<usize, RuntimeError> {
        self.plan
            .inputs
            .get(index)
            .copied()
            .ok_or_else(|| RuntimeError::InputCount {
                method: self.plan.name.clone(),
                expected: self.plan.inputs.len(),
                got: index + 1,
            })
    }

    /// Sets tensor input `index` from raw little-endian bytes in row-major logical
    /// order (numpy's C order): the dtype must match, the shape must fit the input's
    /// dynamism rules, and the bytes are copied into the method's memory (so the
    /// caller's buffer need not outlive the call), permuted into the input's dim order
    /// when the program declares another one (a channels-last image input).
    /// Allocates nothing.
    pub fn set_input_tensor(
        &mut self,
        index: usize,
        dtype: ScalarType,
        sizes: &[usize],
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        let slot = self.input_slot(index)?;
        let method = &self.plan.name;
        let mut t = match self.values.get(slot) {
            Some(EValue::Tensor(t)) => *t,
            other => {
                return Err(RuntimeError::InputKind {
                    method: method.clone(),
                    index,
                    expected: other.map_or("?", |v| v.kind()).to_string(),
                    got: "Tensor".to_string(),
                });
            }
        };
        if t.dtype() != dtype {
            return Err(RuntimeError::InputDtype {
                method: method.clone(),
                index,
                expected: t.dtype(),
                got: dtype,
            });
        }
        let before = t;
        t.resize(sizes).map_err(|source| RuntimeError::InputShape {
            method: method.clone(),
            index,
            expected: before.sizes().to_vec(),
            got: sizes.to_vec(),
            source,
        })?;
        let nbytes = t.nbytes();
        if bytes.len() != nbytes {
            return Err(RuntimeError::InputValue {
                method: method.clone(),
                index,
                what: format!(
                    "shape {sizes:?} of {dtype} needs {nbytes} bytes, got {}",
                    bytes.len()
                ),
            });
        }
        let span = self
            .input_spans
            .get(index)
            .copied()
            .flatten()
            .ok_or_else(|| RuntimeError::InputValue {
                method: method.clone(),
                index,
                what: "input tensor has no storage".to_string(),
            })?;
        let dst = self
            .storage
            .bytes_mut(Span {
                len: nbytes,
                ..span
            })
            .map_err(|e| RuntimeError::InputValue {
                method: method.clone(),
                index,
                what: e.to_string(),
            })?;
        if t.is_contiguous() {
            dst.copy_from_slice(bytes);
        } else {
            permute_elements(&t, bytes, dst, Direction::ToStorage);
        }
        t.set_data(Some(span));
        self.values[slot] = EValue::Tensor(t);
        self.input_set[index] = true;
        Ok(())
    }

    /// Sets input `index`. Tensors are copied in; Int/Double/Bool inputs are baked
    /// into the program at export and must equal the traced value.
    pub fn set_input(&mut self, index: usize, value: &Value) -> Result<(), RuntimeError> {
        let slot = self.input_slot(index)?;
        if let Value::Tensor(t) = value {
            return self.set_input_tensor(index, t.dtype, &t.sizes, &t.data);
        }
        let current = &self.values[slot];
        let same = match (current, value) {
            (EValue::None, Value::None) => true,
            (EValue::Int(a), Value::Int(b)) => a == b,
            (EValue::Bool(a), Value::Bool(b)) => a == b,
            (EValue::Double(a), Value::Double(b)) => {
                (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-4 + 1e-5 * b.abs()
            }
            (EValue::String(a), Value::String(b)) => **a == **b,
            _ => {
                return Err(RuntimeError::InputKind {
                    method: self.plan.name.clone(),
                    index,
                    expected: current.kind().to_string(),
                    got: value.kind().to_string(),
                });
            }
        };
        if !same {
            return Err(RuntimeError::InputValue {
                method: self.plan.name.clone(),
                index,
                what: format!(
                    "scalar inputs are fixed at export: the program was traced with {current:?}, got {value:?}"
                ),
            });
        }
        self.input_set[index] = true;
        Ok(())
    }

    /// Sets every input in order.
    pub fn set_inputs(&mut self, values: &[Value]) -> Result<(), RuntimeError> {
        if values.len() != self.plan.inputs.len() {
            return Err(RuntimeError::InputCount {
                method: self.plan.name.clone(),
                expected: self.plan.inputs.len(),
                got: values.len(),
            });
        }
        values
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| self.set_input(i, v))
    }

    /// The value slot of output `index`.
    fn output_slot(&self, index: usize) -> Result<usize, RuntimeError> {
        self.plan
            .outputs
            .get(index)
            .copied()
            .ok_or_else(|| RuntimeError::OutputIndex {
                method: self.plan.name.clone(),
                index,
                count: self.plan.outputs.len(),
            })
    }

    /// A view of tensor output `index` (or an error for a non-tensor output).
    pub fn output_tensor(&mut self, index: usize) -> Result<TensorView<'_>, RuntimeError> {
        let slot = self.output_slot(index)?;
        let t = match self.values.get(slot) {
            Some(EValue::Tensor(t)) => *t,
            other => {
                return Err(RuntimeError::InputKind {
                    method: self.plan.name.clone(),
                    index,
                    expected: "Tensor output".to_string(),
                    got: other.map_or("?", |v| v.kind()).to_string(),
                });
            }
        };
        let bytes = match t.data() {
            Some(span) => self
                .storage
                .bytes(Span {
                    len: t.nbytes(),
                    ..span
                })
                .map_err(|source| RuntimeError::OutputAccess {
                    method: self.plan.name.clone(),
                    index,
                    source,
                })?,
            None if t.nbytes() == 0 => &[],
            None => {
                return Err(RuntimeError::OutputAccess {
                    method: self.plan.name.clone(),
                    index,
                    source: etch_memory::AccessError::UnknownRegion { region: u32::MAX },
                });
            }
        };
        Ok(TensorView { tensor: t, bytes })
    }

    /// Output `index`, copied out.
    pub fn output(&mut self, index: usize) -> Result<Value, RuntimeError> {
        let slot = self.output_slot(index)?;
        Ok(match &self.values[slot] {
            EValue::None => Value::None,
            EValue::Int(v) => Value::Int(*v),
            EValue::Double(v) => Value::Double(*v),
            EValue::Bool(v) => Value::Bool(*v),
            EValue::String(s) => Value::String(s.to_string()),
            EValue::Tensor(_) => Value::Tensor(self.output_tensor(index)?.to_host()),
            other => {
                return Err(RuntimeError::InputKind {
                    method: self.plan.name.clone(),
                    index,
                    expected: "a tensor or scalar output".to_string(),
                    got: other.kind().to_string(),
                });
            }
        })
    }

    /// Every output, copied out.
    pub fn outputs(&mut self) -> Result<Vec<Value>, RuntimeError> {
        (0..self.plan.outputs.len())
            .map(|i| self.output(i))
            .collect()
    }
}
