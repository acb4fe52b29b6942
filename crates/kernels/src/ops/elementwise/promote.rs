//! PyTorch's type promotion: `promote_types`, `result_type` with its three priority
//! groups (dimensioned tensors, zero-dim tensors, wrapped numbers) and `can_cast`.

use etch_base::ScalarType;

use super::dtype::{is_supported, unsupported};
use crate::{KernelError, Scalar, Tensor};

/// The dtype a Python float scalar takes (`torch.get_default_dtype()`).
pub const DEFAULT_FLOAT: ScalarType = ScalarType::Float;

fn is_wide_unsigned(t: ScalarType) -> bool {
    matches!(
        t,
        ScalarType::UInt16 | ScalarType::UInt32 | ScalarType::UInt64
    )
}

fn int_rank(t: ScalarType) -> u8 {
    match t {
        ScalarType::Char => 1,
        ScalarType::Short => 2,
        ScalarType::Int => 3,
        ScalarType::Long => 4,
        _ => 0,
    }
}

fn float_rank(t: ScalarType) -> u8 {
    match t {
        ScalarType::Half | ScalarType::BFloat16 => 1,
        ScalarType::Float => 2,
        ScalarType::Double => 3,
        _ => 0,
    }
}

/// `torch.promote_types(a, b)` for the dtypes kernels compute with.
pub fn promote_types(a: ScalarType, b: ScalarType) -> Result<ScalarType, KernelError> {
    for t in [a, b] {
        if !is_supported(t) {
            return Err(unsupported(t, "type promotion"));
        }
    }
    use ScalarType::*;
    if a == b {
        return Ok(a);
    }
    if a == Bool {
        return Ok(b);
    }
    if b == Bool {
        return Ok(a);
    }
    let (fa, fb) = (a.is_floating_point(), b.is_floating_point());
    if is_wide_unsigned(a) || is_wide_unsigned(b) {
        // PyTorch promotes the shell unsigned types only with floats.
        return match (fa, fb) {
            (true, _) => Ok(a),
            (_, true) => Ok(b),
            _ => Err(KernelError::invalid(format!(
                "promotion of {a} and {b} is not supported"
            ))),
        };
    }
    match (fa, fb) {
        (true, true) => {
            if float_rank(a) == 1 && float_rank(b) == 1 {
                Ok(Float) // f16 with bf16
            } else if float_rank(a) >= float_rank(b) {
                Ok(a)
            } else {
                Ok(b)
            }
        }
        (true, false) => Ok(a),
        (false, true) => Ok(b),
        (false, false) => {
            // Integers: u8 with a signed type needs i16 at least.
            let (ra, rb) = (int_rank(a), int_rank(b));
            Ok(match (a, b) {
                (Byte, _) => {
                    if rb <= 1 {
                        Short
                    } else {
                        b
                    }
                }
                (_, Byte) => {
                    if ra <= 1 {
                        Short
                    } else {
                        a
                    }
                }
                _ => {
                    if ra >= rb {
                        a
                    } else {
                        b
                    }
                }
            })
        }
    }
}

fn promote_opt(acc: Option<ScalarType>, t: ScalarType) -> Result<Option<ScalarType>, KernelError> {
    Ok(Some(match acc {
        None => t,
        Some(a) => promote_types(a, t)?,
    }))
}

/// Accumulates operands and computes `torch.result_type` over them.
///
/// ```ignore
/// i32 tensor + 2    -> i32   (a wrapped int does not widen the category)
/// i32 tensor + 2.5  -> f32   (a wrapped float raises the category to the default)
/// f32 [3] + f64 []  -> f32   (a zero-dim tensor of the same category does not widen)
/// ```
#[derive(Default, Clone, Copy)]
pub struct ResultType {
    dim: Option<ScalarType>,
    zero: Option<ScalarType>,
    wrapped: Option<ScalarType>,
}

impl ResultType {
    /// No operands yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tensor operand.
    pub fn tensor(mut self, t: &Tensor) -> Result<Self, KernelError> {
        if t.rank() == 0 {
            self.zero = promote_opt(self.zero, t.dtype())?;
        } else {
            self.dim = promote_opt(self.dim, t.dtype())?;
        }
        Ok(self)
    }

    /// Adds a Python-number operand.
    pub fn scalar(mut self, s: Scalar) -> Result<Self, KernelError> {
        let t = match s {
            Scalar::Double(_) => DEFAULT_FLOAT,
            other => other.natural_dtype(),
        };
        self.wrapped = promote_opt(self.wrapped, t)?;
        Ok(self)
    }

