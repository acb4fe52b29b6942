//! Loads every `tests/fixtures/*.pte` and compares it with `tests/fixtures/manifest.json`.

mod common;

use etch_format::ProgramFile;
use etch_format::inspect::ProgramSummary;

#[test]
fn every_fixture_loads() {
    for path in common::fixture_files() {
        let file = ProgramFile::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        file.load_all_plans()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mapped =
            ProgramFile::map(&path, false).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            file.method_names().collect::<Vec<_>>(),
            mapped.method_names().collect::<Vec<_>>()
        );
        let summary = ProgramSummary::new(&file);
        println!("{}:\n{}", path.display(), summary.render_text());
    }
}

/// Operator names of every plan, deduplicated in first-seen order.
fn operators_of(file: &ProgramFile) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (name, plan) in file.plans() {
        let plan = plan.unwrap_or_else(|e| panic!("method {name}: {e}"));
        for op in &plan.operators {
            let name = op.qualified_name();
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn fixtures_match_manifest() {
    let Ok(text) = std::fs::read_to_string(common::fixtures_dir().join("manifest.json")) else {
        return; // No manifest yet: nothing to compare.
    };
    let manifest: serde_json::Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    let fixtures = manifest["fixtures"].as_array().cloned().unwrap_or_default();
    for fixture in fixtures {
        let Some(pte) = fixture["pte"].as_str() else {
            continue;
        };
        let path = common::fixtures_dir().join(pte);
        if !path.exists() {
            continue; // Still being generated.
        }
        let file = ProgramFile::read(&path).unwrap_or_else(|e| panic!("{pte}: {e}"));
        if let Some(expected) = fixture["operators"].as_array() {
            let expected: Vec<String> = expected
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            let found = operators_of(&file);
            let mut sorted_expected = expected.clone();
            let mut sorted_found = found.clone();
            sorted_expected.sort();
            sorted_found.sort();
            assert_eq!(sorted_found, sorted_expected, "{pte}: operator set");
        }
        let names: Vec<&str> = file.method_names().collect();
        for call in fixture["calls"].as_array().into_iter().flatten() {
            if let Some(method) = call["method"].as_str() {
                assert!(
                    names.contains(&method),
                    "{pte}: no method {method} in {names:?}"
                );
                let plan = file.plan(method).expect("plan by name");
                if let Some(inputs) = call["inputs"].as_array() {
                    assert_eq!(plan.inputs.len(), inputs.len(), "{pte}: {method} inputs");
                }
                if let Some(outputs) = call["outputs"].as_array() {
                    assert_eq!(plan.outputs.len(), outputs.len(), "{pte}: {method} outputs");
                }
            }
        }
    }
}

/// Facts about the tiny llama export (brief §10), when that fixture exists.
#[test]
fn tiny_llama_facts() {
    let path = common::fixtures_dir().join("tiny_llama_fp32.pte");
    if !path.exists() {
        return;
    }
    let file = ProgramFile::read(&path).expect("tiny llama loads");
    let header = file.header().expect("eh00 header");
    assert_eq!(header.header_length, 32);
    assert_eq!(header.segment_base_offset % 128, 0);
    assert!(header.segment_base_offset >= header.program_size);
    let names: Vec<&str> = file.method_names().collect();
    for name in [
        "forward",
        "get_max_seq_len",
        "get_max_context_len",
        "get_n_layers",
        "get_vocab_size",
        "use_kv_cache",
        "use_sdpa_with_kv_cache",
        "enable_dynamic_shape",
    ] {
        assert!(names.contains(&name), "missing {name}");
    }
    let meta = file.plan("get_max_seq_len").expect("metadata method");
    assert_eq!(meta.values, vec![etch_format::Value::Int(32)]);
    let forward = file.plan("forward").expect("forward");
    assert_eq!(forward.chains.len(), 1);
    assert_eq!(forward.non_const_buffer_sizes.first(), Some(&0));
    // Every constant resolves inside the constant segment.
    let mut constants = 0;
    for value in &forward.values {
        if let etch_format::Value::Tensor(t) = value
            && t.data_buffer_idx > 0
            && t.allocation_info.is_none()
        {
            let range = file
                .check_constant(t.data_buffer_idx, t.nbytes())
                .expect("constant");
            assert_eq!(file.slice(range).map(<[u8]>::len), Some(t.nbytes()));
            constants += 1;
        }
    }
    assert!(constants > 0);
}
