//! Run-time values (ExecuTorch's `EValue`) and the argument view kernels receive.

use std::sync::Arc;

use etch_base::ScalarType;

use crate::{KernelError, Tensor};

/// A run-time value slot of a method.
///
/// Lists hold **value indices** (IntList, TensorList, OptionalTensorList), resolved at
/// call time because earlier instructions overwrite the values they point to.
// Tensor metadata is stored inline (fixed-size, Copy) so values never touch the heap.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum EValue {
    None,
    Int(i64),
    Double(f64),
    Bool(bool),
    String(Arc<str>),
    Tensor(Tensor),
    IntList(Arc<[usize]>),
    DoubleList(Arc<[f64]>),
    BoolList(Arc<[bool]>),
    TensorList(Arc<[usize]>),
    OptionalTensorList(Arc<[Option<usize>]>),
}

impl EValue {
    /// The tag name, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            EValue::None => "None",
            EValue::Int(_) => "Int",
            EValue::Double(_) => "Double",
            EValue::Bool(_) => "Bool",
            EValue::String(_) => "String",
            EValue::Tensor(_) => "Tensor",
            EValue::IntList(_) => "IntList",
            EValue::DoubleList(_) => "DoubleList",
            EValue::BoolList(_) => "BoolList",
            EValue::TensorList(_) => "TensorList",
            EValue::OptionalTensorList(_) => "OptionalTensorList",
        }
    }

    /// The tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            EValue::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// A PyTorch `Scalar` argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Int(i64),
    Double(f64),
    Bool(bool),
}

impl Scalar {
    /// The value converted to the element type `E` with PyTorch's casts.
    #[inline]
    pub fn cast<E: crate::Element>(self) -> E {
        match self {
            Scalar::Int(v) => E::from_i64(v),
            Scalar::Double(v) => E::from_f64(v),
            Scalar::Bool(v) => E::from_bool(v),
        }
    }

    /// The value as f64.
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Int(v) => v as f64,
            Scalar::Double(v) => v,
            Scalar::Bool(b) => b as i64 as f64,
        }
    }

    /// The value as i64 (doubles truncate toward zero).
    pub fn to_i64(self) -> i64 {
        match self {
            Scalar::Int(v) => v,
            Scalar::Double(v) => v as i64,
            Scalar::Bool(b) => b as i64,
        }
    }

    /// The dtype PyTorch gives a wrapped number of this kind (i64, f64 or bool).
    pub fn natural_dtype(self) -> ScalarType {
        match self {
            Scalar::Int(_) => ScalarType::Long,
            Scalar::Double(_) => ScalarType::Double,
            Scalar::Bool(_) => ScalarType::Bool,
        }
    }
}

/// A kernel's arguments: the method's value table and this instruction's indices.
/// For `.out` ops the out tensor appears twice at the end (kwarg and return value).
///
/// Kernels read their arguments through a declared schema ([`crate::schema`]: named,
/// typed fields, errors naming the op and the argument); the typed accessors the
/// schema is built on are private to the crate. Delegates, whose arguments are their
/// graph's inputs and outputs rather than a schema, read them by position with
/// [`Args::len`], [`Args::tensor`] and [`Args::resize_tensor`].
pub struct Args<'a> {
    values: &'a mut [EValue],
    indices: &'a [usize],
}

/// An IntList argument, resolved lazily from the value table.
#[derive(Clone, Copy)]
pub struct IntList<'a> {
    values: &'a [EValue],
    items: &'a [usize],
}

impl IntList<'_> {
    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Item `j` as an integer.
    pub fn get(&self, j: usize) -> Result<i64, KernelError> {
        let idx = *self.items.get(j).ok_or(KernelError::BadValueIndex {
            index: j,
            value: usize::MAX,
        })?;
        match self.values.get(idx) {
            Some(EValue::Int(v)) => Ok(*v),
            Some(other) => Err(KernelError::ArgType {
                index: j,
                expected: "Int list item",
                found: other.kind(),
            }),
            None => Err(KernelError::BadValueIndex {
                index: j,
                value: idx,
            }),
        }
    }

    /// Copies the items into `buf` and returns the filled prefix; fails when `buf` is
    /// too short.
    pub fn read_into<'b>(&self, buf: &'b mut [i64]) -> Result<&'b [i64], KernelError> {
        if self.len() > buf.len() {
            return Err(KernelError::invalid(format!(
                "int list of {} items exceeds the limit of {}",
                self.len(),
                buf.len()
            )));
        }
        for (j, slot) in buf.iter_mut().enumerate().take(self.len()) {
            *slot = self.get(j)?;
        }
        Ok(&buf[..self.len()])
    }
}

