//! Cross-reference checks over a parsed [`Program`] (brief §2.1–2.3): its data tables
//! at load ([`validate_program`]), each execution plan when its method is loaded
//! ([`validate_plan`]).
//!
//! After these passes every index in the model is known to be in range, every value
//! list refers to values of the right kind, and every byte range a tensor can
//! resolve to lies inside its buffer, so the runtime can index without checks
//! failing at execution time.

use crate::error::{FormatError, Result};
use crate::program::model::*;

/// Validates the program-level tables, at load.
pub(crate) fn validate_program(program: &Program) -> Result<()> {
    validate_data_tables(program)
}

fn check_index(
    index: usize,
    len: usize,
    path: impl FnOnce() -> String,
    target: &str,
) -> Result<()> {
    if index < len {
        Ok(())
    } else {
        Err(FormatError::index(path(), index as i64, target, len))
    }
}

/// Constant, mutable and named data tables against the segments.
fn validate_data_tables(program: &Program) -> Result<()> {
    let n_segments = program.segments.len();
    if let Some(c) = &program.constant_segment
        && c.offsets.len() > 1
    {
        if !program.constant_buffers.is_empty() {
            return Err(FormatError::invalid(
                "constant_buffer",
                "both constant_buffer and constant_segment hold constants",
            ));
        }
        check_offsets(program, c, "constant_segment")?;
    }
    for (i, m) in program.mutable_data_segments.iter().enumerate() {
        check_offsets(program, m, &format!("mutable_data_segments[{i}]"))?;
    }
    for (i, n) in program.named_data.iter().enumerate() {
        check_index(
            n.segment_index,
            n_segments,
            || format!("named_data[{i}].segment_index"),
            "segments",
        )?;
    }
    Ok(())
}

/// The segment of a subsegment table exists and every offset lies inside it.
fn check_offsets(program: &Program, table: &SubsegmentOffsets, path: &str) -> Result<()> {
    let segment = program.segments.get(table.segment_index).ok_or_else(|| {
        FormatError::index(
            format!("{path}.segment_index"),
            table.segment_index as i64,
            "segments",
            program.segments.len(),
        )
    })?;
    for (i, offset) in table.offsets.iter().enumerate() {
        if *offset > segment.len as u64 {
            return Err(FormatError::out_of_bounds(
                format!("{path}.offsets[{i}]"),
                format!(
                    "offset {offset} exceeds segment {} of {} bytes",
                    table.segment_index, segment.len
                ),
            ));
        }
    }
    Ok(())
}

/// Validates one execution plan against itself and the program's tables, when its
/// method is loaded; `path` is the plan's, `execution_plan[i]`.
pub(crate) fn validate_plan(program: &Program, plan: &ExecutionPlan, path: &str) -> Result<()> {
    let n_values = plan.values.len();
    for (field, list) in [("inputs", &plan.inputs), ("outputs", &plan.outputs)] {
        for (i, v) in list.iter().enumerate() {
            check_index(*v, n_values, || format!("{path}.{field}[{i}]"), "values")?;
        }
    }
    for (v, value) in plan.values.iter().enumerate() {
        validate_value(program, plan, value, &format!("{path}.values[{v}]"))?;
    }
    for (c, chain) in plan.chains.iter().enumerate() {
        validate_chain(plan, chain, &format!("{path}.chains[{c}]"))?;
    }
    for (d, delegate) in plan.delegates.iter().enumerate() {
        let p = || format!("{path}.delegates[{d}].processed.index");
        match delegate.processed {
            DelegateDataReference::Inline(i) => check_index(
                i,
                program.backend_delegate_data.len(),
                p,
                "backend_delegate_data",
            )?,
            DelegateDataReference::Segment(i) => {
                check_index(i, program.segments.len(), p, "segments")?
            }
        }
    }
    Ok(())
}

