//! Running a bundled program's test cases (`.bpte`, ExecuTorch
//! `devtools/bundled_program`) and checking the outputs against the expected ones
//! with the rules of the official `verify_method_outputs`.
//!
//! Per output, as `bundled_program.cpp` compares them: dtypes and sizes must be equal;
//! `Float`, `Double` and `Half` elements are close when both are NaN, both are
//! infinite with the same sign, or `|expected - actual| <= atol + |rtol * actual|`
//! (a finite difference; exact equality when both tolerances are 0); every other dtype
//! (integers, `Bool`, `BFloat16`) must be equal bit for bit. The defaults are the
//! official ones ([`Tolerance::OFFICIAL`]). Unlike the official runtime, which only
//! accepts tensor expected outputs, `Int` and `Bool` outputs are compared exactly and
//! `Double` ones with the same closeness rule.
//!
//! The reported errors are those of the official `compute_method_output_error_stats`:
//! `|a - e|` and `|a - e| / max(|a|, |e|, 1e-8)`, the maximum over the case's outputs.
//!
//! ```no_run
//! use etch_runtime::bundled::{Tolerance, verify_bundled};
//! use etch_runtime::format::BundledProgramFile;
//! let file = BundledProgramFile::read("model.bpte")?;
//! let program = etch_runtime::Program::from_bytes(file.program_shared_bytes()?).build_program()?;
//! let reports = verify_bundled(&program, &file, Tolerance::OFFICIAL);
//! assert!(reports.iter().all(|r| r.passed()));
//! # Ok::<(), etch_runtime::RuntimeError>(())
//! ```

use etch_format::{BundledProgramFile, BundledTensor, BundledValue, ScalarType};

use crate::{HostTensor, Program, RuntimeError, Value};

/// Relative and absolute tolerances of the output comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Relative tolerance, times `|actual|`.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

impl Tolerance {
    /// The defaults of ExecuTorch's `verify_method_outputs`
    /// (`devtools/bundled_program/bundled_program.h`) and of the Python
    /// `verify_result_with_bundled_expected_output`: rtol 1e-5, atol 1e-8.
    pub const OFFICIAL: Tolerance = Tolerance {
        rtol: 1e-5,
        atol: 1e-8,
    };
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance::OFFICIAL
    }
}

/// The floor of the relative error's divisor (the official `eps`, `1e-8f`).
const REL_EPS: f64 = 1e-8_f32 as f64;

/// A bundled value as a host value: tensors in row-major logical order (the
/// bundled bytes are in the tensor's dim order).
pub fn host_value(file: &BundledProgramFile, value: &BundledValue) -> Value {
    match value {
        BundledValue::Tensor(t) => Value::Tensor(host_tensor(file, t)),
        BundledValue::Int(v) => Value::Int(*v),
        BundledValue::Bool(v) => Value::Bool(*v),
        BundledValue::Double(v) => Value::Double(*v),
    }
}

fn host_tensor(file: &BundledProgramFile, t: &BundledTensor) -> HostTensor {
    let bytes = file.tensor_data(t);
    let elem = t.scalar_type.element_size();
    let identity = t
        .dim_order
        .iter()
        .enumerate()
        .all(|(i, d)| usize::from(*d) == i);
    let data = if identity || t.numel() == 0 {
        bytes.to_vec()
    } else {
        to_row_major(bytes, &t.sizes, &t.dim_order, elem)
    };
    HostTensor {
        dtype: t.scalar_type,
        sizes: t.sizes.clone(),
        data,
    }
}

