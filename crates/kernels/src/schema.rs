//! Operator argument schemas: each op declares its arguments once, by name and type,
//! and the registry's kernel unpacks them into a typed struct before its body runs.
//!
//! ```ignore
//! op_args! {
//!     /// `clone.out(Tensor self, *, MemoryFormat? memory_format=None, Tensor(a!) out)`.
//!     struct CloneArgs = "aten::clone.out" {
//!         input: Tensor,
//!         memory_format: MemoryFormat,
//!         out: OutArg,
//!     } returns 1
//! }
//! fn clone(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
//!     let CloneArgs { input, out, .. } = CloneArgs::unpack(a)?;
//!     let out = out.resize(a, input.sizes())?;
//!     ...
//! }
//! ```
//!
//! The fields follow ExecuTorch's calling convention (every schema argument in order,
//! the `out` tensors among them) and `returns N` counts the return slots after them
//! (an `.out` op's return aliases its `out`). [`OpArgs::unpack`] checks the count and
//! every type; a mismatch is a [`KernelError::Argument`] naming the op and the
//! argument (or a [`KernelError::OpArgCount`] naming the op). The field types implement [`ArgValue`].
//!
//! The positional accessors of [`Args`] (`a.tensor(0)`, `a.expect_len(5)`) remain as
//! the legacy path for kernels not converted yet.

use crate::{Args, EValue, IntList, KernelError, Scalar, ScalarType, Tensor, TensorList};

/// A value an argument slot may hold, read with its schema type checked.
pub trait ArgValue<'a>: Sized {
    /// Reads slot `i` of `args`.
    fn read(args: &'a Args<'_>, i: usize) -> Result<Self, KernelError>;
}

/// An `out` tensor argument: its slot, to resize it, and its current metadata.
#[derive(Clone, Copy, Debug)]
pub struct OutArg {
    index: usize,
    tensor: Tensor,
}

impl OutArg {
    /// The out tensor as passed (before any resize).
    pub fn tensor(&self) -> Tensor {
        self.tensor
    }

    /// Resizes the out tensor to `sizes` (within its bound) and returns it.
    pub fn resize(self, args: &mut Args<'_>, sizes: &[usize]) -> Result<Tensor, KernelError> {
        args.resize_tensor(self.index, sizes)
    }

    /// Replaces the out tensor's metadata (a view sharing another tensor's data).
    pub fn set(self, args: &mut Args<'_>, tensor: Tensor) -> Result<(), KernelError> {
        args.set_tensor(self.index, tensor)
    }
}

/// A `MemoryFormat?` argument: checked (an int or None) and otherwise ignored, as
/// ExecuTorch's portable kernels do.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryFormat;

/// A return slot (after the arguments): not read.
#[derive(Clone, Copy, Debug, Default)]
pub struct Returned;

macro_rules! arg_value {
    ($($t:ty => |$a:ident, $i:ident| $body:expr;)*) => {$(
        impl<'a> ArgValue<'a> for $t {
            #[inline]
            fn read($a: &'a Args<'_>, $i: usize) -> Result<Self, KernelError> {
                $body
            }
        }
    )*};
}