/// A TensorList argument (or OptionalTensorList, with `None` items).
#[derive(Clone, Copy)]
pub struct TensorList<'a> {
    values: &'a [EValue],
    items: TensorListItems<'a>,
}

#[derive(Clone, Copy)]
enum TensorListItems<'a> {
    Plain(&'a [usize]),
    Optional(&'a [Option<usize>]),
}

impl TensorList<'_> {
    /// Number of items.
    pub fn len(&self) -> usize {
        match self.items {
            TensorListItems::Plain(i) => i.len(),
            TensorListItems::Optional(i) => i.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value index of item `j` (`None` for a missing optional item).
    pub fn value_index(&self, j: usize) -> Result<Option<usize>, KernelError> {
        let item = match self.items {
            TensorListItems::Plain(i) => i.get(j).map(|&v| Some(v)),
            TensorListItems::Optional(i) => i.get(j).copied(),
        };
        item.ok_or(KernelError::BadValueIndex {
            index: j,
            value: usize::MAX,
        })
    }

    /// Item `j`, or `None` for a missing optional item (or a None value).
    pub fn get_opt(&self, j: usize) -> Result<Option<Tensor>, KernelError> {
        let Some(idx) = self.value_index(j)? else {
            return Ok(None);
        };
        match self.values.get(idx) {
            Some(EValue::Tensor(t)) => Ok(Some(*t)),
            Some(EValue::None) => Ok(None),
            Some(other) => Err(KernelError::ArgType {
                index: j,
                expected: "Tensor list item",
                found: other.kind(),
            }),
            None => Err(KernelError::BadValueIndex {
                index: j,
                value: idx,
            }),
        }
    }

    /// Item `j`, which must be present.
    pub fn get(&self, j: usize) -> Result<Tensor, KernelError> {
        self.get_opt(j)?.ok_or(KernelError::ArgType {
            index: j,
            expected: "Tensor list item",
            found: "None",
        })
    }
}

fn type_error(index: usize, expected: &'static str, found: &EValue) -> KernelError {
    KernelError::ArgType {
        index,
        expected,
        found: found.kind(),
    }
}

impl<'a> Args<'a> {
    /// Arguments `indices` over `values`.
    pub fn new(values: &'a mut [EValue], indices: &'a [usize]) -> Self {
        Self { values, indices }
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    fn slot(&self, i: usize) -> Result<usize, KernelError> {
        let idx = *self.indices.get(i).ok_or(KernelError::ArgCount {
            expected: i + 1,
            got: self.len(),
        })?;
        if idx >= self.values.len() {
            return Err(KernelError::BadValueIndex {
                index: i,
                value: idx,
            });
        }
        Ok(idx)
    }

    /// Argument `i`.
    pub(crate) fn value(&self, i: usize) -> Result<&EValue, KernelError> {
        let idx = self.slot(i)?;
        Ok(&self.values[idx])
    }

    /// A tensor argument (copied metadata).
    pub fn tensor(&self, i: usize) -> Result<Tensor, KernelError> {
        match self.value(i)? {
            EValue::Tensor(t) => Ok(*t),
            other => Err(type_error(i, "Tensor", other)),
        }
    }

    /// An optional tensor argument (`None` value → `None`).
    pub(crate) fn opt_tensor(&self, i: usize) -> Result<Option<Tensor>, KernelError> {
        match self.value(i)? {
            EValue::Tensor(t) => Ok(Some(*t)),
            EValue::None => Ok(None),
            other => Err(type_error(i, "Tensor or None", other)),
        }
    }

    /// An int argument.
    pub(crate) fn int(&self, i: usize) -> Result<i64, KernelError> {
        match self.value(i)? {
            EValue::Int(v) => Ok(*v),
            other => Err(type_error(i, "Int", other)),
        }
    }

    /// An optional int argument.
    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>, KernelError> {
        match self.value(i)? {
            EValue::Int(v) => Ok(Some(*v)),
            EValue::None => Ok(None),
            other => Err(type_error(i, "Int or None", other)),
        }
    }

    /// A float argument (an Int is accepted and converted, as PyTorch does).
    pub(crate) fn double(&self, i: usize) -> Result<f64, KernelError> {
        match self.value(i)? {
            EValue::Double(v) => Ok(*v),
            EValue::Int(v) => Ok(*v as f64),
            other => Err(type_error(i, "Double", other)),
        }
    }

    /// An optional float argument.
    pub(crate) fn opt_double(&self, i: usize) -> Result<Option<f64>, KernelError> {
        match self.value(i)? {
            EValue::None => Ok(None),
            _ => self.double(i).map(Some),
        }
    }

    /// A bool argument.
    pub(crate) fn bool(&self, i: usize) -> Result<bool, KernelError> {
        match self.value(i)? {
            EValue::Bool(v) => Ok(*v),
            other => Err(type_error(i, "Bool", other)),
        }
    }

    /// A `Scalar` argument (Int, Double or Bool).
    pub(crate) fn scalar(&self, i: usize) -> Result<Scalar, KernelError> {
        match self.value(i)? {
            EValue::Int(v) => Ok(Scalar::Int(*v)),
            EValue::Double(v) => Ok(Scalar::Double(*v)),
            EValue::Bool(v) => Ok(Scalar::Bool(*v)),
            other => Err(type_error(i, "Scalar", other)),
        }
    }

    /// A `ScalarType` argument (an Int code).
    pub(crate) fn dtype(&self, i: usize) -> Result<ScalarType, KernelError> {
        let code = self.int(i)?;
        ScalarType::from_code(code)
            .ok_or_else(|| KernelError::invalid(format!("argument {i}: unknown dtype code {code}")))
    }

    /// An optional `ScalarType` argument.
    pub(crate) fn opt_dtype(&self, i: usize) -> Result<Option<ScalarType>, KernelError> {
        match self.value(i)? {
            EValue::None => Ok(None),
            _ => self.dtype(i).map(Some),
        }
    }

    /// An int list argument.
    pub(crate) fn int_list(&self, i: usize) -> Result<IntList<'_>, KernelError> {
        match self.value(i)? {
            EValue::IntList(items) => Ok(IntList {
                values: self.values,
                items,
            }),
            other => Err(type_error(i, "IntList", other)),
        }
    }

    /// An optional int list argument.
    pub(crate) fn opt_int_list(&self, i: usize) -> Result<Option<IntList<'_>>, KernelError> {
        match self.value(i)? {
            EValue::None => Ok(None),
            _ => self.int_list(i).map(Some),
        }
    }

    /// A float list argument.
    pub(crate) fn double_list(&self, i: usize) -> Result<&[f64], KernelError> {
        match self.value(i)? {
            EValue::DoubleList(v) => Ok(v),
            other => Err(type_error(i, "DoubleList", other)),
        }
    }

    /// A bool list argument.
    pub(crate) fn bool_list(&self, i: usize) -> Result<&[bool], KernelError> {
        match self.value(i)? {
            EValue::BoolList(v) => Ok(v),
            other => Err(type_error(i, "BoolList", other)),
        }
    }

    /// A tensor list (TensorList or OptionalTensorList) argument.
    pub(crate) fn tensor_list(&self, i: usize) -> Result<TensorList<'_>, KernelError> {
        match self.value(i)? {
            EValue::TensorList(items) => Ok(TensorList {
                values: self.values,
                items: TensorListItems::Plain(items),
            }),
            EValue::OptionalTensorList(items) => Ok(TensorList {
                values: self.values,
                items: TensorListItems::Optional(items),
            }),
            other => Err(type_error(i, "TensorList", other)),
        }
    }

    /// Replaces argument `i`'s tensor metadata (e.g. a view re-pointing its data).
    pub(crate) fn set_tensor(&mut self, i: usize, tensor: Tensor) -> Result<(), KernelError> {
        let idx = self.slot(i)?;
        match &mut self.values[idx] {
            EValue::Tensor(t) => {
                *t = tensor;
                Ok(())
            }
            other => Err(type_error(i, "Tensor", other)),
        }
    }

    /// Resizes argument `i` (an out tensor) and returns its new metadata.
    pub fn resize_tensor(&mut self, i: usize, sizes: &[usize]) -> Result<Tensor, KernelError> {
        let idx = self.slot(i)?;
        match &mut self.values[idx] {
            EValue::Tensor(t) => {
                t.resize(sizes)?;
                Ok(*t)
            }
            other => Err(type_error(i, "Tensor", other)),
        }
    }

    /// Resizes item `j` of tensor-list argument `i` (multi-output ops).
    pub(crate) fn resize_list_item(
        &mut self,
        i: usize,
        j: usize,
        sizes: &[usize],
    ) -> Result<Tensor, KernelError> {
        let idx = self
            .tensor_list(i)?
            .value_index(j)?
            .ok_or_else(|| KernelError::invalid(format!("argument {i}: list item {j} is None")))?;
        match self.values.get_mut(idx) {
            Some(EValue::Tensor(t)) => {
                t.resize(sizes)?;
                Ok(*t)
            }
            Some(other) => Err(type_error(i, "Tensor list item", other)),
            None => Err(KernelError::BadValueIndex {
                index: i,
                value: idx,
            }),
        }
    }

    /// Overwrites argument `i` with a new value (prim ops write their result this way).
    pub(crate) fn set_value(&mut self, i: usize, value: EValue) -> Result<(), KernelError> {
        let idx = self.slot(i)?;
        self.values[idx] = value;
        Ok(())
    }
}
