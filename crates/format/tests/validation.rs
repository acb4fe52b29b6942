//! Builder-made programs: the valid sample parses into the expected model, and
//! each validation rule rejects a broken variant with the right field path.

mod common;

use common::program::*;
use etch_format::*;

/// Loads the program and every method (each plan is validated when its method is
/// loaded), so that any rule broken anywhere is an error.
fn load(p: &ProgramB) -> Result<ProgramFile, FormatError> {
    let file =
        ProgramFile::from_bytes(etch_memory::SharedBytes::from_vec_aligned(p.to_bytes()).unwrap())?;
    file.load_all_plans()?;
    Ok(file)
}

/// Asserts that `p` fails to load at `path`, and returns the error.
#[track_caller]
fn expect_err(p: &ProgramB, path: &str) -> FormatError {
    match load(p) {
        Ok(_) => panic!("expected an error at {path}, but the program loaded"),
        Err(e) => {
            eprintln!("{e}");
            assert_eq!(e.path(), Some(path), "wrong path; error: {e}");
            e
        }
    }
}

#[track_caller]
fn modified(f: impl FnOnce(&mut ProgramB)) -> ProgramB {
    let mut p = sample_program();
    f(&mut p);
    p
}

#[test]
fn sample_program_parses() {
    let file = load(&sample_program()).unwrap();
    let program = file.program();
    assert_eq!(
        file.method_names().collect::<Vec<_>>(),
        ["forward", "get_n"]
    );
    let forward = file.plan("forward").unwrap();
    assert_eq!(forward.values.len(), 15);
    assert_eq!(forward.inputs, [0]);
    assert_eq!(forward.outputs, [3]);
    assert_eq!(forward.non_const_buffer_sizes, [0, 64]);
    assert_eq!(forward.operators[0].qualified_name(), "aten::add.out");
    assert_eq!(forward.operators[1].qualified_name(), "aten::mul");
    let Value::Tensor(x) = &forward.values[0] else {
        panic!()
    };
    assert_eq!(x.scalar_type, ScalarType::Float);
    assert_eq!(x.sizes, [2, 3]);
    assert_eq!(x.dim_order, [0, 1]);
    assert_eq!(x.nbytes(), 24);
    assert_eq!(
        x.allocation_info,
        Some(AllocationDetails {
            memory_id: 1,
            offset: 0
        })
    );
    assert_eq!(forward.values[2], Value::Int(1));
    assert_eq!(forward.values[4], Value::IntList(vec![2, 2]));
    assert_eq!(forward.values[5], Value::TensorList(vec![0, 1]));
    assert_eq!(
        forward.values[6],
        Value::OptionalTensorList(vec![Some(0), None, Some(7)])
    );
    assert_eq!(forward.values[7], Value::Null);
    assert_eq!(forward.values[8], Value::Bool(true));
    assert_eq!(forward.values[9], Value::Double(0.5));
    assert_eq!(forward.values[10], Value::String("hello".into()));
    assert_eq!(forward.values[11], Value::DoubleList(vec![1.5, 2.5]));
    assert_eq!(forward.values[12], Value::BoolList(vec![true, false]));
    assert_eq!(
        forward.chains[0].instructions,
        [
            Instruction::KernelCall {
                op_index: 0,
                args: vec![0, 1, 2, 3, 3]
            },
            Instruction::JumpFalseCall {
                cond_value_index: 8,
                destination_instruction: 3
            },
            Instruction::MoveCall {
                move_from: 3,
                move_to: 0
            },
            Instruction::DelegateCall {
                delegate_index: 0,
                args: vec![0, 3]
            },
            Instruction::FreeCall { value_index: 0 },
        ]
    );
    assert_eq!(forward.delegates[0].id, "TestBackend");
    assert_eq!(forward.delegates[0].compile_specs[0].key, "level");
    assert_eq!(forward.delegates[0].compile_specs[0].value, [1, 2]);

    // Constants, zero-copy ranges into the file.
    let w = file.check_constant(1, 24).unwrap();
    let floats: Vec<f32> = file
        .slice(w)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(file.constant_data(1).unwrap().len, 32); // to the segment end
    assert_eq!(
        file.slice(file.check_constant(2, 8).unwrap()).unwrap(),
        f32_bytes(&[0.5, 0.5])
    );
    assert!(file.check_constant(2, 9).is_err());
    assert!(file.constant_data(0).is_err()); // reserved
    assert!(file.constant_data(3).is_err());
    // Mutable initial state from mutable_data_segments[0].
    let m = file.mutable_data(1, 8).unwrap();
    assert_eq!(file.slice(m).unwrap(), f32_bytes(&[9.0, 8.0]));
    assert!(file.mutable_data(1, 9).is_err());
    // Delegate payload, named data, segments.
    let d = file.delegate_data(&forward.delegates[0].processed).unwrap();
    assert_eq!(file.slice(d).unwrap(), [0xAB; 5]);
    assert_eq!(
        file.slice(file.named_data("weights_key").unwrap()).unwrap(),
        [7u8; 3]
    );
    assert!(file.named_data("nope").is_none());
    assert_eq!(program.segments.len(), 3);
    assert!(file.segment(3).is_err());
    let header = file.header().unwrap();
    assert_eq!(header.header_length, 32);
    assert_eq!(
        header.segment_base_offset as usize,
        file.program().segments[0].offset
    );

    let meta = file.plan("get_n").unwrap();
    assert_eq!(meta.values, [Value::Int(7)]);
    assert!(file.plan("missing").is_none());
}