/// Copies elements laid out in `dim_order` (outermost first) into row-major order.
/// `dim_order` is a permutation of `0..sizes.len()` and `bytes` holds every element
/// (both checked by the format layer).
fn to_row_major(bytes: &[u8], sizes: &[usize], dim_order: &[u8], elem: usize) -> Vec<u8> {
    let rank = sizes.len();
    let mut strides = vec![0usize; rank];
    let mut stride = 1;
    for &d in dim_order.iter().rev() {
        let d = usize::from(d);
        strides[d] = stride;
        stride *= sizes[d];
    }
    let numel: usize = sizes.iter().product();
    let mut out = Vec::with_capacity(numel * elem);
    let mut index = vec![0usize; rank];
    for _ in 0..numel {
        let at = index
            .iter()
            .zip(&strides)
            .map(|(i, s)| i * s)
            .sum::<usize>()
            * elem;
        out.extend_from_slice(bytes.get(at..at + elem).unwrap_or(&[]));
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < sizes[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// How one output compared with its expected value.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputComparison {
    /// Within tolerance (see the module docs).
    pub passed: bool,
    /// Largest `|actual - expected|` (0 when the values cannot be compared).
    pub max_abs_error: f64,
    /// Largest `|actual - expected| / max(|actual|, |expected|, 1e-8)`.
    pub max_rel_error: f64,
    /// Why the values cannot be compared element by element (dtype, sizes, kind).
    pub mismatch: Option<String>,
}

impl OutputComparison {
    fn mismatch(why: String) -> Self {
        OutputComparison {
            passed: false,
            max_abs_error: 0.0,
            max_rel_error: 0.0,
            mismatch: Some(why),
        }
    }
}

/// The official closeness rule for one floating-point element.
fn elem_is_close(expected: f64, actual: f64, tol: Tolerance) -> bool {
    let both_nan = expected.is_nan() && actual.is_nan();
    // As upstream: two non-finite values with the same sign (`x > 0` is false for NaN).
    let same_infinity =
        !expected.is_finite() && !actual.is_finite() && (expected > 0.0) == (actual > 0.0);
    if both_nan || same_infinity {
        true
    } else if tol.rtol == 0.0 && tol.atol == 0.0 {
        expected == actual
    } else {
        let allowed = tol.atol + (tol.rtol * actual).abs();
        let error = (expected - actual).abs();
        error.is_finite() && error <= allowed
    }
}

/// Errors of one element pair, for the report: 0 for pairs the rule calls equal
/// (NaN and NaN), infinite for a non-finite difference.
fn elem_errors(expected: f64, actual: f64, close: bool) -> (f64, f64) {
    let abs = (actual - expected).abs();
    if !abs.is_finite() {
        return if close {
            (0.0, 0.0)
        } else {
            (f64::INFINITY, f64::INFINITY)
        };
    }
    let divisor = actual.abs().max(expected.abs()).max(REL_EPS);
    (abs, abs / divisor)
}

/// The elements of a tensor as f64 (for float dtypes and the integer ones whose
/// errors are reported), or `None` for dtypes compared only bitwise.
fn as_f64(t: &HostTensor) -> Option<Vec<f64>> {
    fn decode<const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
        data.chunks_exact(N)
            .filter_map(|c| c.try_into().ok())
            .map(f)
            .collect()
    }
    let d = &t.data;
    Some(match t.dtype {
        ScalarType::Float => decode(d, |b| f64::from(f32::from_le_bytes(b))),
        ScalarType::Double => decode(d, f64::from_le_bytes),
        ScalarType::Half => decode(d, |b| half::f16::from_le_bytes(b).to_f64()),
        ScalarType::BFloat16 => decode(d, |b| half::bf16::from_le_bytes(b).to_f64()),
        ScalarType::Byte => decode(d, |b: [u8; 1]| f64::from(b[0])),
        ScalarType::Char => decode(d, |b| f64::from(i8::from_le_bytes(b))),
        ScalarType::Short => decode(d, |b| f64::from(i16::from_le_bytes(b))),
        ScalarType::Int => decode(d, |b| f64::from(i32::from_le_bytes(b))),
        ScalarType::Long => decode(d, |b| i64::from_le_bytes(b) as f64),
        ScalarType::Bool => decode(d, |b: [u8; 1]| f64::from(b[0])),
        _ => return None,
    })
}

/// Compares one output with its expected value (see the module docs).
pub fn compare_output(expected: &Value, actual: &Value, tol: Tolerance) -> OutputComparison {
    match (expected, actual) {
        (Value::Tensor(e), Value::Tensor(a)) => compare_tensors(e, a, tol),
        (Value::Double(e), Value::Double(a)) => {
            let close = elem_is_close(*e, *a, tol);
            let (abs, rel) = elem_errors(*e, *a, close);
            OutputComparison {
                passed: close,
                max_abs_error: abs,
                max_rel_error: rel,
                mismatch: None,
            }
        }
        (Value::Int(e), Value::Int(a)) => scalar_exact(*e as f64, *a as f64, e == a),
        (Value::Bool(e), Value::Bool(a)) => {
            scalar_exact(f64::from(u8::from(*e)), f64::from(u8::from(*a)), e == a)
        }
        _ => OutputComparison::mismatch(format!(
            "expected {}, the method returned {}",
            expected.kind(),
            actual.kind()
        )),
    }
}

fn scalar_exact(e: f64, a: f64, equal: bool) -> OutputComparison {
    let (abs, rel) = elem_errors(e, a, equal);
    OutputComparison {
        passed: equal,
        max_abs_error: abs,
        max_rel_error: rel,
        mismatch: None,
    }
}

fn compare_tensors(e: &HostTensor, a: &HostTensor, tol: Tolerance) -> OutputComparison {
    if e.dtype != a.dtype {
        return OutputComparison::mismatch(format!(
            "dtype {} expected, the method returned {}",
            e.dtype, a.dtype
        ));
    }
    if e.sizes != a.sizes {
        return OutputComparison::mismatch(format!(
            "sizes {:?} expected, the method returned {:?}",
            e.sizes, a.sizes
        ));
    }
    let elementwise = matches!(
        e.dtype,
        ScalarType::Float | ScalarType::Double | ScalarType::Half
    );
    let bitwise_equal = e.data == a.data;
    let (Some(ev), Some(av)) = (as_f64(e), as_f64(a)) else {
        // Complex and quantized dtypes: equality alone, no error figures.
        return OutputComparison {
            passed: bitwise_equal,
            max_abs_error: 0.0,
            max_rel_error: 0.0,
            mismatch: None,
        };
    };
    let mut result = OutputComparison {
        passed: if elementwise { true } else { bitwise_equal },
        max_abs_error: 0.0,
        max_rel_error: 0.0,
        mismatch: None,
    };
    for (&x, &y) in ev.iter().zip(&av) {
        let close = if elementwise {
            elem_is_close(x, y, tol)
        } else {
            x == y
        };
        if elementwise && !close {
            result.passed = false;
        }
        let (abs, rel) = elem_errors(x, y, close);
        result.max_abs_error = result.max_abs_error.max(abs);
        result.max_rel_error = result.max_rel_error.max(rel);
    }
    result
}

/// What became of one test case.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseOutcome {
    /// Every output within tolerance.
    Passed,
    /// Ran, and some output is not within tolerance (or has another dtype, shape or
    /// count); the reason names the first such output.
    Failed(String),
    /// Could not run or could not be checked (no such method, inputs rejected, a
    /// kernel error, no expected outputs).
    Error(String),
}

