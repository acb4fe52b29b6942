//! A real XNNPACK-delegated program (`tests/data/xnnpack_linear.pte`, written by
//! ExecuTorch 1.5.1, see `make_xnnpack_pte.py`): delegate payloads in segments,
//! weights as named data.

use etch_format::inspect::ProgramSummary;
use etch_format::{DelegateDataReference, Instruction, ProgramFile};

#[test]
fn xnnpack_delegate_program() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/xnnpack_linear.pte");
    let file = ProgramFile::read(&path).unwrap();
    let summary = ProgramSummary::new(&file);
    assert_eq!(summary.methods[0].delegates[0].backend, "XnnpackBackend");
    assert_eq!(
        summary.methods[0].delegates[0].payload_bytes,
        payload_len(&file)
    );
    let plan = file.plan("forward").unwrap();
    assert_eq!(plan.delegates.len(), 1);
    let delegate = &plan.delegates[0];
    assert_eq!(delegate.id, "XnnpackBackend");
    let payload = file.delegate_data(&delegate.processed).unwrap();
    let bytes = file.slice(payload).unwrap();
    assert!(!bytes.is_empty());
    // The XNNPACK blob header: 4 bytes, then the "XH00" magic (brief §9.2).
    assert_eq!(bytes.get(4..8), Some(b"XH00".as_slice()));
    assert!(plan.chains[0].instructions.iter().any(|i| matches!(
        i,
        Instruction::DelegateCall {
            delegate_index: 0,
            ..
        }
    )));
    if let DelegateDataReference::Segment(i) = delegate.processed {
        assert_eq!(file.segment(i).unwrap(), payload);
    }
    // The linear weight (4 x 8 f32) and bias (4 f32), keyed by SHA-256 hex.
    let mut sizes: Vec<usize> = Vec::new();
    for named in &file.program().named_data {
        assert_eq!(named.key.len(), 64);
        let range = file.named_data(&named.key).unwrap();
        assert!(file.slice(range).is_some());
        sizes.push(range.len);
    }
    sizes.sort();
    assert_eq!(sizes, [16, 128]);
}

fn payload_len(file: &ProgramFile) -> usize {
    let plan = file.plan("forward").unwrap();
    file.delegate_data(&plan.delegates[0].processed)
        .unwrap()
        .len
}