#[test]
fn program_without_extended_header_parses() {
    let p = modified(|p| {
        p.segments.clear();
        p.constant_segment = None;
        p.mutable_data_segments.clear();
        p.named_data.clear();
        p.extended_header = false;
        // Deprecated inline constants instead.
        p.constant_buffers = vec![vec![], f32_bytes(&[1.0; 6]), f32_bytes(&[2.0; 2])];
        tensor(p, 13).data_buffer_idx = 0;
    });
    let file = load(&p).unwrap();
    assert!(file.header().is_none());
    assert!(!file.program().uses_constant_segment());
    let w = file.check_constant(1, 24).unwrap();
    assert_eq!(file.slice(w).unwrap(), f32_bytes(&[1.0; 6]));
}

#[test]
fn header_rules() {
    let bytes = sample_program().to_bytes();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = bytes.clone();
        f(&mut b);
        ProgramFile::from_bytes(etch_memory::SharedBytes::from_vec_aligned(b).unwrap()).unwrap_err()
    };
    let e = with(&|b| b[4..8].copy_from_slice(b"ET11"));
    assert!(matches!(e, FormatError::IncompatibleVersion { .. }), "{e}");
    let e = with(&|b| b[4..8].copy_from_slice(b"XYZW"));
    assert!(matches!(e, FormatError::BadIdentifier { .. }), "{e}");
    let e = with(&|b| b.truncate(6));
    assert_eq!(e.path(), Some("header.identifier"));
    let e = with(&|b| b[16..24].copy_from_slice(&u64::MAX.to_le_bytes()));
    assert_eq!(e.path(), Some("header.program_size"));
    let e = with(&|b| b[32..40].copy_from_slice(&(1u64 << 40).to_le_bytes()));
    assert_eq!(e.path(), Some("header.segment_data_size"));
    let e = with(&|b| b[12..16].copy_from_slice(&8u32.to_le_bytes()));
    assert_eq!(e.path(), Some("header.header_length"));
    // File shorter than its segments.
    let e = with(&|b| {
        let n = b.len();
        b.truncate(n - 1);
    });
    assert_eq!(e.path(), Some("header.segment_data_size"));
    let e = with(&|b| b[0..4].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes()));
    assert!(matches!(e, FormatError::OutOfBounds { .. }), "{e}");
    assert_eq!(e.path(), Some("<root>"));
}

#[test]
fn program_table_rules() {
    expect_err(
        &modified(|p| p.segment_table = Some(vec![(0, 32), (32, 8), (48, 1000)])),
        "segments[2]",
    );
    expect_err(
        &modified(|p| p.named_data[0].1 = 3),
        "named_data[0].segment_index",
    );
    expect_err(
        &modified(|p| p.constant_segment = Some((5, vec![0, 0, 24]))),
        "constant_segment.segment_index",
    );
    expect_err(
        &modified(|p| p.constant_segment = Some((0, vec![0, 0, 33]))),
        "constant_segment.offsets[2]",
    );
    expect_err(
        &modified(|p| p.constant_buffers = vec![vec![], vec![1]]),
        "constant_buffer",
    );
    expect_err(
        &modified(|p| p.mutable_data_segments = vec![(9, vec![0])]),
        "mutable_data_segments[0].segment_index",
    );
    expect_err(
        &modified(|p| p.mutable_data_segments = vec![(1, vec![0, 9])]),
        "mutable_data_segments[0].offsets[1]",
    );
}

