//! The `etch inspect` summary.

mod common;

use etch_format::ProgramFile;
use etch_format::inspect::{DelegateSummary, IoSummary, ProgramSummary};

fn sample() -> ProgramFile {
    let bytes = common::program::sample_program().to_bytes();
    ProgramFile::from_bytes(etch_memory::SharedBytes::from_vec_aligned(bytes).unwrap()).unwrap()
}

#[test]
fn summary_of_sample_program() {
    let file = sample();
    let s = ProgramSummary::new(&file);
    assert_eq!(s.version, 0);
    assert_eq!(s.file_bytes, file.bytes().as_slice().len());
    assert!(s.extended_header);
    assert_eq!(s.segments.len(), 3);
    assert_eq!(s.segments[0].size, 32);
    assert_eq!(s.constant_data_bytes, 32);
    assert_eq!(s.constants, 2);
    assert_eq!(s.named_data, 1);
    assert_eq!(s.methods.len(), 2);
    let m = &s.methods[0];
    assert_eq!(m.name, "forward");
    assert_eq!(
        m.inputs,
        [IoSummary {
            kind: "Tensor".into(),
            dtype: Some("f32".into()),
            shape: vec![2, 3],
            dynamic: false,
            dim_order: None,
        }]
    );
    assert_eq!(m.outputs.len(), 1);
    assert_eq!(m.operators, ["aten::add.out", "aten::mul"]);
    assert_eq!(m.operator_calls, [1, 0]);
    assert_eq!(m.instructions, 5);
    assert_eq!(m.values, 15);
    assert_eq!(m.memory_plan_bytes, [64]);
    assert_eq!(m.memory_plan_total, 64);
    assert_eq!(m.constants_bytes, 24 + 8);
    assert_eq!(
        m.delegates,
        [DelegateSummary {
            backend: "TestBackend".into(),
            payload_bytes: 5,
            nodes: Vec::new(),
            packed_bytes: None,
            error: None,
        }]
    );
    let meta = &s.methods[1];
    assert_eq!(meta.outputs[0].kind, "Int");
    assert_eq!(meta.outputs[0].dtype, None);
    assert!(meta.memory_plan_bytes.is_empty());
}

#[test]
fn summary_serialises_and_renders() {
    let s = ProgramSummary::new(&sample());
    let json = serde_json::to_value(&s).unwrap();
    let forward = &json["methods"][0];
    assert_eq!(forward["name"], "forward");
    assert_eq!(forward["inputs"][0]["dtype"], "f32");
    assert_eq!(forward["inputs"][0]["shape"], serde_json::json!([2, 3]));
    assert_eq!(forward["inputs"][0]["dynamic"], false);
    assert_eq!(forward["operators"][0], "aten::add.out");
    assert_eq!(forward["operator_calls"][0], 1);
    assert_eq!(forward["memory_plan_bytes"], serde_json::json!([64]));
    assert_eq!(forward["delegates"][0]["backend"], "TestBackend");
    assert_eq!(json["segments"][1]["size"], 8);

    let text = s.render_text();
    for needle in [
        "method forward",
        "aten::add.out",
        "Tensor",
        "[2, 3]",
        "delegate 0 TestBackend: 5 bytes",
        "method get_n",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(
        text.lines().all(|l| l == l.trim_end()),
        "trailing spaces:\n{text}"
    );
}

#[test]
fn summary_of_tiny_llama() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny_llama_fp32.pte");
    let Ok(file) = ProgramFile::read(&path) else {
        return;
    };
    let s = ProgramSummary::new(&file);
    let forward = s.methods.iter().find(|m| m.name == "forward").unwrap();
    assert_eq!(
        forward.operator_calls.iter().sum::<usize>(),
        forward.instructions
    );
    assert_eq!(forward.inputs[0].dtype.as_deref(), Some("i64"));
    assert!(forward.inputs[0].dynamic);
    assert_eq!(forward.outputs[0].dtype.as_deref(), Some("f32"));
    assert_eq!(forward.memory_plan_bytes.len(), 1);
    assert!(forward.constants_bytes > 0);
    assert!(forward.constants_bytes as usize <= s.constant_data_bytes);
    assert!(s.methods.iter().any(|m| m.name == "get_max_seq_len"));
}

#[test]
fn channels_last_inputs_are_shown() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/vision_channels_last.pte");
    let file = ProgramFile::read(&path).expect("the channels-last fixture");
    let s = ProgramSummary::new(&file);
    let forward = &s.methods[0];
    assert_eq!(
        forward.inputs[0].dim_order.as_deref(),
        Some(&[0u8, 2, 3, 1][..])
    );
    assert!(
        s.render_text().contains("channels-last"),
        "{}",
        s.render_text()
    );
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains("\"dim_order\":[0,2,3,1]"), "{json}");
}

#[test]
fn a_method_that_fails_validation_is_listed_and_marked() {
    let mut p = common::program::sample_program();
    common::program::tensor(&mut p, 1).scalar_type = 9;
    let bytes = etch_memory::SharedBytes::from_vec_aligned(p.to_bytes()).unwrap();
    let s = ProgramSummary::new(&ProgramFile::from_bytes(bytes).unwrap());
    let names: Vec<(&str, bool)> = s
        .methods
        .iter()
        .map(|m| (m.name.as_str(), m.loadable))
        .collect();
    assert_eq!(names, [("forward", false), ("get_n", true)]);
    let forward = &s.methods[0];
    let error = forward.error.as_deref().unwrap();
    assert!(error.contains("unknown ScalarType 9"), "{error}");
    assert!(forward.operators.is_empty() && forward.inputs.is_empty());
    assert_eq!(s.methods[1].outputs[0].kind, "Int");

    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["methods"][0]["loadable"], false);
    assert_eq!(json["methods"][0]["error"], error);
    assert_eq!(json["methods"][1]["loadable"], true);
    assert!(json["methods"][1].get("error").is_none());

    let text = s.render_text();
    assert!(text.contains("2 method(s) (1 not loadable)"), "{text}");
    assert!(
        text.contains(&format!("method forward: [not loadable] {error}")),
        "{text}"
    );
    assert!(text.contains("method get_n:"), "{text}");
}
