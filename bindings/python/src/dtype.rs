//! etch dtypes as numpy dtypes, and tensors between numpy arrays and method memory.
//!
//! Every numpy dtype etch runs has a native element type here, except bfloat16: numpy has
//! none, so bf16 tensors travel as `uint16` arrays of the raw bits (what
//! `tools/fixtures/export.py` records too); an input also takes an array whose dtype is
//! named `bfloat16` (`ml_dtypes`), read as its bits.

use etch_runtime::Method;
use etch_runtime::format::ScalarType;
use half::f16;
use numpy::{
    PyArray1, PyArrayDescr, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;

use crate::errors::{input_error, runtime_error};

/// The numpy dtype name of an etch dtype (`None` for dtypes with no numpy twin).
pub fn numpy_name(dtype: ScalarType) -> Option<&'static str> {
    use ScalarType::*;
    Some(match dtype {
        Byte => "uint8",
        Char => "int8",
        Short => "int16",
        Int => "int32",
        Long => "int64",
        Half => "float16",
        Float => "float32",
        Double => "float64",
        Bool => "bool",
        BFloat16 => "bfloat16",
        UInt16 => "uint16",
        UInt32 => "uint32",
        UInt64 => "uint64",
        _ => return None,
    })
}

static NUMPY: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// The `numpy` module, imported once.
pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    NUMPY
        .get_or_try_init(py, || Ok(py.import("numpy")?.unbind()))
        .map(|m| m.bind(py))
}

/// The numpy dtype arrays of `dtype` travel as (`uint16` for bf16).
fn carrier_descr<'py>(py: Python<'py>, dtype: ScalarType) -> Option<Bound<'py, PyArrayDescr>> {
    use ScalarType::*;
    Some(match dtype {
        Byte => numpy::dtype::<u8>(py),
        Char => numpy::dtype::<i8>(py),
        Short => numpy::dtype::<i16>(py),
        Int => numpy::dtype::<i32>(py),
        Long => numpy::dtype::<i64>(py),
        Half => numpy::dtype::<f16>(py),
        Float => numpy::dtype::<f32>(py),
        Double => numpy::dtype::<f64>(py),
        Bool => numpy::dtype::<bool>(py),
        BFloat16 | UInt16 => numpy::dtype::<u16>(py),
        UInt32 => numpy::dtype::<u32>(py),
        UInt64 => numpy::dtype::<u64>(py),
        _ => return None,
    })
}

/// How an input is named in messages, as the runtime names it.
fn input_label(method: &Method, index: usize) -> String {
    format!("method {:?} input {index}", method.name())
}

/// Converts `value` to a C-contiguous numpy array of `dtype`'s carrier dtype: numpy arrays
/// and objects with a dtype of their own (torch tensors, numpy scalars) must already have
/// that dtype; plain Python data (lists, numbers) is converted to it when numpy can do so
/// without changing kind (ints to floats yes, floats to ints no).
fn as_input_array<'py>(
    value: &Bound<'py, PyAny>,
    dtype: ScalarType,
    label: &dyn Fn() -> String,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = value.py();
    let Some(want) = carrier_descr(py, dtype) else {
        return Err(input_error(format!(
            "{}: dtype {dtype} cannot be passed from Python",
            label()
        )));
    };
    let np = numpy(py)?;
    let array = match value.downcast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => {
            let has_dtype = value.hasattr("dtype")?;
            let converted = np.call_method1("asarray", (value,)).map_err(|e| {
                input_error(format!(
                    "{}: cannot convert {} to a numpy array: {e}",
                    label(),
                    type_name(value)
                ))
            })?;
            let converted = converted.downcast_into::<PyUntypedArray>()?;
            let got = converted.dtype();
            if !has_dtype
                && !got.is_equiv_to(&want)
                && np
                    .call_method1("can_cast", (&got, &want, "same_kind"))?
                    .is_truthy()?
            {
                converted
                    .call_method1("astype", (&want,))?
                    .downcast_into::<PyUntypedArray>()?
            } else {
                converted
            }
        }
    };
    let got = array.dtype();
    let array = if got.is_equiv_to(&want) {
        array
    } else if dtype == ScalarType::BFloat16 && is_named_bfloat16(&got)? {
        array
            .call_method1("view", (&want,))?
            .downcast_into::<PyUntypedArray>()?
    } else {
        let carrier = if dtype == ScalarType::BFloat16 {
            " (bfloat16 is passed as uint16 bits or an ml_dtypes.bfloat16 array)"
        } else {
            ""
        };
        return Err(input_error(format!(
            "{}: expected dtype {} ({dtype}){carrier}, got {}",
            label(),
            numpy_name(dtype).unwrap_or("?"),
            got.str()?
        )));
    };
    if array.is_c_contiguous() {
        Ok(array)
    } else {
        Ok(np
            .call_method1("ascontiguousarray", (&array,))?
            .downcast_into::<PyUntypedArray>()?)
    }
}