#[test]
fn plan_rules() {
    expect_err(
        &modified(|p| forward(p).name = None),
        "execution_plan[0].name",
    );
    let e = expect_err(
        &modified(|p| forward(p).name = Some(vec![0xff, 0xfe])),
        "execution_plan[0].name",
    );
    assert!(matches!(e, FormatError::InvalidUtf8 { .. }));
    expect_err(
        &modified(|p| forward(p).operators[1].0 = vec![0xc3]),
        "execution_plan[0].operators[1].name",
    );
    let e = expect_err(
        &modified(|p| forward(p).inputs = vec![15]),
        "execution_plan[0].inputs[0]",
    );
    assert!(
        matches!(
            e,
            FormatError::IndexOutOfRange {
                index: 15,
                len: 15,
                ..
            }
        ),
        "{e}"
    );
    expect_err(
        &modified(|p| forward(p).outputs = vec![3, -2]),
        "execution_plan[0].outputs[1]",
    );
    expect_err(
        &modified(|p| forward(p).non_const_buffer_sizes = vec![0, -64]),
        "execution_plan[0].non_const_buffer_sizes[1]",
    );
    let e = expect_err(
        &modified(|p| forward(p).non_const_buffer_sizes = vec![0, 1 << 50]),
        "execution_plan[0].non_const_buffer_sizes[1]",
    );
    assert!(matches!(e, FormatError::LimitExceeded { .. }));
    expect_err(
        &modified(|p| forward(p).chains[0].inputs = vec![99]),
        "execution_plan[0].chains[0].inputs[0]",
    );
    expect_err(
        &modified(|p| forward(p).chains[0].outputs = vec![0, 99]),
        "execution_plan[0].chains[0].outputs[1]",
    );
}

#[test]
fn value_rules() {
    let e = expect_err(
        &modified(|p| forward(p).values[2] = ValueB::Raw(12, None)),
        "execution_plan[0].values[2].val_type",
    );
    assert!(matches!(e, FormatError::UnknownTag { tag: 12, .. }));
    expect_err(
        &modified(|p| forward(p).values[2] = ValueB::Raw(0, None)),
        "execution_plan[0].values[2].val_type",
    );
    let e = expect_err(
        &modified(|p| forward(p).values[2] = ValueB::Raw(2, None)),
        "execution_plan[0].values[2].int",
    );
    assert!(matches!(e, FormatError::MissingField { .. }));
    expect_err(
        &modified(|p| forward(p).values[0] = ValueB::Raw(5, None)),
        "execution_plan[0].values[0].tensor",
    );
    // Null needs no table.
    load(&modified(|p| forward(p).values[7] = ValueB::Raw(1, None))).unwrap();

    // IntList items are value indices of Int values.
    let e = expect_err(
        &modified(|p| forward(p).values[4] = ValueB::IntList(vec![2, 3])),
        "execution_plan[0].values[4].int_list.items[1]",
    );
    assert!(
        matches!(
            e,
            FormatError::WrongValueType {
                index: 3,
                expected: "Int",
                found: "Tensor",
                ..
            }
        ),
        "{e}"
    );
    let e = expect_err(
        &modified(|p| forward(p).values[4] = ValueB::IntList(vec![15])),
        "execution_plan[0].values[4].int_list.items[0]",
    );
    assert!(matches!(e, FormatError::IndexOutOfRange { .. }));
    expect_err(
        &modified(|p| forward(p).values[4] = ValueB::IntList(vec![-1])),
        "execution_plan[0].values[4].int_list.items[0]",
    );
    // TensorList items are Tensors.
    let e = expect_err(
        &modified(|p| forward(p).values[5] = ValueB::TensorList(vec![0, 7])),
        "execution_plan[0].values[5].tensor_list.items[1]",
    );
    assert!(matches!(
        e,
        FormatError::WrongValueType { found: "Null", .. }
    ));
    expect_err(
        &modified(|p| forward(p).values[5] = ValueB::TensorList(vec![100])),
        "execution_plan[0].values[5].tensor_list.items[0]",
    );
    // OptionalTensorList items are Tensors, Nulls or -1.
    expect_err(
        &modified(|p| forward(p).values[6] = ValueB::OptionalTensorList(vec![2])),
        "execution_plan[0].values[6].optional_tensor_list.items[0]",
    );
    expect_err(
        &modified(|p| forward(p).values[6] = ValueB::OptionalTensorList(vec![-1, -2])),
        "execution_plan[0].values[6].optional_tensor_list.items[1]",
    );
}

