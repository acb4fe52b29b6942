//! Malformed-input robustness: thousands of corrupt variants of every fixture and
//! of the builder-made programs must each load as `Ok` or a typed `Err`, never
//! panic, and a variant that loads must be usable (accessors, summary) without
//! panicking either.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use etch_format::inspect::ProgramSummary;
use etch_format::{ProgramFile, Value};
use etch_memory::SharedBytes;

/// Deterministic xorshift, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Loads `bytes` and, if it loads, walks everything the runtime would touch.
fn exercise(bytes: Vec<u8>) -> bool {
    let Ok(shared) = SharedBytes::from_vec_aligned(bytes) else {
        return false;
    };
    let Ok(file) = ProgramFile::from_bytes(shared) else {
        return false;
    };
    // A method that fails validation is an error of its own; the others must work.
    for plan in file.plans().filter_map(|(_, plan)| plan.ok()) {
        for value in &plan.values {
            if let Value::Tensor(t) = value {
                let n = t.nbytes();
                let _ = t.numel();
                if t.data_buffer_idx > 0 {
                    if t.allocation_info.is_some() {
                        let _ = file.mutable_data(t.data_buffer_idx, n);
                    } else if let Ok(r) = file.check_constant(t.data_buffer_idx, n) {
                        assert!(
                            file.slice(r).is_some(),
                            "validated constant outside the file"
                        );
                    }
                }
            }
        }
        for d in &plan.delegates {
            if let Ok(r) = file.delegate_data(&d.processed) {
                assert!(file.slice(r).is_some(), "delegate data outside the file");
            }
        }
        assert!(file.plan(&plan.name).is_some());
    }
    for i in 0..file.program().segments.len() {
        let r = file.segment(i).expect("listed segment");
        assert!(file.slice(r).is_some(), "segment outside the file");
    }
    let summary = ProgramSummary::new(&file);
    let _ = summary.render_text();
    true
}

/// Runs one variant, turning a panic into a test failure that names the variant.
fn check(name: &str, what: &str, bytes: Vec<u8>, loaded: &mut usize) {
    match catch_unwind(AssertUnwindSafe(|| exercise(bytes))) {
        Ok(true) => *loaded += 1,
        Ok(false) => {}
        Err(_) => panic!("{name}: panicked on variant {what}"),
    }
}

/// The FlatBuffers program size of an intact file.
fn program_size(bytes: &[u8]) -> usize {
    if bytes.get(8..12) == Some(b"eh00".as_slice()) {
        bytes
            .get(16..24)
            .and_then(|b| b.try_into().ok())
            .map_or(bytes.len(), |b| u64::from_le_bytes(b) as usize)
            .min(bytes.len())
    } else {
        bytes.len()
    }
}