/// The kind of the value at `index`, which has been range-checked.
fn expect_kind(
    plan: &ExecutionPlan,
    index: usize,
    path: impl Fn() -> String,
    allowed: &[&'static str],
    expected: &'static str,
) -> Result<()> {
    check_index(index, plan.values.len(), &path, "values")?;
    let found = plan.values.get(index).map_or("Null", Value::kind);
    if allowed.contains(&found) {
        Ok(())
    } else {
        Err(FormatError::WrongValueType {
            path: path(),
            index,
            expected,
            found,
        })
    }
}

fn validate_value(
    program: &Program,
    plan: &ExecutionPlan,
    value: &Value,
    path: &str,
) -> Result<()> {
    match value {
        Value::Tensor(t) => validate_tensor(program, plan, t, &format!("{path}.tensor")),
        // The items are value indices; the Int values they name may be overwritten
        // with new Ints at run time (SymInts), but are Ints in the file.
        Value::IntList(items) => {
            for (i, item) in items.iter().enumerate() {
                expect_kind(
                    plan,
                    *item,
                    || format!("{path}.int_list.items[{i}]"),
                    &["Int"],
                    "Int",
                )?;
            }
            Ok(())
        }
        Value::TensorList(items) => {
            for (i, item) in items.iter().enumerate() {
                expect_kind(
                    plan,
                    *item,
                    || format!("{path}.tensor_list.items[{i}]"),
                    &["Tensor"],
                    "Tensor",
                )?;
            }
            Ok(())
        }
        Value::OptionalTensorList(items) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(item) = item {
                    expect_kind(
                        plan,
                        *item,
                        || format!("{path}.optional_tensor_list.items[{i}]"),
                        &["Tensor", "Null"],
                        "Tensor or Null",
                    )?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn validate_tensor(
    program: &Program,
    plan: &ExecutionPlan,
    t: &TensorMeta,
    path: &str,
) -> Result<()> {
    let external = t
        .extra_tensor_info
        .as_ref()
        .is_some_and(|e| e.location == TensorDataLocation::External);
    if external
        && t.extra_tensor_info
            .as_ref()
            .and_then(|e| e.fully_qualified_name.as_ref())
            .is_none()
    {
        return Err(FormatError::MissingField {
            path: format!("{path}.extra_tensor_info.fully_qualified_name"),
        });
    }
    let nbytes = t.nbytes();
    if let Some(a) = &t.allocation_info {
        let sizes = &plan.non_const_buffer_sizes;
        if a.memory_id == 0 || a.memory_id >= sizes.len() {
            return Err(FormatError::index(
                format!("{path}.allocation_info.memory_id"),
                a.memory_id as i64,
                "non_const_buffer_sizes (memory id 0 is reserved)",
                sizes.len(),
            ));
        }
        let size = sizes.get(a.memory_id).copied().unwrap_or(0);
        if a.offset
            .checked_add(nbytes as u64)
            .is_none_or(|end| end > size)
        {
            return Err(FormatError::out_of_bounds(
                format!("{path}.allocation_info"),
                format!(
                    "offset {} + length {nbytes} exceeds planned buffer {} of {size} bytes",
                    a.offset, a.memory_id
                ),
            ));
        }
        if t.data_buffer_idx > 0 && !external {
            program
                .mutable_range(t.data_buffer_idx, nbytes)
                .map_err(|e| e.with_path(format!("{path}.data_buffer_idx")))?;
        }
    } else if t.data_buffer_idx > 0 && !external {
        program
            .constant_range_exact(t.data_buffer_idx, nbytes)
            .map_err(|e| e.with_path(format!("{path}.data_buffer_idx")))?;
    }
    Ok(())
}

fn validate_chain(plan: &ExecutionPlan, chain: &Chain, path: &str) -> Result<()> {
    let n_values = plan.values.len();
    for (field, list) in [("inputs", &chain.inputs), ("outputs", &chain.outputs)] {
        for (i, v) in list.iter().enumerate() {
            check_index(*v, n_values, || format!("{path}.{field}[{i}]"), "values")?;
        }
    }
    let n_instructions = chain.instructions.len();
    for (k, instruction) in chain.instructions.iter().enumerate() {
        let ip = format!("{path}.instructions[{k}]");
        let value =
            |v: usize, field: &str| check_index(v, n_values, || format!("{ip}.{field}"), "values");
        let args = |args: &[usize], call: &str| {
            args.iter().enumerate().try_for_each(|(i, v)| {
                check_index(*v, n_values, || format!("{ip}.{call}.args[{i}]"), "values")
            })
        };
        match instruction {
            Instruction::KernelCall { op_index, args: a } => {
                check_index(
                    *op_index,
                    plan.operators.len(),
                    || format!("{ip}.kernel_call.op_index"),
                    "operators",
                )?;
                args(a, "kernel_call")?;
            }
            Instruction::DelegateCall {
                delegate_index,
                args: a,
            } => {
                check_index(
                    *delegate_index,
                    plan.delegates.len(),
                    || format!("{ip}.delegate_call.delegate_index"),
                    "delegates",
                )?;
                args(a, "delegate_call")?;
            }
            Instruction::MoveCall { move_from, move_to } => {
                value(*move_from, "move_call.move_from")?;
                value(*move_to, "move_call.move_to")?;
            }
            Instruction::JumpFalseCall {
                cond_value_index,
                destination_instruction,
            } => {
                value(*cond_value_index, "jump_false_call.cond_value_index")?;
                check_index(
                    *destination_instruction,
                    n_instructions,
                    || format!("{ip}.jump_false_call.destination_instruction"),
                    "the chain's instructions",
                )?;
            }
            Instruction::FreeCall { value_index } => {
                value(*value_index, "free_call.value_index")?;
            }
        }
    }
    Ok(())
}