#[test]
fn tensor_shape_rules() {
    let t = "execution_plan[0].values[1].tensor";
    let e = expect_err(
        &modified(|p| tensor(p, 1).scalar_type = 8),
        &format!("{t}.scalar_type"),
    );
    assert!(matches!(e, FormatError::UnknownTag { tag: 8, .. }));
    let e = expect_err(
        &modified(|p| tensor(p, 1).storage_offset = 4),
        &format!("{t}.storage_offset"),
    );
    assert!(matches!(e, FormatError::Unsupported { .. }));
    expect_err(
        &modified(|p| tensor(p, 1).sizes = None),
        &format!("{t}.sizes"),
    );
    expect_err(
        &modified(|p| tensor(p, 1).dim_order = None),
        &format!("{t}.dim_order"),
    );
    expect_err(
        &modified(|p| tensor(p, 1).sizes = Some(vec![2, -3])),
        &format!("{t}.sizes[1]"),
    );
    expect_err(
        &modified(|p| tensor(p, 1).dim_order = Some(vec![0])),
        &format!("{t}.dim_order"),
    );
    expect_err(
        &modified(|p| tensor(p, 1).dim_order = Some(vec![0, 0])),
        &format!("{t}.dim_order[1]"),
    );
    expect_err(
        &modified(|p| tensor(p, 1).dim_order = Some(vec![0, 2])),
        &format!("{t}.dim_order[1]"),
    );
    let e = expect_err(
        &modified(|p| {
            let x = tensor(p, 1);
            x.sizes = Some(vec![1; 17]);
            x.dim_order = Some((0..17).collect());
        }),
        &format!("{t}.sizes"),
    );
    assert!(
        matches!(
            e,
            FormatError::LimitExceeded {
                count: 17,
                limit: 16,
                ..
            }
        ),
        "{e}"
    );
    let e = expect_err(
        &modified(|p| {
            let x = tensor(p, 1);
            x.sizes = Some(vec![i32::MAX, i32::MAX, 0]);
            x.dim_order = Some(vec![0, 1, 2]);
        }),
        &format!("{t}.sizes[1]"),
    );
    assert!(matches!(e, FormatError::LimitExceeded { .. }));
    expect_err(
        &modified(|p| tensor(p, 1).shape_dynamism = 3),
        &format!("{t}.shape_dynamism"),
    );
    // A non-contiguous dim order is fine.
    load(&modified(|p| tensor(p, 1).dim_order = Some(vec![1, 0]))).unwrap();
    // Rank 0 is fine.
    load(&modified(|p| {
        let x = tensor(p, 0);
        x.sizes = Some(vec![]);
        x.dim_order = Some(vec![]);
    }))
    .unwrap();
}

