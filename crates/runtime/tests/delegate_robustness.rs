//! Corrupted XNNPACK delegates: bytes flipped, overwritten and cut inside the delegate
//! segments of real fixtures. Every corruption must end in a typed error or in a run
//! that completes: never a panic, an abort or a hang.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use etch_format::ProgramFile;
use etch_memory::SharedBytes;
use etch_runtime::{Program, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The fixtures, and how many corruptions each gets.
const CASES: &[(&str, usize)] = &[
    ("xnn_linear", 1500),
    ("xnn_conv2d", 1500),
    ("xnn_softmax", 600),
    ("xnn_qd8_linear_outliers", 1500),
    ("tiny_llama_8da4w_xnnpack", 1000),
    ("tiny_llama_xnnpack", 500),
];

/// A run that takes longer than this is reported as a hang.
const HANG: Duration = Duration::from_secs(120);

struct XorShift(u64);

impl XorShift {
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

fn call0_inputs(name: &str) -> Vec<Value> {
    let dir = fixtures().join(name);
    (0..)
        .map(|k| dir.join(format!("call0.in{k}.npy")))
        .take_while(|p| p.exists())
        .map(|p| Value::Tensor(etch_runtime::npy::read_npy_file(&p).expect("fixture npy")))
        .collect()
}

/// Byte ranges of every delegate payload in the file.
fn delegate_ranges(bytes: &[u8]) -> Vec<(usize, usize)> {
    let file = ProgramFile::from_bytes(SharedBytes::from_vec_aligned(bytes.to_vec()).unwrap())
        .expect("fixture loads");
    let mut ranges = Vec::new();
    for (name, plan) in file.plans() {
        let plan = plan.unwrap_or_else(|e| panic!("method {name}: {e}"));
        for d in &plan.delegates {
            let r = file.delegate_data(&d.processed).expect("delegate range");
            ranges.push((r.offset, r.len));
        }
    }
    ranges
}

enum Outcome {
    /// Loading or running gave a typed error.
    Error,
    /// The run completed.
    Ran,
}

/// Loads `bytes` and runs `forward` once; errors are fine, panics are not.
fn load_and_run(bytes: Vec<u8>, inputs: &[Value]) -> Outcome {
    let Ok(shared) = SharedBytes::from_vec_aligned(bytes) else {
        return Outcome::Error;
    };
    let program = match Program::from_bytes(shared)
        .threads(1)
        // A corrupted dim may claim gigabytes: the budget turns that into an error.
        .max_memory(1 << 30)
        .build_program()
    {
        Ok(p) => p,
        Err(_) => return Outcome::Error,
    };
    let mut method = match program.method("forward") {
        Ok(m) => m,
        Err(_) => return Outcome::Error,
    };
    if method.set_inputs(inputs).is_err() || method.execute().is_err() {
        return Outcome::Error;
    }
    Outcome::Ran
}

fn corrupt(original: &[u8], ranges: &[(usize, usize)], rng: &mut XorShift) -> (Vec<u8>, String) {
    let (offset, len) = ranges[rng.below(ranges.len())];
    // Half of the corruptions land in the first KiB: the header and the graph's
    // tables, where a byte changes meaning most; the rest anywhere in the payload.
    let window = if rng.next().is_multiple_of(2) {
        len.min(1024)
    } else {
        len
    };
    let at = offset + rng.below(window);
    let mut bytes = original.to_vec();
    let what = match rng.next() % 4 {
        0 => {
            let bit = rng.below(8);
            bytes[at] ^= 1 << bit;
            format!("flip bit {bit} of byte {at}")
        }
        1 => {
            let n = 1 + rng.below(8);
            let value = [0u8, 0xff, 0x7f, 0x80][rng.below(4)];
            let end = (at + n).min(offset + len);
            bytes[at..end].fill(value);
            format!("overwrite {at}..{end} with {value:#x}")
        }
        2 => {
            let n = 1 + rng.below(4);
            let end = (at + n).min(offset + len);
            for b in &mut bytes[at..end] {
                *b = rng.next() as u8;
            }
            format!("randomise {at}..{end}")
        }
        _ => {
            bytes.truncate(at);
            format!("truncate the file at {at}")
        }
    };
    (bytes, what)
}

#[test]
fn corrupted_delegate_segments_give_typed_errors_or_complete_runs() {
    // A watchdog: a corruption that makes a run spin forever fails the test instead
    // of hanging it.
    let (progress, watch) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut last = String::from("start");
        loop {
            match watch.recv_timeout(HANG) {
                Ok(what) => last = what,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    eprintln!("a run took longer than {HANG:?} after: {last}");
                    std::process::exit(101);
                }
            }
        }
    });

    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let start = Instant::now();
    for &(name, count) in CASES {
        let original = std::fs::read(fixtures().join(format!("{name}.pte"))).expect("fixture");
        let ranges = delegate_ranges(&original);
        assert!(!ranges.is_empty(), "{name} has a delegate");
        let inputs = call0_inputs(name);
        assert!(
            matches!(load_and_run(original.clone(), &inputs), Outcome::Ran),
            "{name} runs uncorrupted"
        );
        let (mut errors, mut ran) = (0, 0);
        for k in 0..count {
            let (bytes, what) = corrupt(&original, &ranges, &mut rng);
            let label = format!("{name}, corruption {k}: {what}");
            progress.send(label.clone()).expect("watchdog");
            let outcome = std::panic::catch_unwind(|| load_and_run(bytes, &inputs))
                .unwrap_or_else(|_| panic!("panicked on {label}"));
            match outcome {
                Outcome::Error => errors += 1,
                Outcome::Ran => ran += 1,
            }
        }
        eprintln!("{name}: {count} corruptions, {errors} typed errors, {ran} complete runs");
        assert!(errors > 0, "{name}: some corruption must be detected");
    }
    eprintln!("all corruptions in {:.1} s", start.elapsed().as_secs_f64());
}
