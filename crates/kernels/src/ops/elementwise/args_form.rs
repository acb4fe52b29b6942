//! [`args_form!`]: several op schemas read into one argument struct, so that the ops
//! sharing a kernel (`add.out` and `add.Scalar_out`, `quantize_per_tensor.out` and
//! `.tensor_out`) share one code path after unpacking.

/// Implements `From<Schema> for Form` for each listed schema: the fields named in the
/// head move across by name, the others are computed from the schema value `a`.
///
/// ```text
/// args_form! {
///     ArithOperands { input, out }:
///     TensorScalarArgs => |a| { other: Operand::Scalar(a.other), alpha: None };
/// }
/// ```
macro_rules! args_form {
    (
        $form:ident $moved:tt:
        $($schema:ident => |$a:ident| $computed:tt;)*
    ) => {
        $($crate::ops::elementwise::args_form::args_form!(@impl $form $moved $schema $a $computed);)*
    };
    (
        @impl $form:ident { $($moved:ident),* $(,)? } $schema:ident $a:ident
        { $($field:ident: $value:expr),* $(,)? }
    ) => {
        impl From<$schema> for $form {
            fn from($a: $schema) -> Self {
                $form {
                    $($moved: $a.$moved,)*
                    $($field: $value,)*
                }
            }
        }
    };
}
pub(crate) use args_form;