#[test]
fn tensor_data_rules() {
    let t = "execution_plan[0].values";
    // Planned memory: 1-based memory ids into non_const_buffer_sizes.
    let e = expect_err(
        &modified(|p| tensor(p, 0).allocation.as_mut().unwrap().memory_id = 0),
        &format!("{t}[0].tensor.allocation_info.memory_id"),
    );
    assert!(
        matches!(
            e,
            FormatError::IndexOutOfRange {
                index: 0,
                len: 2,
                ..
            }
        ),
        "{e}"
    );
    expect_err(
        &modified(|p| tensor(p, 0).allocation.as_mut().unwrap().memory_id = 2),
        &format!("{t}[0].tensor.allocation_info.memory_id"),
    );
    let e = expect_err(
        &modified(|p| tensor(p, 3).allocation.as_mut().unwrap().low = 41),
        &format!("{t}[3].tensor.allocation_info"),
    );
    assert!(matches!(e, FormatError::OutOfBounds { .. }));
    assert!(
        e.to_string()
            .contains("offset 41 + length 24 exceeds planned buffer 1 of 64 bytes"),
        "{e}"
    );
    expect_err(
        &modified(|p| tensor(p, 3).allocation.as_mut().unwrap().high = 1),
        &format!("{t}[3].tensor.allocation_info"),
    );
    load(&modified(|p| {
        tensor(p, 3).allocation.as_mut().unwrap().low = 40
    }))
    .unwrap();
    // Constants: index within the table, bytes within the segment.
    let e = expect_err(
        &modified(|p| tensor(p, 1).data_buffer_idx = 3),
        &format!("{t}[1].tensor.data_buffer_idx"),
    );
    assert!(
        matches!(
            e,
            FormatError::IndexOutOfRange {
                index: 3,
                len: 3,
                ..
            }
        ),
        "{e}"
    );
    let e = expect_err(
        &modified(|p| tensor(p, 14).sizes = Some(vec![3])),
        &format!("{t}[14].tensor.data_buffer_idx"),
    );
    assert!(matches!(e, FormatError::OutOfBounds { .. }), "{e}");
    // Mutable initial state must exist in mutable_data_segments[0].
    let e = expect_err(
        &modified(|p| p.mutable_data_segments.clear()),
        &format!("{t}[13].tensor.data_buffer_idx"),
    );
    assert!(matches!(e, FormatError::NotFound { .. }), "{e}");
    expect_err(
        &modified(|p| tensor(p, 13).data_buffer_idx = 2),
        &format!("{t}[13].tensor.data_buffer_idx"),
    );
    expect_err(
        &modified(|p| tensor(p, 13).sizes = Some(vec![3])),
        &format!("{t}[13].tensor.data_buffer_idx"),
    );
    // External data needs a name.
    expect_err(
        &modified(|p| {
            tensor(p, 1).extra = Some(Extra {
                location: 1,
                ..Extra::default()
            })
        }),
        &format!("{t}[1].tensor.extra_tensor_info.fully_qualified_name"),
    );
    let file = load(&modified(|p| {
        tensor(p, 1).extra = Some(Extra {
            location: 1,
            fqn: Some("w".into()),
            ..Extra::default()
        });
        tensor(p, 1).data_buffer_idx = 99; // ignored for external data
    }))
    .unwrap();
    let Value::Tensor(w) = &file.plan("forward").unwrap().values[1] else {
        panic!()
    };
    assert_eq!(
        w.extra_tensor_info.as_ref().unwrap().location,
        TensorDataLocation::External
    );
    expect_err(
        &modified(|p| {
            tensor(p, 1).extra = Some(Extra {
                location: 2,
                ..Extra::default()
            })
        }),
        &format!("{t}[1].tensor.extra_tensor_info.location"),
    );
}

#[test]
fn instruction_rules() {
    let i = "execution_plan[0].chains[0].instructions";
    let set =
        |k: usize, instr: InstrB| modified(move |p| forward(p).chains[0].instructions[k] = instr);
    let e = expect_err(
        &set(0, InstrB::Kernel(2, vec![0])),
        &format!("{i}[0].kernel_call.op_index"),
    );
    assert!(
        matches!(
            e,
            FormatError::IndexOutOfRange {
                index: 2,
                len: 2,
                ..
            }
        ),
        "{e}"
    );
    expect_err(
        &set(0, InstrB::Kernel(-1, vec![0])),
        &format!("{i}[0].kernel_call.op_index"),
    );
    expect_err(
        &set(0, InstrB::Kernel(0, vec![0, 1, 15])),
        &format!("{i}[0].kernel_call.args[2]"),
    );
    expect_err(
        &set(3, InstrB::Delegate(1, vec![])),
        &format!("{i}[3].delegate_call.delegate_index"),
    );
    expect_err(
        &set(3, InstrB::Delegate(0, vec![20])),
        &format!("{i}[3].delegate_call.args[0]"),
    );
    expect_err(
        &set(2, InstrB::Move(15, 0)),
        &format!("{i}[2].move_call.move_from"),
    );
    expect_err(
        &set(2, InstrB::Move(0, 15)),
        &format!("{i}[2].move_call.move_to"),
    );
    expect_err(
        &set(1, InstrB::JumpFalse(8, 5)),
        &format!("{i}[1].jump_false_call.destination_instruction"),
    );
    expect_err(
        &set(1, InstrB::JumpFalse(15, 0)),
        &format!("{i}[1].jump_false_call.cond_value_index"),
    );
    expect_err(
        &set(4, InstrB::Free(15)),
        &format!("{i}[4].free_call.value_index"),
    );
    let e = expect_err(
        &set(4, InstrB::Raw(6, None)),
        &format!("{i}[4].instr_args_type"),
    );
    assert!(matches!(e, FormatError::UnknownTag { tag: 6, .. }));
    expect_err(
        &set(4, InstrB::Raw(0, None)),
        &format!("{i}[4].instr_args_type"),
    );
    expect_err(&set(4, InstrB::Raw(5, None)), &format!("{i}[4].free_call"));
}