/// The result of one bundled test case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseReport {
    /// The method tested.
    pub method: String,
    /// The case's index in its suite.
    pub index: usize,
    /// Passed, failed or could not run.
    pub outcome: CaseOutcome,
    /// Largest absolute error over the outputs.
    pub max_abs_error: f64,
    /// Largest relative error over the outputs.
    pub max_rel_error: f64,
    /// Each output's comparison, in order (empty when the case did not run).
    pub outputs: Vec<OutputComparison>,
}

impl CaseReport {
    /// True when the case passed.
    pub fn passed(&self) -> bool {
        self.outcome == CaseOutcome::Passed
    }
}

/// Runs test case `index` of `method` on a fresh session and compares its outputs.
pub fn verify_case(
    program: &Program,
    file: &BundledProgramFile,
    method: &str,
    index: usize,
    tol: Tolerance,
) -> CaseReport {
    let mut report = CaseReport {
        method: method.to_string(),
        index,
        outcome: CaseOutcome::Passed,
        max_abs_error: 0.0,
        max_rel_error: 0.0,
        outputs: Vec::new(),
    };
    let Some(case) = file.suite(method).and_then(|s| s.test_cases.get(index)) else {
        report.outcome = CaseOutcome::Error(format!("no test case {index} for method {method:?}"));
        return report;
    };
    if case.expected_outputs.is_empty() {
        report.outcome = CaseOutcome::Error("no expected outputs to verify".to_string());
        return report;
    }
    let inputs: Vec<Value> = case.inputs.iter().map(|v| host_value(file, v)).collect();
    let run = || -> Result<Vec<Value>, RuntimeError> {
        let mut session = program.method(method)?;
        session.set_inputs(&inputs)?;
        session.execute()?;
        session.outputs()
    };
    let outputs = match run() {
        Ok(outputs) => outputs,
        Err(e) => {
            report.outcome = CaseOutcome::Error(e.to_string());
            return report;
        }
    };
    for (i, (expected, actual)) in case.expected_outputs.iter().zip(&outputs).enumerate() {
        let c = compare_output(&host_value(file, expected), actual, tol);
        report.max_abs_error = report.max_abs_error.max(c.max_abs_error);
        report.max_rel_error = report.max_rel_error.max(c.max_rel_error);
        if !c.passed && report.passed() {
            let why = c.mismatch.clone().unwrap_or_else(|| {
                format!(
                    "not within rtol {} atol {} (max abs error {:.3e})",
                    tol.rtol, tol.atol, c.max_abs_error
                )
            });
            report.outcome = CaseOutcome::Failed(format!("output {i}: {why}"));
        }
        report.outputs.push(c);
    }
    if case.expected_outputs.len() != outputs.len() && report.passed() {
        report.outcome = CaseOutcome::Failed(format!(
            "{} expected outputs, the method returned {}",
            case.expected_outputs.len(),
            outputs.len()
        ));
    }
    report
}