fn is_named_bfloat16(descr: &Bound<'_, PyArrayDescr>) -> PyResult<bool> {
    Ok(descr.itemsize() == 2 && descr.str()?.extract::<String>()? == "bfloat16")
}

/// `type(value).__name__`, for messages.
pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// Copies a contiguous array of element type `T` into tensor input `index`.
fn set_typed<T: numpy::Element + bytemuck::NoUninit>(
    method: &mut Method,
    index: usize,
    dtype: ScalarType,
    array: &Bound<'_, PyUntypedArray>,
) -> PyResult<()> {
    let typed = array.downcast::<PyArrayDyn<T>>()?.readonly();
    let elements = typed
        .as_slice()
        .map_err(|e| input_error(format!("{}: {e}", input_label(method, index))))?;
    method
        .set_input_tensor(index, dtype, typed.shape(), bytemuck::cast_slice(elements))
        .map_err(runtime_error)
}

/// Sets tensor input `index` of `method` from any object `numpy.asarray` converts: the
/// array's bytes are copied straight into the method's memory.
pub fn set_tensor_input(
    method: &mut Method,
    index: usize,
    dtype: ScalarType,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let label = || input_label(method, index);
    let array = as_input_array(value, dtype, &label)?;
    use ScalarType::*;
    match dtype {
        Byte => set_typed::<u8>(method, index, dtype, &array),
        Char => set_typed::<i8>(method, index, dtype, &array),
        Short => set_typed::<i16>(method, index, dtype, &array),
        Int => set_typed::<i32>(method, index, dtype, &array),
        Long => set_typed::<i64>(method, index, dtype, &array),
        Half => set_typed::<f16>(method, index, dtype, &array),
        Float => set_typed::<f32>(method, index, dtype, &array),
        Double => set_typed::<f64>(method, index, dtype, &array),
        Bool => set_typed::<bool>(method, index, dtype, &array),
        BFloat16 | UInt16 => set_typed::<u16>(method, index, dtype, &array),
        UInt32 => set_typed::<u32>(method, index, dtype, &array),
        UInt64 => set_typed::<u64>(method, index, dtype, &array),
        _ => Err(input_error(format!(
            "{}: dtype {dtype} cannot be passed from Python",
            label()
        ))),
    }
}

/// A numpy array of element type `T` holding a copy of `bytes`, shaped `sizes`.
fn typed_array<'py, T: numpy::Element + bytemuck::Pod>(
    py: Python<'py>,
    bytes: &[u8],
    sizes: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let flat = match bytemuck::try_cast_slice::<u8, T>(bytes) {
        Ok(elements) => PyArray1::from_slice(py, elements),
        // Misaligned or ragged bytes: copy element by element.
        Err(_) => PyArray1::from_vec(py, bytemuck::pod_collect_to_vec::<u8, T>(bytes)),
    };
    Ok(flat.reshape(sizes)?.into_any())
}

/// A numpy array holding a copy of a tensor's bytes (the only copy out of method memory).
pub fn tensor_to_numpy<'py>(
    py: Python<'py>,
    dtype: ScalarType,
    sizes: &[usize],
    bytes: &[u8],
) -> PyResult<Bound<'py, PyAny>> {
    use ScalarType::*;
    match dtype {
        Byte => typed_array::<u8>(py, bytes, sizes),
        Char => typed_array::<i8>(py, bytes, sizes),
        Short => typed_array::<i16>(py, bytes, sizes),
        Int => typed_array::<i32>(py, bytes, sizes),
        Long => typed_array::<i64>(py, bytes, sizes),
        Half => typed_array::<f16>(py, bytes, sizes),
        Float => typed_array::<f32>(py, bytes, sizes),
        Double => typed_array::<f64>(py, bytes, sizes),
        // numpy bools are bytes 0 or 1; any other byte reads as true.
        Bool => {
            let flat = match bytemuck::checked::try_cast_slice::<u8, bool>(bytes) {
                Ok(flags) => PyArray1::from_slice(py, flags),
                Err(_) => PyArray1::from_vec(py, bytes.iter().map(|&b| b != 0).collect()),
            };
            Ok(flat.reshape(sizes)?.into_any())
        }
        BFloat16 | UInt16 => typed_array::<u16>(py, bytes, sizes),
        UInt32 => typed_array::<u32>(py, bytes, sizes),
        UInt64 => typed_array::<u64>(py, bytes, sizes),
        other => Err(crate::errors::etch_error(format!(
            "an output of dtype {other} cannot be returned to Python"
        ))),
    }
}