    /// Adds an elementwise operand of either kind.
    pub fn operand(self, o: &super::Operand) -> Result<Self, KernelError> {
        match o {
            super::Operand::Tensor(t) => self.tensor(t),
            super::Operand::Scalar(s) => self.scalar(*s),
        }
    }

    /// The result dtype.
    pub fn finish(self) -> Result<ScalarType, KernelError> {
        let lower = combine(self.zero, self.wrapped)?;
        combine(self.dim, lower)?.ok_or_else(|| KernelError::invalid("result_type of no operands"))
    }
}

/// PyTorch's `combine_categories`: the higher-priority group wins unless the lower
/// one is of a higher category (bool < integer < float).
fn combine(
    higher: Option<ScalarType>,
    lower: Option<ScalarType>,
) -> Result<Option<ScalarType>, KernelError> {
    Ok(match (higher, lower) {
        (None, l) => l,
        (h, None) => h,
        (Some(h), Some(l)) => {
            if h.is_floating_point() {
                Some(h)
            } else if h == ScalarType::Bool || l.is_floating_point() {
                Some(promote_types(h, l)?)
            } else {
                Some(h)
            }
        }
    })
}

/// `torch.can_cast(from, to)`: no float to integer or bool, no non-bool to bool.
pub fn can_cast(from: ScalarType, to: ScalarType) -> bool {
    if from.is_floating_point() && !to.is_floating_point() {
        return false;
    }
    !(from != ScalarType::Bool && to == ScalarType::Bool)
}

/// Fails unless a result of dtype `from` may be written to an out tensor of `to`.
pub fn check_can_cast(from: ScalarType, to: ScalarType) -> Result<(), KernelError> {
    if can_cast(from, to) {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "result type {from} can't be cast to the desired output type {to}"
        )))
    }
}

/// The dtype float-only ops compute in: integers and bool become the default float.
pub fn to_float(t: ScalarType) -> ScalarType {
    if t.is_floating_point() {
        t
    } else {
        DEFAULT_FLOAT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ScalarType::*;

    fn t(dtype: ScalarType, sizes: &[usize]) -> Tensor {
        Tensor::new(dtype, sizes, None).unwrap()
    }

    #[test]
    fn promote_table() {
        assert_eq!(promote_types(Byte, Char).unwrap(), Short);
        assert_eq!(promote_types(Byte, Int).unwrap(), Int);
        assert_eq!(promote_types(Char, Long).unwrap(), Long);
        assert_eq!(promote_types(Half, BFloat16).unwrap(), Float);
        assert_eq!(promote_types(Long, Half).unwrap(), Half);
        assert_eq!(promote_types(Bool, Char).unwrap(), Char);
        assert_eq!(promote_types(Double, Half).unwrap(), Double);
        assert_eq!(promote_types(UInt16, Float).unwrap(), Float);
        assert!(promote_types(UInt16, Int).is_err());
        assert!(promote_types(QInt8, Int).is_err());
    }

    #[test]
    fn result_type_groups() {
        let r = |rt: Result<ResultType, KernelError>| rt.unwrap().finish().unwrap();
        let with_scalar =
            |x: &Tensor, s: Scalar| r(ResultType::new().tensor(x).and_then(|rt| rt.scalar(s)));
        let with_tensor =
            |x: &Tensor, y: &Tensor| r(ResultType::new().tensor(x).and_then(|rt| rt.tensor(y)));
        let (i32v, f16v, boolv, f32v) =
            (t(Int, &[3]), t(Half, &[3]), t(Bool, &[3]), t(Float, &[3]));
        let (f64s, i64s) = (t(Double, &[]), t(Long, &[]));
        assert_eq!(with_scalar(&i32v, Scalar::Int(2)), Int);
        assert_eq!(with_scalar(&i32v, Scalar::Double(2.5)), Float);
        assert_eq!(with_scalar(&f16v, Scalar::Double(2.5)), Half);
        assert_eq!(with_scalar(&boolv, Scalar::Int(1)), Long);
        assert_eq!(with_tensor(&f32v, &f64s), Float);
        assert_eq!(with_tensor(&i32v, &f64s), Double);
        assert_eq!(with_tensor(&i32v, &i64s), Int);
        assert_eq!(with_tensor(&f64s, &i64s), Double);
    }

    #[test]
    fn casting_rules() {
        assert!(can_cast(Int, Float));
        assert!(can_cast(Bool, Long));
        assert!(!can_cast(Float, Int));
        assert!(!can_cast(Int, Bool));
        assert!(can_cast(Double, Half));
    }
}
