//! Fuzzes the `.pte` and `.ptd` loaders: any input must load or fail with a
//! `FormatError`, and whatever loads must be usable without panicking.

#![no_main]

use etch_format::inspect::ProgramSummary;
use etch_format::{DataFile, ProgramFile, Value};
use etch_memory::SharedBytes;
use libfuzzer_sys::fuzz_target;

fn exercise_program(file: &ProgramFile) {
    // Each method loads or fails alone; whatever loads must be usable.
    for plan in file.plans().filter_map(|(_, plan)| plan.ok()) {
        for value in &plan.values {
            if let Value::Tensor(t) = value {
                let n = t.nbytes();
                if t.data_buffer_idx > 0 {
                    if t.allocation_info.is_some() {
                        let _ = file.mutable_data(t.data_buffer_idx, n);
                    } else if let Ok(r) = file.check_constant(t.data_buffer_idx, n) {
                        assert!(file.slice(r).is_some());
                    }
                }
            }
        }
        for d in &plan.delegates {
            if let Ok(r) = file.delegate_data(&d.processed) {
                assert!(file.slice(r).is_some());
            }
        }
    }
    let _ = ProgramSummary::new(file).render_text();
}

fn exercise_data(file: &DataFile) {
    let keys: Vec<String> = file.keys().map(str::to_owned).collect();
    for key in keys {
        if let Some((range, layout)) = file.get(&key) {
            assert!(file.slice(range).is_some());
            if let Some(l) = layout {
                assert!(l.nbytes() <= range.len);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(bytes) = SharedBytes::from_vec_aligned(data.to_vec()) else {
        return;
    };
    if let Ok(file) = ProgramFile::from_bytes(bytes.clone()) {
        exercise_program(&file);
    }
    if let Ok(file) = DataFile::from_bytes(bytes) {
        exercise_data(&file);
    }
});
