//! The memory budget: a load that would hold more than `max_memory` fails before
//! allocating, with a typed error that says what needs how much; a file that claims
//! more memory than the machine has is an error, never an abort.

use std::path::{Path, PathBuf};

use etch_format::ProgramFile;
use etch_memory::{MemoryBudget, SharedBytes};
use etch_runtime::{LoadMode, Program, RuntimeError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn budget_error(err: RuntimeError) -> etch_memory::BudgetExceeded {
    match err {
        RuntimeError::MemoryBudget(e) => e,
        other => panic!("expected a memory budget error, got {other}"),
    }
}

const LLAMA: &str = "tiny_llama_fp32.pte";

#[test]
fn reading_a_file_larger_than_the_budget_fails_before_reading() {
    let path = fixture(LLAMA);
    let len = std::fs::metadata(&path).unwrap().len();
    for mode in [LoadMode::Read, LoadMode::HugePages] {
        let err = Program::from_path(&path)
            .load_mode(mode)
            .max_memory(1024)
            .threads(1)
            .build_program()
            .expect_err("a 1 KiB budget cannot hold the file");
        let e = budget_error(err);
        assert_eq!((e.needed, e.budget), (len, 1024), "{mode:?}");
        assert!(e.what.contains("tiny_llama_fp32.pte"), "{}", e.what);
    }
    // A memory map copies nothing: the same budget loads the file.
    Program::from_path(&path)
        .load_mode(LoadMode::Mmap)
        .max_memory(1024)
        .threads(1)
        .build_program()
        .expect("mapped program loads within 1 KiB");
}

#[test]
fn each_session_holds_its_planned_memory_against_the_budget() {
    let unlimited = Program::from_path(fixture(LLAMA))
        .load_mode(LoadMode::Mmap)
        .threads(1)
        .build_program()
        .unwrap();
    let planned = unlimited.method("forward").unwrap().planned_bytes() as u64;
    assert!(planned > 0, "the tiny llama plans its KV cache");

    // Room for one session (and its 8-byte-per-buffer rounding), not for two.
    let program = Program::from_path(fixture(LLAMA))
        .load_mode(LoadMode::Mmap)
        .max_memory(planned + planned / 2)
        .threads(1)
        .build_program()
        .unwrap();
    let first = program.method("forward").expect("one session fits");
    let e = budget_error(program.method("forward").expect_err("two do not"));
    assert!(
        e.what.contains("planned memory") && e.what.contains("forward"),
        "{}",
        e.what
    );
    assert!(e.needed >= planned && e.in_use >= planned, "{e:?}");
    let message = e.to_string();
    assert!(
        message.contains("max-memory"),
        "the message says how to raise it: {message}"
    );
    // Dropping a session gives its memory back.
    drop(first);
    assert_eq!(program.memory_budget().in_use(), 0);
    program.method("forward").expect("fits again");
}

#[test]
fn a_budget_shared_by_two_programs_limits_them_together() {
    let path = fixture(LLAMA);
    let len = std::fs::metadata(&path).unwrap().len();
    let budget = MemoryBudget::new(len + len / 2);
    let first = Program::from_path(&path)
        .load_mode(LoadMode::Read)
        .memory_budget(budget.clone())
        .threads(1)
        .build_program()
        .expect("one copy fits");
    let err = Program::from_path(&path)
        .load_mode(LoadMode::Read)
        .memory_budget(budget.clone())
        .threads(1)
        .build_program()
        .expect_err("two copies do not");
    assert_eq!(budget_error(err).in_use, len);
    drop(first);
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn delegates_hold_their_packed_weights_against_the_budget() {
    let path = fixture("tiny_llama_xnnpack.pte");
    let err = Program::from_path(&path)
        .load_mode(LoadMode::Mmap)
        .max_memory(4096)
        .threads(1)
        .build_program()
        .unwrap()
        .method("forward")
        .expect_err("packed weights exceed 4 KiB");
    let e = budget_error(err);
    assert!(
        e.what.contains("packed weights") && e.what.contains("XnnpackBackend"),
        "{}",
        e.what
    );
}

/// `path`'s bytes with the last planned buffer of `forward` claiming `bytes`.
fn claiming_planned_bytes(path: &Path, bytes: u64) -> SharedBytes {
    let original = std::fs::read(path).unwrap();
    let program =
        ProgramFile::from_bytes(SharedBytes::from_vec_aligned(original.clone()).unwrap()).unwrap();
    let sizes = &program.plan("forward").unwrap().non_const_buffer_sizes;
    // The flatbuffer vector: a u32 length, then the i64 sizes.
    let mut pattern = (sizes.len() as u32).to_le_bytes().to_vec();
    for &s in sizes {
        pattern.extend_from_slice(&s.to_le_bytes());
    }
    let at: Vec<usize> = original
        .windows(pattern.len())
        .enumerate()
        .filter(|(_, w)| *w == pattern.as_slice())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "the buffer size vector is found once");
    let last = at[0] + pattern.len() - 8;
    let mut patched = original;
    patched[last..last + 8].copy_from_slice(&bytes.to_le_bytes());
    SharedBytes::from_vec_aligned(patched).unwrap()
}

const HUNDRED_GIB: u64 = 100 << 30;

#[test]
fn a_file_claiming_100_gib_fails_at_load_with_what_it_needs() {
    let bytes = claiming_planned_bytes(&fixture(LLAMA), HUNDRED_GIB);
    let program = Program::from_bytes(bytes.clone())
        .max_memory(8 << 30)
        .threads(1)
        .build_program()
        .expect("the file itself is valid");
    let e = budget_error(program.method("forward").expect_err("100 GiB > 8 GiB"));
    assert!(e.needed >= HUNDRED_GIB, "{e:?}");
    assert!(e.to_string().contains("100.0 GiB"), "{e}");

    // The default budget is what the system has available.
    let default = Program::from_bytes(bytes)
        .threads(1)
        .build_program()
        .unwrap();
    match default.memory_budget().limit() {
        Some(available) if available < HUNDRED_GIB => {
            let e = budget_error(default.method("forward").expect_err("more than available"));
            assert_eq!(e.budget, available);
        }
        other => eprintln!("skipped the default-budget check: available memory {other:?}"),
    }
}

#[test]
fn an_allocator_that_runs_out_is_an_error_not_an_abort() {
    // Within the budget, the planned-memory allocator itself reports failure.
    let program = Program::from_path(fixture(LLAMA))
        .memory_budget(MemoryBudget::unlimited())
        .memory_allocator(std::sync::Arc::new(
            etch_memory::ArenaAllocator::with_capacity(1024).unwrap(),
        ))
        .threads(1)
        .build_program()
        .unwrap();
    match program.method("forward") {
        Err(RuntimeError::Plan { method, source }) => {
            assert_eq!(method, "forward");
            assert!(
                matches!(source, etch_memory::PlanError::Alloc { .. }),
                "{source}"
            );
        }
        Err(other) => panic!("expected an allocation error, got {other}"),
        Ok(_) => panic!("a 1 KiB arena cannot hold the KV cache"),
    }
}