arg_value! {
    Tensor => |a, i| a.tensor(i);
    Option<Tensor> => |a, i| a.opt_tensor(i);
    i64 => |a, i| a.int(i);
    Option<i64> => |a, i| a.opt_int(i);
    f64 => |a, i| a.double(i);
    Option<f64> => |a, i| a.opt_double(i);
    bool => |a, i| a.bool(i);
    Scalar => |a, i| a.scalar(i);
    Option<Scalar> => |a, i| match a.value(i)? {
        EValue::None => Ok(None),
        _ => a.scalar(i).map(Some),
    };
    ScalarType => |a, i| a.dtype(i);
    Option<ScalarType> => |a, i| a.opt_dtype(i);
    IntList<'a> => |a, i| a.int_list(i);
    Option<IntList<'a>> => |a, i| a.opt_int_list(i);
    &'a [f64] => |a, i| a.double_list(i);
    &'a [bool] => |a, i| a.bool_list(i);
    TensorList<'a> => |a, i| a.tensor_list(i);
    &'a str => |a, i| match a.value(i)? {
        EValue::String(v) => Ok(&**v),
        other => Err(KernelError::ArgType { index: i, expected: "str", found: other.kind() }),
    };
    Option<&'a str> => |a, i| match a.value(i)? {
        EValue::None => Ok(None),
        EValue::String(v) => Ok(Some(&**v)),
        other => Err(KernelError::ArgType { index: i, expected: "str or None", found: other.kind() }),
    };
    OutArg => |a, i| Ok(OutArg { index: i, tensor: a.tensor(i)? });
    MemoryFormat => |a, i| match a.value(i)? {
        EValue::None | EValue::Int(_) => Ok(MemoryFormat),
        other => Err(KernelError::ArgType { index: i, expected: "MemoryFormat or None", found: other.kind() }),
    };
    Returned => |a, i| a.value(i).map(|_| Returned);
}

/// A typed view of one op's arguments (implemented by [`op_args!`]).
pub trait OpArgs<'a>: Sized {
    /// The qualified op name (`aten::clone.out`).
    const OP: &'static str;
    /// The argument names, in slot order.
    const NAMES: &'static [&'static str];
    /// Slots after the arguments that hold return values.
    const RETURNS: usize;
    /// Checks the argument count and every type, and reads the arguments.
    fn unpack(args: &'a Args<'_>) -> Result<Self, KernelError>;
}

/// Reads slot `i` as `T`, naming `op` and `name` in the error.
#[inline]
pub fn read_arg<'a, T: ArgValue<'a>>(
    args: &'a Args<'_>,
    op: &'static str,
    name: &'static str,
    i: usize,
) -> Result<T, KernelError> {
    T::read(args, i).map_err(|e| KernelError::Argument {
        op,
        name,
        index: i,
        source: Box::new(e),
    })
}

/// Fails unless `args` holds exactly `n` slots, naming `op`.
#[inline]
pub fn expect_slots(args: &Args<'_>, op: &'static str, n: usize) -> Result<(), KernelError> {
    if args.len() == n {
        Ok(())
    } else {
        Err(KernelError::OpArgCount {
            op,
            expected: n,
            got: args.len(),
        })
    }
}

/// Declares an op's argument struct and its [`OpArgs`] implementation (see the
/// [module documentation](self)).
macro_rules! op_args {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident<$lt:lifetime> = $op:literal {
            $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)?
        } returns $ret:literal
    ) => {
        $(#[$meta])*
        #[allow(dead_code)]
        $vis struct $name<$lt> {
            $($(#[$fmeta])* pub $field: $ty),*
        }

        impl<$lt> $crate::schema::OpArgs<$lt> for $name<$lt> {
            $crate::schema::op_args!(@body $lt, $op, $ret, $($field),*);
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident = $op:literal {
            $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)?
        } returns $ret:literal
    ) => {
        $(#[$meta])*
        #[allow(dead_code)]
        $vis struct $name {
            $($(#[$fmeta])* pub $field: $ty),*
        }

        impl<'args> $crate::schema::OpArgs<'args> for $name {
            $crate::schema::op_args!(@body 'args, $op, $ret, $($field),*);
        }
    };
    (@body $l:lifetime, $op:literal, $ret:literal, $($field:ident),*) => {
        const OP: &'static str = $op;
        const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];
        const RETURNS: usize = $ret;

        #[allow(unused_assignments, unused_mut)]
        fn unpack(args: &$l $crate::Args<'_>) -> Result<Self, $crate::KernelError> {
            $crate::schema::expect_slots(args, $op, Self::NAMES.len() + $ret)?;
            let mut slot = 0usize;
            Ok(Self {
                $($field: {
                    let v = $crate::schema::read_arg(args, $op, stringify!($field), slot)?;
                    slot += 1;
                    v
                }),*
            })
        }
    };
}
pub(crate) use op_args;
