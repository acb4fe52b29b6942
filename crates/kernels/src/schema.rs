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
//! Two layouts besides `.out` ops:
//!
//! * An op without an `out` argument whose kernel writes its result into the return
//!   slot (`executorch_prim::add.Scalar(Scalar a, Scalar b) -> Scalar`, `sym_size`)
//!   declares that slot as its last field, typed [`ResultSlot`], with `returns 0`.
//! * `returns N..=M` accepts between `N` and `M` return slots, for ops whose emitted
//!   programs differ (`split_copy.Tensor_out(...) -> ()` is emitted with or without a
//!   trailing copy of its out list). The extra slots are not read.
//!
//! Every kernel reads its arguments this way: the typed accessors of [`Args`] are
//! private to the crate, for this module's [`ArgValue`] implementations. Delegates,
//! whose arguments are their graph's inputs and outputs rather than a schema, use
//! [`Args::len`], [`Args::tensor`] and [`Args::resize_tensor`].

use std::ops::RangeInclusive;

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

    /// Replaces the out tensor's metadata (a view sharing another tensor's data, or
    /// the result of [`OutArg::resized`]).
    pub fn set(self, args: &mut Args<'_>, tensor: Tensor) -> Result<(), KernelError> {
        args.set_tensor(self.index, tensor)
    }

    /// The out tensor's metadata resized to `sizes` (within its bound), not yet
    /// stored: for a kernel that fills the out tensor while it still reads list
    /// arguments borrowed from `args` (resizing in place needs `args` mutably). The
    /// kernel stores it with [`OutArg::set`] once it no longer reads them.
    pub fn resized(&self, sizes: &[usize]) -> Result<Tensor, KernelError> {
        let mut tensor = self.tensor;
        tensor.resize(sizes)?;
        Ok(tensor)
    }
}

/// A `Tensor(a!)[] out` argument (the outputs of `split_copy`): its slot and item
/// count. Items are read and resized through `args` each time, since resizing one
/// needs `args` mutably.
#[derive(Clone, Copy, Debug)]
pub struct OutListArg {
    index: usize,
    len: usize,
}

impl OutListArg {
    /// Number of out tensors.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Out tensor `j` as it is now.
    pub fn item(&self, args: &Args<'_>, j: usize) -> Result<Tensor, KernelError> {
        args.tensor_list(self.index)?.get(j)
    }

    /// Resizes out tensor `j` to `sizes` (within its bound) and returns it.
    pub fn resize_item(
        &self,
        args: &mut Args<'_>,
        j: usize,
        sizes: &[usize],
    ) -> Result<Tensor, KernelError> {
        args.resize_list_item(self.index, j, sizes)
    }
}

/// The return slot of an op that has no `out` argument and writes its result value
/// there (`executorch_prim::add.Scalar(Scalar a, Scalar b) -> Scalar`): declared as the
/// last field, with `returns 0`. What the slot holds before the call is not read.
#[derive(Clone, Copy, Debug)]
pub struct ResultSlot {
    index: usize,
}

impl ResultSlot {
    /// Stores the op's result.
    pub fn set(self, args: &mut Args<'_>, value: EValue) -> Result<(), KernelError> {
        args.set_value(self.index, value)
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
    Option<bool> => |a, i| match a.value(i)? {
        EValue::None => Ok(None),
        _ => a.bool(i).map(Some),
    };
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
    Option<&'a [f64]> => |a, i| match a.value(i)? {
        EValue::None => Ok(None),
        _ => a.double_list(i).map(Some),
    };
    &'a [bool] => |a, i| a.bool_list(i);
    // `Tensor[]` and `Tensor?[]` alike (a TensorList or an OptionalTensorList value).
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
    OutListArg => |a, i| Ok(OutListArg { index: i, len: a.tensor_list(i)?.len() });
    ResultSlot => |a, i| a.value(i).map(|_| ResultSlot { index: i });
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
    /// How many slots after the arguments hold return values (one count for most
    /// ops: `N..=N`).
    const RETURNS: RangeInclusive<usize>;
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

/// Fails unless `args` holds the `arguments` slots and a count of return slots within
/// `returns`, naming `op` (and the smallest slot count accepted).
#[inline]
pub fn expect_slots(
    args: &Args<'_>,
    op: &'static str,
    arguments: usize,
    returns: &RangeInclusive<usize>,
) -> Result<(), KernelError> {
    let returned = args.len().checked_sub(arguments);
    if returned.is_some_and(|r| returns.contains(&r)) {
        Ok(())
    } else {
        Err(KernelError::OpArgCount {
            op,
            expected: arguments + returns.start(),
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
        } returns $min:literal $(..= $max:literal)?
    ) => {
        $(#[$meta])*
        #[allow(dead_code)]
        $vis struct $name<$lt> {
            $($(#[$fmeta])* pub $field: $ty),*
        }

        impl<$lt> $crate::schema::OpArgs<$lt> for $name<$lt> {
            $crate::schema::op_args!(@body $lt, $op, [$min $($max)?], $($field),*);
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident = $op:literal {
            $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)?
        } returns $min:literal $(..= $max:literal)?
    ) => {
        $(#[$meta])*
        #[allow(dead_code)]
        $vis struct $name {
            $($(#[$fmeta])* pub $field: $ty),*
        }

        impl<'args> $crate::schema::OpArgs<'args> for $name {
            $crate::schema::op_args!(@body 'args, $op, [$min $($max)?], $($field),*);
        }
    };
    (@returns $n:literal) => { $n..=$n };
    (@returns $min:literal $max:literal) => { $min..=$max };
    (@body $l:lifetime, $op:literal, [$min:literal $($max:literal)?], $($field:ident),*) => {
        const OP: &'static str = $op;
        const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];
        const RETURNS: ::core::ops::RangeInclusive<usize> =
            $crate::schema::op_args!(@returns $min $($max)?);

        #[allow(unused_assignments, unused_mut)]
        fn unpack(args: &$l $crate::Args<'_>) -> Result<Self, $crate::KernelError> {
            $crate::schema::expect_slots(args, $op, Self::NAMES.len(), &Self::RETURNS)?;
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