#[test]
fn delegate_rules() {
    let d = "execution_plan[0].delegates[0].processed";
    expect_err(
        &modified(|p| forward(p).delegates[0].index = 1),
        &format!("{d}.index"),
    );
    expect_err(
        &modified(|p| forward(p).delegates[0].location = 2),
        &format!("{d}.location"),
    );
    // Segment 2 exists, segment 3 does not.
    let file = load(&modified(|p| {
        forward(p).delegates[0].location = 1;
        forward(p).delegates[0].index = 2;
    }))
    .unwrap();
    let plan = file.plan("forward").unwrap();
    assert_eq!(
        plan.delegates[0].processed,
        DelegateDataReference::Segment(2)
    );
    assert_eq!(
        file.slice(file.delegate_data(&plan.delegates[0].processed).unwrap())
            .unwrap(),
        [7u8; 3]
    );
    expect_err(
        &modified(|p| {
            forward(p).delegates[0].location = 1;
            forward(p).delegates[0].index = 3;
        }),
        &format!("{d}.index"),
    );
}

#[test]
fn limits_are_enforced() {
    // Too many plans.
    let mut p = sample_program();
    let meta = p.plans[1].clone();
    p.plans.resize(limits::MAX_PLANS + 1, meta);
    let e = expect_err(&p, "execution_plan");
    assert!(matches!(e, FormatError::LimitExceeded { .. }), "{e}");
}

#[test]
fn methods_load_independently() {
    // `forward` has a tensor of an unknown dtype; `get_n` is fine.
    let p = modified(|p| tensor(p, 1).scalar_type = 9);
    let file =
        ProgramFile::from_bytes(etch_memory::SharedBytes::from_vec_aligned(p.to_bytes()).unwrap())
            .expect("the program-level tables are valid");
    assert_eq!(
        file.method_names().collect::<Vec<_>>(),
        ["forward", "get_n"]
    );
    assert!(file.has_method("forward") && !file.has_method("missing"));
    assert!(file.has_delegates(), "read from the plan headers");
    assert_eq!(file.load_plan("get_n").unwrap().values, [Value::Int(7)]);
    for _ in 0..2 {
        let e = file.load_plan("forward").unwrap_err();
        assert!(matches!(e, FormatError::UnknownTag { tag: 9, .. }), "{e}");
        assert_eq!(
            e.path(),
            Some("execution_plan[0].values[1].tensor.scalar_type")
        );
    }
    assert!(file.plan("forward").is_none());
    let e = file.load_plan("missing").unwrap_err();
    assert!(matches!(e, FormatError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("\"missing\""), "{e}");
    assert_eq!(
        file.load_all_plans().unwrap_err().path(),
        Some("execution_plan[0].values[1].tensor.scalar_type")
    );
    let plans: Vec<(&str, bool)> = file.plans().map(|(n, p)| (n, p.is_ok())).collect();
    assert_eq!(plans, [("forward", false), ("get_n", true)]);
}

#[test]
fn a_plan_is_parsed_once() {
    let file = load(&sample_program()).unwrap();
    let a: *const ExecutionPlan = file.load_plan("forward").unwrap();
    let b: *const ExecutionPlan = file.load_plan("forward").unwrap();
    assert_eq!(a, b);
    // A clone keeps the loaded plans.
    assert_eq!(file.clone().load_plan("forward").unwrap().values.len(), 15);
}

#[test]
fn a_method_without_a_name_fails_the_program() {
    // The name is what a method is asked for by: it is read at load.
    let p = modified(|p| p.plans[1].name = None);
    let e =
        ProgramFile::from_bytes(etch_memory::SharedBytes::from_vec_aligned(p.to_bytes()).unwrap())
            .unwrap_err();
    assert_eq!(e.path(), Some("execution_plan[1].name"));
}