/// Derives malformed variants of `original` and checks each; `budget` bounds the
/// number of variants of each kind (larger files are sampled with a coarser stride).
fn mutate_all(name: &str, original: &[u8], budget: usize) -> (usize, usize) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ original.len() as u64);
    let mut count = 0usize;
    let mut loaded = 0usize;
    let psize = program_size(original);
    let stride = |span: usize| (span / budget).max(1).next_multiple_of(4);

    // Truncation at many boundaries; for files with an extended header, also with
    // the header rewritten to match, so the truncated tables are actually parsed.
    let step = stride(original.len());
    for len in (0..original.len()).step_by(step).chain([1, 7, 9, 15]) {
        let cut = original.get(..len).unwrap_or(original).to_vec();
        check(name, &format!("truncate {len}"), cut.clone(), &mut loaded);
        count += 1;
        if cut.len() >= 40 && cut.get(8..12) == Some(b"eh00".as_slice()) {
            let mut fixed = cut;
            fixed[16..24].copy_from_slice(&(len as u64).to_le_bytes());
            fixed[24..40].fill(0);
            check(
                name,
                &format!("truncate {len} + header"),
                fixed,
                &mut loaded,
            );
            count += 1;
        }
    }

    // Every u32 of the program data (sampled on big files) set to special values.
    let step = stride(psize);
    for pos in (0..psize.saturating_sub(3)).step_by(step) {
        let old = u32::from_le_bytes(original[pos..pos + 4].try_into().unwrap());
        for v in [
            0,
            u32::MAX,
            0x8000_0000,
            original.len() as u32,
            old.wrapping_add(4),
            old.wrapping_sub(4),
        ] {
            let mut b = original.to_vec();
            b[pos..pos + 4].copy_from_slice(&v.to_le_bytes());
            check(name, &format!("u32 at {pos} = {v:#x}"), b, &mut loaded);
            count += 1;
        }
    }

    // u16s (vtable entries) at 2-byte steps, sampled.
    for _ in 0..budget {
        let pos = rng.below(psize.saturating_sub(1)) & !1;
        let mut b = original.to_vec();
        let v: u16 = [0, 0xFFFF, 2, 4][rng.below(4)];
        b[pos..pos + 2].copy_from_slice(&v.to_le_bytes());
        check(name, &format!("u16 at {pos} = {v:#x}"), b, &mut loaded);
        count += 1;
    }

    // Random bit flips, one to four per variant.
    for _ in 0..budget {
        let mut b = original.to_vec();
        let flips = 1 + rng.below(4);
        let mut what = String::from("flip");
        for _ in 0..flips {
            let pos = rng.below(psize);
            let bit = rng.below(8);
            b[pos] ^= 1 << bit;
            what += &format!(" {pos}.{bit}");
        }
        check(name, &what, b, &mut loaded);
        count += 1;
    }

    // Wrong identifiers and headers.
    for id in [b"ET11", b"ET99", b"et12", b"\0\0\0\0", b"FT01"] {
        let mut b = original.to_vec();
        b[4..8].copy_from_slice(id);
        check(name, &format!("identifier {id:?}"), b, &mut loaded);
        count += 1;
    }
    let mut b = original.to_vec();
    b[8..12].copy_from_slice(b"eh00");
    check(name, "forced eh00", b, &mut loaded);
    count += 1;
    (count, loaded)
}

#[test]
fn builder_and_data_programs_survive_corruption() {
    let mut no_header = common::program::sample_program();
    no_header.segments.clear();
    no_header.constant_segment = None;
    no_header.mutable_data_segments.clear();
    no_header.named_data.clear();
    no_header.extended_header = false;
    no_header.constant_buffers = vec![vec![], vec![0; 24], vec![0; 8]];
    if let common::program::ValueB::Tensor(t) = &mut no_header.plans[0].values[13] {
        t.data_buffer_idx = 0;
    }
    let xnnpack = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/xnnpack_linear.pte"),
    )
    .unwrap();
    let mut total = 0;
    for (name, bytes) in [
        ("sample", common::program::sample_program().to_bytes()),
        ("sample-no-header", no_header.to_bytes()),
        ("xnnpack_linear", xnnpack),
    ] {
        assert!(exercise(bytes.clone()), "{name} must load intact");
        let (count, _) = mutate_all(name, &bytes, 1000);
        total += count;
    }
    eprintln!("{total} builder/data-program variants");
    assert!(total > 10_000, "only {total} variants");
}

#[test]
fn fixtures_survive_corruption() {
    let files = common::fixture_files();
    if files.is_empty() {
        return;
    }
    // Spread a fixed budget of variant bytes over the fixtures, so the test stays
    // fast (well under 20 s in debug on slow cores) as fixtures are added: small
    // programs get up to MAX_VARIANTS variants, big ones at least MIN_VARIANTS.
    const TOTAL_VARIANT_BYTES: usize = 300 << 20;
    const MIN_VARIANTS: usize = 90;
    const MAX_VARIANTS: usize = 3000;
    let per_file = TOTAL_VARIANT_BYTES / files.len();
    let mut total = 0;
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        let variants = (per_file / bytes.len().max(1)).clamp(MIN_VARIANTS, MAX_VARIANTS);
        // mutate_all makes about 9 variants per unit of budget.
        let budget = variants / 9;
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(exercise(bytes.clone()), "{name} must load intact");
        let (count, _) = mutate_all(&name, &bytes, budget);
        total += count;
    }
    eprintln!("{total} fixture variants over {} files", files.len());
    assert!(total > 1000, "only {total} variants");
}