/// Runs every test case of every method of `file`, in file order.
pub fn verify_bundled(
    program: &Program,
    file: &BundledProgramFile,
    tol: Tolerance,
) -> Vec<CaseReport> {
    file.method_test_suites()
        .iter()
        .flat_map(|suite| {
            (0..suite.test_cases.len())
                .map(move |index| verify_case(program, file, &suite.method_name, index, tol))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closeness_follows_the_official_rule() {
        let t = Tolerance::OFFICIAL;
        assert!(elem_is_close(1.0, 1.0 + 9e-6, t));
        assert!(!elem_is_close(1.0, 1.0 + 2e-5, t));
        assert!(elem_is_close(f64::NAN, f64::NAN, t));
        assert!(elem_is_close(f64::INFINITY, f64::INFINITY, t));
        assert!(!elem_is_close(f64::INFINITY, f64::NEG_INFINITY, t));
        assert!(!elem_is_close(1.0, f64::NAN, t));
        let exact = Tolerance {
            rtol: 0.0,
            atol: 0.0,
        };
        assert!(!elem_is_close(1.0, 1.0 + f64::EPSILON, exact));
    }

    #[test]
    fn tensors_compare_by_dtype_and_shape() {
        let a = HostTensor::from_slice(&[2], &[1.0f32, 2.0]);
        let b = HostTensor::from_slice(&[2], &[1.0f32, 2.5]);
        let c = compare_output(
            &Value::Tensor(a.clone()),
            &Value::Tensor(b),
            Tolerance::OFFICIAL,
        );
        assert!(!c.passed);
        assert_eq!(c.max_abs_error, 0.5);
        assert_eq!(c.max_rel_error, 0.2);
        let i = HostTensor::from_slice(&[2], &[1i32, 2]);
        let c = compare_output(
            &Value::Tensor(a),
            &Value::Tensor(i.clone()),
            Tolerance::OFFICIAL,
        );
        assert!(c.mismatch.is_some());
        let c = compare_output(
            &Value::Tensor(i.clone()),
            &Value::Tensor(i),
            Tolerance::OFFICIAL,
        );
        assert!(c.passed);
    }

    #[test]
    fn row_major_from_channels_last() {
        // sizes [1, 2, 2, 3] (N, C, H, W) stored in dim order [0, 2, 3, 1].
        let sizes = [1, 2, 2, 3];
        let logical: Vec<u8> = (0..12).collect();
        let mut stored = vec![0u8; 12];
        for c in 0..2 {
            for h in 0..2 {
                for w in 0..3 {
                    stored[(h * 3 + w) * 2 + c] = logical[c * 6 + h * 3 + w];
                }
            }
        }
        assert_eq!(to_row_major(&stored, &sizes, &[0, 2, 3, 1], 1), logical);
    }
}
