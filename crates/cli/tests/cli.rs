//! The `etch` binary end to end: good runs print what they promise, bad input ends in
//! a one-line error and exit status 1 (never a panic, whose status is 101).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

/// `fixture(name)` as a command-line argument.
fn fixture_arg(name: &str) -> String {
    fixture(name).display().to_string()
}

fn etch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_etch"))
        .args(args)
        .output()
        .expect("run etch")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit status 0, else the stderr is shown.
#[track_caller]
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "{}", stderr(o));
}

/// Exit status 0 and the stdout, which must be one JSON value.
#[track_caller]
fn json_stdout(o: &Output) -> serde_json::Value {
    assert_ok(o);
    serde_json::from_slice(&o.stdout).expect("--json prints JSON")
}

/// Exit status 1 and an `error:` line that contains `needle`.
fn assert_fails_with(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "status {:?}, stderr: {err}",
        o.status
    );
    assert!(err.contains("error:"), "no error line: {err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

/// A byte-level `tokenizer.json` with one token per byte (ids 0..256, no merges) plus
/// `extra` word tokens after them.
fn byte_tokenizer(dir: &Path, extra: usize) -> PathBuf {
    let json = etch_llm::tokenizer::byte_level_tokenizer_json(extra);
    let path = dir.join(format!("tokenizer_{extra}.json"));
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    path
}

fn tiny_llama() -> String {
    fixture_arg("tiny_llama_fp32.pte")
}

#[test]
fn inspect_prints_text_and_json() {
    let o = etch(&["inspect", &fixture_arg("linear.pte")]);
    assert_ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("forward"));
    let o = etch(&["inspect", "--json", &tiny_llama()]);
    let v = json_stdout(&o);
    assert!(v.is_object());
}

#[test]
fn inspect_rejects_missing_and_corrupt_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pte");
    assert_fails_with(
        &etch(&["inspect", &missing.display().to_string()]),
        "nope.pte",
    );

    let bytes = std::fs::read(fixture("linear.pte")).unwrap();
    let truncated = dir.path().join("truncated.pte");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let o = etch(&["inspect", &truncated.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    let mut garbled = bytes.clone();
    for b in garbled.iter_mut().skip(8).step_by(7) {
        *b ^= 0x5A;
    }
    let garbled_path = dir.path().join("garbled.pte");
    std::fs::write(&garbled_path, &garbled).unwrap();
    let o = etch(&["inspect", &garbled_path.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    let not_pte = dir.path().join("text.pte");
    std::fs::write(&not_pte, b"hello, this is not a program").unwrap();
    assert_fails_with(
        &etch(&["inspect", &not_pte.display().to_string()]),
        "text.pte",
    );
}

#[test]
fn run_rejects_bad_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let pte = tiny_llama();
    // a garbage .npy
    let bad = dir.path().join("bad.npy");
    std::fs::write(&bad, b"\x93NUMPY\x01\x00garbage").unwrap();
    let o = etch(&[
        "run",
        &pte,
        "--input",
        &bad.display().to_string(),
        "--input",
        "0",
    ]);
    assert_fails_with(&o, "bad.npy");
    // too few inputs
    let tokens = fixture_arg("tiny_llama_fp32/call0.in0.npy");
    let o = etch(&["run", &pte, "--input", &tokens]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // a method that does not exist
    let o = etch(&["run", &pte, "--method", "no_such_method"]);
    assert_fails_with(&o, "no_such_method");
}

/// `etch run` of the tiny Llama on its first recorded call's inputs, writing the
/// outputs into `out_dir`, with `extra` options after.
fn run_tiny_llama(out_dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "run".to_string(),
        tiny_llama(),
        "--input".into(),
        fixture_arg("tiny_llama_fp32/call0.in0.npy"),
        "--input".into(),
        fixture_arg("tiny_llama_fp32/call0.in1.npy"),
        "--output-dir".into(),
        out_dir.display().to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    etch(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn run_writes_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let v = json_stdout(&run_tiny_llama(dir.path(), &["--json"]));
    assert!(v.is_object());
    assert!(dir.path().join("out0.npy").exists());
}

/// bf16 outputs are raw 16-bit words as they are, f32 with `--output-dtype f32`.
#[test]
fn run_writes_half_outputs_as_f32_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let (a, b) = (
        fixture_arg("half_arith/call0.in0.npy"),
        fixture_arg("half_arith/call0.in1.npy"),
    );
    let pte = fixture_arg("half_arith.pte");
    let header = |name: &str| {
        let bytes = std::fs::read(dir.path().join(name)).unwrap();
        String::from_utf8_lossy(&bytes[..bytes.len().min(128)]).into_owned()
    };
    let run = [
        "run",
        &pte,
        "--input",
        &a,
        "--input",
        &b,
        "--output-dir",
        &out,
    ];
    assert_ok(&etch(&run));
    assert!(
        header("out1.npy").contains("'<u2'"),
        "{}",
        header("out1.npy")
    );
    let o = etch(&[&run[..], &["--output-dtype", "f32"]].concat());
    assert_ok(&o);
    for name in ["out0.npy", "out1.npy", "out2.npy"] {
        assert!(header(name).contains("'<f4'"), "{name}: {}", header(name));
    }
}

/// With `--repeat`, a call reports its median time with the fastest and slowest run,
/// in the JSON and in the text.
#[test]
fn run_repeat_reports_median_fastest_and_slowest() {
    let dir = tempfile::tempdir().unwrap();
    let v = json_stdout(&run_tiny_llama(dir.path(), &["--repeat", "5", "--json"]));
    let call = &v["calls"][0];
    let ms = |key: &str| call[key].as_f64().unwrap_or(-1.0);
    let (min, median, max) = (ms("min_ms"), ms("median_ms"), ms("max_ms"));
    assert!(0.0 <= min && min <= median && median <= max, "{call}");
    let o = run_tiny_llama(dir.path(), &["--repeat", "5"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("(median of 5; fastest "), "{text}");
}

/// With `--repeat`, one warm-up call runs first by default (untimed, uncounted): the
/// timed runs of a warmed-up method allocate nothing. `--warmup 0` counts the first
/// call's allocations (its memory plan and scratch are touched for the first time).
#[test]
fn run_warms_up_before_timed_repeats() {
    let allocations = |extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let v = json_stdout(&run_tiny_llama(dir.path(), extra));
        v["calls"][0]["heap_allocations_per_run"]
            .as_f64()
            .expect("an allocation count")
    };
    assert_eq!(allocations(&["--repeat", "3", "--json"]), 0.0);
    assert_eq!(
        allocations(&["--repeat", "1", "--warmup", "2", "--json"]),
        0.0
    );
    assert!(allocations(&["--repeat", "3", "--warmup", "0", "--json"]) > 0.0);
    // A count that is not one is refused, naming the flag.
    let dir = tempfile::tempdir().unwrap();
    let o = run_tiny_llama(dir.path(), &["--repeat", "3", "--warmup", "many"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "a negative --warmup ran: {err}");
    assert!(err.contains("--warmup"), "the flag is not named: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

#[test]
fn run_profile_json_lists_operators_and_every_instruction() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_tiny_llama(dir.path(), &["--repeat", "3", "--profile", "--json"]);
    let v = json_stdout(&o);
    let operators = v["profile"].as_array().expect("a per-operator profile");
    let steps = v["profile_steps"]
        .as_array()
        .expect("a per-instruction profile");
    assert!(!steps.is_empty());
    // Steps in program order, each with its operator's name and times; together they
    // are the per-operator rows, call for call.
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"].as_u64(), Some(i as u64), "{s}");
        assert!(
            s["operator"].is_string() && s["ms"].as_f64() >= Some(0.0),
            "{s}"
        );
    }
    let calls = |rows: &[serde_json::Value]| {
        rows.iter()
            .map(|r| r["calls"].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    assert_eq!(calls(steps), calls(operators));
    for op in operators {
        let name = op["operator"].as_str().expect("an operator name");
        let of_op: Vec<_> = steps
            .iter()
            .filter(|s| s["operator"] == name)
            .cloned()
            .collect();
        assert!(!of_op.is_empty(), "{name} has no instruction");
        assert_eq!(Some(calls(&of_op)), op["calls"].as_u64(), "{name}");
    }
}

#[test]
fn run_folds_at_load_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let stats = |extra: &[&str]| {
        let mut args = vec![
            "run".to_string(),
            fixture_arg("vision_mobilenet_v2.pte"),
            "--input".into(),
            fixture_arg("vision_mobilenet_v2/call0.in0.npy"),
            "--output-dir".into(),
            dir.path().display().to_string(),
            "--stats".into(),
            "--json".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let o = etch(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let v = json_stdout(&o);
        v["stats"].clone()
    };
    let folded = stats(&[]);
    assert!(folded["folded_bytes"].as_u64() > Some(0), "{folded}");
    assert!(folded["folded_batch_norms"].as_u64() > Some(0), "{folded}");
    assert!(folded["folded_activations"].as_u64() > Some(0), "{folded}");
    assert!(
        folded["folded_constant_steps"].as_u64() > Some(0),
        "{folded}"
    );
    let unfolded = stats(&["--no-fold"]);
    for key in [
        "folded_bytes",
        "folded_batch_norms",
        "folded_activations",
        "folded_constant_steps",
        "unread_indices",
    ] {
        assert_eq!(unfolded[key].as_u64(), Some(0), "{key}: {unfolded}");
    }
}

#[test]
fn generate_json_has_the_promised_fields() {
    let dir = tempfile::tempdir().unwrap();
    let tok = byte_tokenizer(dir.path(), 0);
    let o = etch(&[
        "generate",
        "--model",
        &tiny_llama(),
        "--tokenizer",
        &tok.display().to_string(),
        "--prompt",
        "hello",
        "--max-new-tokens",
        "4",
        "--json",
    ]);
    let v = json_stdout(&o);
    assert_eq!(v["prompt_token_ids"].as_array().map(Vec::len), Some(5));
    assert!(v["generated_token_ids"].is_array());
    assert!(v["text"].is_string());
    for key in [
        "load_ms",
        "time_to_first_token_ms",
        "prefill_tokens_per_second",
        "decode_tokens_per_second",
        "peak_rss_bytes",
        "heap_allocations_per_decoded_token",
    ] {
        assert!(v["stats"][key].is_number(), "stats.{key} missing: {v}");
    }
}

/// The last token id of a fixture's recorded input `call{k}.in0.npy` (a `[1, S]` i64
/// token tensor).
fn recorded_token(name: &str, call: usize) -> u64 {
    let t = etch_runtime::npy::read_npy_file(&fixture(&format!("{name}/call{call}.in0.npy")))
        .expect("fixture npy");
    let ids = t.as_slice::<i64>().expect("i64 tokens");
    u64::try_from(*ids.last().expect("a token")).expect("a token id")
}

/// `etch generate` end to end on the families issue 52 added, greedy: Qwen3.5's
/// static-shape hybrid program (its prompt fed one token per call, 32 new tokens) and
/// Hugging Face's Gemma 3 export (which meets its EOS): the official runtime's tokens.
#[test]
fn generate_runs_hybrid_and_hugging_face_programs_with_the_official_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let tok = byte_tokenizer(dir.path(), 0).display().to_string();
    // (fixture, calls that feed the prompt, one prompt token per call, new tokens)
    let cases: [(&str, usize, bool, usize); 2] = [
        ("tiny_qwen3_5_xnnpack", 7, true, 32),
        ("optimum_gemma3", 1, false, 8),
    ];
    for (name, prompt_calls, one_per_call, new_tokens) in cases {
        let prompt: Vec<u64> = if one_per_call {
            (0..prompt_calls).map(|k| recorded_token(name, k)).collect()
        } else {
            let t = etch_runtime::npy::read_npy_file(&fixture(&format!("{name}/call0.in0.npy")))
                .expect("fixture npy");
            t.as_slice::<i64>()
                .unwrap()
                .iter()
                .map(|&v| v as u64)
                .collect()
        };
        let official: Vec<u64> = (prompt_calls..prompt_calls + new_tokens)
            .map(|k| recorded_token(name, k))
            .collect();
        let ids = prompt
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let pte = fixture_arg(&format!("{name}.pte"));
        let n = new_tokens.to_string();
        let v = json_stdout(&etch(&[
            "generate",
            "--model",
            &pte,
            "--tokenizer",
            &tok,
            "--prompt-token-ids",
            &ids,
            "--max-new-tokens",
            &n,
            "--temperature",
            "0",
            "--json",
        ]));
        let got: Vec<u64> = v["generated_token_ids"]
            .as_array()
            .expect("generated_token_ids")
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .collect();
        assert!(!got.is_empty(), "{name}: {v}");
        assert_eq!(got[..], official[..got.len()], "{name}: greedy tokens");
        if got.len() < new_tokens {
            // Gemma's chain meets its EOS (2) at the fifth token.
            assert_eq!(got.last(), Some(&2), "{name}: stopped early without an EOS");
        }
    }
}

#[test]
fn generate_rejects_bad_prompts_and_tokenizers() {
    let dir = tempfile::tempdir().unwrap();
    let tok = byte_tokenizer(dir.path(), 0).display().to_string();
    let model = tiny_llama();
    let base = ["generate", "--model", model.as_str(), "--tokenizer"];

    let o = etch(&[&base[..], &[tok.as_str(), "--prompt", ""]].concat());
    assert_fails_with(&o, "empty");

    // the tiny model's context is 64 tokens; one byte is one token here
    let long = "x".repeat(200);
    let o = etch(&[&base[..], &[tok.as_str(), "--prompt", long.as_str()]].concat());
    assert_fails_with(&o, "context");

    let missing = dir.path().join("missing.json").display().to_string();
    let o = etch(&[&base[..], &[missing.as_str(), "--prompt", "hi"]].concat());
    assert_fails_with(&o, "missing.json");

    // A chat template that is not there, one that does not parse, and a tokenizer with
    // neither a template beside it nor a built-in format's tokens.
    let chat = [tok.as_str(), "--prompt", "hi", "--chat"];
    let absent = dir.path().join("absent.jinja").display().to_string();
    let o = etch(&[&base[..], &chat, &["--chat-template", absent.as_str()]].concat());
    assert_fails_with(&o, "absent.jinja");
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}").unwrap();
    let broken = broken.display().to_string();
    let o = etch(&[&base[..], &chat, &["--chat-template", broken.as_str()]].concat());
    assert_fails_with(&o, "broken.jinja");
    let o = etch(&[&base[..], &chat].concat());
    assert_fails_with(&o, "--chat-template");

    // 256 bytes + 5000 words: far more ids than the model's 256
    let big = byte_tokenizer(dir.path(), 5000).display().to_string();
    let o = etch(&[&base[..], &[big.as_str(), "--prompt", "hi"]].concat());
    assert_fails_with(&o, "does not match");

    let o = etch(
        &[
            &base[..],
            &[tok.as_str(), "--prompt", "hi", "--temperature", "-1"],
        ]
        .concat(),
    );
    assert_eq!(
        o.status.code().map(|c| c != 0 && c != 101),
        Some(true),
        "{}",
        stderr(&o)
    );
}

#[test]
fn load_mode_is_checked_and_every_mode_runs() {
    let pte = tiny_llama();
    let o = etch(&[
        "run",
        &pte,
        "--load",
        "bogus",
        "--method",
        "get_max_seq_len",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "clap usage error expected: {err}");
    assert!(
        err.contains("huge-pages"),
        "the valid modes are listed: {err}"
    );
    for mode in ["mmap", "mmap-locked", "read", "huge-pages", "auto"] {
        let o = etch(&[
            "run",
            &pte,
            "--load",
            mode,
            "--method",
            "get_max_seq_len",
            "--json",
        ]);
        if mode == "mmap-locked" && !o.status.success() {
            // mlock may exceed this machine's lock limit; it must then fail cleanly.
            assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
            continue;
        }
        assert!(o.status.success(), "--load {mode}: {}", stderr(&o));
    }
}

#[test]
fn run_with_several_thens_feeds_each_call_its_own_inputs() {
    // The fixture records the official runtime on one prefill and four decode steps.
    let dir = tempfile::tempdir().unwrap();
    let steps = 5;
    let mut args = vec![
        "run".to_string(),
        tiny_llama(),
        "--output-dir".to_string(),
        dir.path().display().to_string(),
    ];
    for k in 0..steps {
        if k > 0 {
            args.push("--then".into());
        }
        for i in 0..2 {
            args.push("--input".into());
            args.push(fixture_arg(&format!("tiny_llama_fp32/call{k}.in{i}.npy")));
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = etch(&args);
    assert_ok(&o);
    for k in 0..steps {
        let read = |p: &Path| {
            etch_runtime::npy::read_npy_file(p)
                .expect("npy")
                .as_slice::<f32>()
                .expect("f32 logits")
        };
        let got = read(&dir.path().join(format!("step{k}.out0.npy")));
        let want = read(&fixture(&format!("tiny_llama_fp32/call{k}.out0.npy")));
        assert_eq!(got.len(), want.len(), "call {k}");
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-3, "call {k}: worst relative error {worst}");
    }
}

#[test]
fn bench_measures_every_thread_count_as_json_and_markdown() {
    let o = etch(&[
        "bench",
        "--model",
        &tiny_llama(),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1,2",
        "--json",
    ]);
    let v = json_stdout(&o);
    assert!(v["etch_version"].is_string());
    assert!(v["machine"]["isa"].is_string() && v["machine"]["cpu"].is_string());
    assert_eq!(v["model"]["max_context_len"], 64);
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    for (r, threads) in results.iter().zip([1, 2]) {
        assert_eq!(r["threads"], threads);
        for key in ["prefill", "decode"] {
            let runs = r[format!("{key}_runs")].as_array().expect("runs");
            assert_eq!(runs.len(), 2, "{r}");
            assert!(
                runs.iter().all(|x| x.as_f64().is_some_and(|x| x > 0.0)),
                "{r}"
            );
            assert!(r[format!("{key}_tokens_per_second_stddev")].is_number());
        }
    }

    // Delegated programs too; the table has a pp and a tg row.
    let xnn = fixture_arg("tiny_llama_8da4w_xnnpack.pte");
    let o = etch(&[
        "bench", "--model", &xnn, "-p", "8", "-n", "4", "-r", "1", "-t", "1",
    ]);
    assert_ok(&o);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("| pp8 |") && table.contains("| tg4 |"),
        "{table}"
    );
    assert!(table.contains("ISA:") && table.contains('±'), "{table}");

    let o = etch(&[
        "bench",
        "--model",
        &tiny_llama(),
        "-p",
        "60",
        "-n",
        "8",
        "-r",
        "1",
        "-t",
        "1",
    ]);
    assert_fails_with(&o, "context");
}

/// `byte_tokenizer` with ChatML's markers in place of bytes 0xFE and 0xFF (which UTF-8
/// text never has): `<|im_start|>` is id 254, `<|im_end|>` id 255.
fn chatml_byte_tokenizer(dir: &Path) -> PathBuf {
    let plain = byte_tokenizer(dir, 0);
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&plain).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    vocab.retain(|_, id| id.as_u64().is_some_and(|id| id < 254));
    let special = |id: u64, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": true})
    };
    json["added_tokens"] =
        serde_json::json!([special(254, "<|im_start|>"), special(255, "<|im_end|>")]);
    let path = dir.join("chatml_tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    path
}

/// `etch chat` with `lines` on stdin.
fn chat(tokenizer: &Path, extra: &[&str], lines: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_etch"))
        .args(["chat", "--model", &tiny_llama(), "--tokenizer"])
        .arg(tokenizer)
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run etch chat");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(lines.as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().expect("etch chat ends")
}

/// Tokens of ChatML's user turn for `text` with this tokenizer: `<|im_start|>`,
/// `user\n`, the text, `<|im_end|>`, `\n`, `<|im_start|>`, `assistant\n`.
fn user_turn_tokens(text: &str) -> usize {
    1 + 5 + text.len() + 1 + 1 + 1 + 10
}

#[test]
fn chat_prefills_only_each_new_turn_from_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let tok = chatml_byte_tokenizer(dir.path());
    // Greedy: the context accounting below follows the replies' lengths.
    let args = [
        "--max-new-tokens",
        "6",
        "--json",
        "--threads",
        "1",
        "--temperature",
        "0",
    ];
    let o = chat(
        &tok,
        &args,
        "hi\nhow are you\n/reset\nhi\n/system be brief\nhi\n",
    );
    assert_ok(&o);
    let turns: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per turn"))
        .collect();
    assert_eq!(turns.len(), 4, "{turns:?}");
    let n = |t: &serde_json::Value, key: &str| t[key].as_u64().expect(key) as usize;
    let (t1, t2) = (&turns[0], &turns[1]);
    assert_eq!(n(t1, "prompt_tokens_prefilled"), user_turn_tokens("hi"));
    let generated1 = t1["generated_token_ids"].as_array().unwrap();
    assert_eq!(
        n(t1, "context_tokens"),
        user_turn_tokens("hi") + generated1.len() - 1,
        "the reply's last token waits for the next turn"
    );
    // Turn 2 prefills turn 1's last token, the reply's closing (`\n` after the model's
    // own `<|im_end|>`, else `<|im_end|>\n`) and turn 2's user message: nothing of turn 1.
    let ended = generated1.last().and_then(|v| v.as_u64()) == Some(255);
    let closing = if ended { 1 } else { 2 };
    assert_eq!(
        n(t2, "prompt_tokens_prefilled"),
        1 + closing + user_turn_tokens("how are you"),
        "{t2}"
    );
    let generated2 = t2["generated_token_ids"].as_array().unwrap().len();
    assert_eq!(
        n(t2, "context_tokens"),
        n(t1, "context_tokens") + n(t2, "prompt_tokens_prefilled") + generated2 - 1
    );
    assert!(t2["text"].is_string() && t2["stats"]["decode_tokens_per_second"].is_number());
    // /reset starts over: the same first turn, the same reply (greedy).
    assert_eq!(
        turns[2]["prompt_tokens_prefilled"],
        t1["prompt_tokens_prefilled"]
    );
    assert_eq!(turns[2]["generated_token_ids"], t1["generated_token_ids"]);
    // /system starts over with the system message first.
    let system = 1 + "system\nbe brief".len() + 1 + 1;
    assert_eq!(
        n(&turns[3], "prompt_tokens_prefilled"),
        system + user_turn_tokens("hi")
    );
}

#[test]
fn chat_on_a_full_context_stops_or_drops_the_oldest_turns() {
    let dir = tempfile::tempdir().unwrap();
    let tok = chatml_byte_tokenizer(dir.path());
    // 64 tokens of context: the third turn does not fit.
    let lines = "hi\nhow are you\nand what now\n";
    let base = [
        "--max-new-tokens",
        "6",
        "--json",
        "--threads",
        "1",
        "--temperature",
        "0",
    ];
    let o = chat(&tok, &base, lines);
    assert_fails_with(&o, "context of 64 tokens");
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 2);

    let o = chat(
        &tok,
        &[&base[..], &["--on-full", "drop-oldest"]].concat(),
        lines,
    );
    assert_ok(&o);
    let last: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last["turn"], 3);
    assert!(last["dropped_turns"].as_u64().unwrap() >= 1, "{last}");
    assert!(stderr(&o).contains("dropped"), "{}", stderr(&o));
}

#[test]
fn generate_prints_stats_only_when_asked_and_its_help_has_an_example() {
    let dir = tempfile::tempdir().unwrap();
    let tok = byte_tokenizer(dir.path(), 0).display().to_string();
    let model = tiny_llama();
    let base = [
        "generate",
        "--model",
        &model,
        "--tokenizer",
        &tok,
        "--prompt",
        "hello",
        "--max-new-tokens",
        "4",
    ];
    let o = etch(&base);
    assert_ok(&o);
    assert!(
        !stderr(&o).contains("tok/s"),
        "stats without --stats: {}",
        stderr(&o)
    );
    let o = etch(&[&base[..], &["--stats"]].concat());
    assert_ok(&o);
    let err = stderr(&o);
    assert!(
        err.contains("decode") && err.contains("heap allocations per decoded token"),
        "{err}"
    );

    let o = etch(&["generate", "--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        help.contains("Examples:") && help.contains("etch generate --model"),
        "{help}"
    );
    assert!(
        help.contains("--tokenizer") && help.contains("--chat --prompt"),
        "{help}"
    );
}

/// A `w x h` RGB image whose pixel `(x, y)` is `(x * 3, y * 5, (x + y) * 7)` mod 256.
fn test_image(w: u32, h: u32) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x * 3) as u8, (y * 5) as u8, ((x + y) * 7) as u8])
    })
}

fn write_png(path: &Path, w: u32, h: u32) {
    test_image(w, h).save(path).unwrap();
}

fn read_f32_npy(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    etch_runtime::npy::read_npy(&bytes, "test")
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
}

/// `(rank, index, value, label)` of each `  1. [i] v  label` line after `top N of output 0:`.
fn top_lines(text: &str) -> Vec<(usize, usize, f32, String)> {
    let start = text
        .lines()
        .position(|l| l.starts_with("top ") && l.ends_with(" of output 0:"))
        .unwrap_or_else(|| panic!("no top-k header in {text}"));
    text.lines()
        .skip(start + 1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            let (rank, rest) = l.trim().split_once(". [").expect("rank");
            let (index, rest) = rest.split_once("] ").expect("index");
            let (value, label) = rest.split_once("  ").unwrap_or((rest, ""));
            (
                rank.parse().unwrap(),
                index.parse().unwrap(),
                value.parse().unwrap(),
                label.to_string(),
            )
        })
        .collect()
}

// vision_vit takes f32 [1, 3, 32, 32] and returns f32 [1, 10] (10 classes).
const VISION: &str = "vision_vit.pte";

#[test]
fn run_takes_an_image_and_prints_the_top_k_with_labels() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("img.png");
    write_png(&png, 32, 32);
    let (mean, std) = ([0.485f32, 0.456, 0.406], [0.229f32, 0.224, 0.225]);
    // The same tensor as .npy, built here: (value / 255 - mean) / std, NCHW.
    let mut data = vec![0f32; 3 * 32 * 32];
    for (x, y, px) in test_image(32, 32).enumerate_pixels() {
        for c in 0..3 {
            data[(c * 32 + y as usize) * 32 + x as usize] =
                (f32::from(px.0[c]) / 255.0 - mean[c]) / std[c];
        }
    }
    let npy = dir.path().join("img.npy");
    etch_runtime::npy::write_npy_file(
        &npy,
        &etch_runtime::HostTensor::from_slice(&[1, 3, 32, 32], &data),
    )
    .unwrap();
    let labels = dir.path().join("labels.txt");
    std::fs::write(
        &labels,
        (0..10).map(|i| format!("class{i}\n")).collect::<String>(),
    )
    .unwrap();
    let model = fixture_arg(VISION);
    let (from_png, from_npy) = (dir.path().join("png"), dir.path().join("npy"));
    let o = etch(&[
        "run",
        &model,
        "--input",
        &png.display().to_string(),
        "--mean",
        "0.485,0.456,0.406",
        "--std",
        "0.229,0.224,0.225",
        "--top-k",
        "3",
        "--labels",
        &labels.display().to_string(),
        "--output-dir",
        &from_png.display().to_string(),
        "--json",
    ]);
    let v = json_stdout(&o);
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
    let out0 = &v["calls"][0]["outputs"][0];
    assert_eq!(out0["shape"], serde_json::json!([1, 10]));
    let top = out0["top_k"].as_array().expect("top_k").clone();
    assert_eq!(top.len(), 3);

    // The image input is exactly the tensor built here.
    let o = etch(&[
        "run",
        &model,
        "--input",
        &npy.display().to_string(),
        "--output-dir",
        &from_npy.display().to_string(),
    ]);
    assert_ok(&o);
    assert_eq!(
        std::fs::read(from_png.join("out0.npy")).unwrap(),
        std::fs::read(from_npy.join("out0.npy")).unwrap(),
        "the image input is the hand-built tensor"
    );
    // The top 3 are the 3 largest of out0.npy, largest first, with their labels.
    let logits = read_f32_npy(&from_npy.join("out0.npy"));
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    for (t, &want) in top.iter().zip(&order) {
        let i = t["index"].as_u64().unwrap() as usize;
        assert_eq!(i, want, "{top:?} vs {logits:?}");
        assert_eq!(t["value"].as_f64().unwrap() as f32, logits[i]);
        assert_eq!(t["label"], format!("class{i}"));
    }

    // Text mode, resized from 20x12, with labels.
    let small = dir.path().join("small.png");
    write_png(&small, 20, 12);
    let o = etch(&[
        "run",
        &model,
        "--input",
        &small.display().to_string(),
        "--resize",
        "32",
        "--top-k",
        "4",
        "--labels",
        &labels.display().to_string(),
        "--output-dir",
        &from_png.display().to_string(),
    ]);
    assert_ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("output 0: f32 [1, 10]"), "{text}");
    let lines = top_lines(&text);
    assert_eq!(lines.len(), 4, "{text}");
    let logits = read_f32_npy(&from_png.join("out0.npy"));
    for (n, (rank, index, value, label)) in lines.iter().enumerate() {
        assert_eq!(*rank, n + 1);
        assert_eq!(label, &format!("class{index}"));
        assert!((value - logits[*index]).abs() < 1e-5, "{text}");
    }
    assert!(lines.windows(2).all(|w| w[0].2 >= w[1].2), "{text}");
    // The printed values are rounded to 6 decimals: only a logit clearly above the 4th
    // printed one counts as larger.
    assert!(
        logits.iter().filter(|&&l| l > lines[3].2 + 1e-5).count() <= 3,
        "{text}"
    );

    // A JPEG works too; labels that do not cover the output are a warning.
    let jpg = dir.path().join("img.jpg");
    test_image(40, 40).save(&jpg).unwrap();
    let few = dir.path().join("few.txt");
    std::fs::write(&few, "a\nb\n").unwrap();
    let o = etch(&[
        "run",
        &model,
        "--input",
        &jpg.display().to_string(),
        "--resize",
        "32x32",
        "--top-k",
        "10",
        "--labels",
        &few.display().to_string(),
        "--output-dir",
        &from_png.display().to_string(),
    ]);
    assert_ok(&o);
    assert!(
        stderr(&o).contains("has 2 labels but output 0 has 10 values"),
        "{}",
        stderr(&o)
    );
    let lines = top_lines(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(lines.len(), 10);
    for (_, index, _, label) in &lines {
        let want = ["a", "b"].get(*index).copied().unwrap_or("");
        assert_eq!(label, want);
    }
}

#[test]
fn run_rejects_bad_image_options_and_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("img.png");
    write_png(&png, 32, 32);
    let model = fixture_arg(VISION);
    let png = png.display().to_string();
    let out = dir.path().display().to_string();
    let run = |model: &str, input: &str, extra: &[&str]| {
        let mut args = vec!["run", model, "--input", input, "--output-dir", &out];
        args.extend_from_slice(extra);
        etch(&args)
    };
    // Bad option values are usage errors (exit status 2).
    for (extra, needle) in [
        (&["--mean", "1,2"][..], "three comma-separated values"),
        (&["--std", "1,0,1"], "must not be 0"),
        (&["--resize", "0"], "at least 1"),
        (&["--top-k", "0"], "at least 1"),
        (&["--labels", "l.txt"], "--top-k"),
    ] {
        let o = run(&model, &png, extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{extra:?}: {}", stderr(&o));
    }
    let missing = dir.path().join("missing.png").display().to_string();
    assert_fails_with(&run(&model, &missing, &[]), "cannot read image");
    let junk = dir.path().join("junk.jpg");
    std::fs::write(&junk, b"no image here").unwrap();
    let junk = junk.display().to_string();
    assert_fails_with(&run(&model, &junk, &[]), "cannot decode image");
    // The image's size must be the input's: the error says which --resize.
    let o = run(&model, &png, &["--resize", "16"]);
    assert_fails_with(&o, "use --resize 32");
    let small = dir.path().join("small.png");
    write_png(&small, 8, 4);
    let o = run(&model, &small.display().to_string(), &[]);
    assert_fails_with(&o, "is 4x8 (height x width)");
    // Image inputs need a f32 [1, 3, H, W] input.
    let ints = fixture_arg("embedding.pte");
    assert_fails_with(&run(&ints, &png, &[]), "takes i64 [2, 3]");
    let rank3 = fixture_arg("linear.pte");
    assert_fails_with(&run(&rank3, &png, &[]), "an image becomes a f32");
    // Image options without an image input.
    let npy = dir.path().join("x.npy");
    etch_runtime::npy::write_npy_file(
        &npy,
        &etch_runtime::HostTensor::from_slice(&[1, 3, 32, 32], &[0f32; 3 * 32 * 32]),
    )
    .unwrap();
    let o = run(&model, &npy.display().to_string(), &["--resize", "32"]);
    assert_fails_with(&o, "apply to image inputs");
    let none = dir.path().join("none.txt").display().to_string();
    let o = run(&model, &png, &["--top-k", "1", "--labels", &none]);
    assert_fails_with(&o, "cannot read labels");
}

#[test]
fn run_help_teaches_image_inputs_and_top_k() {
    let o = etch(&["run", "--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "--top-k",
        "--labels",
        "--resize",
        "--mean",
        "--std",
        "--input cat.jpg --resize 224 --mean 0.485,0.456,0.406",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
}

#[test]
fn a_gap_outside_a_minute_is_refused() {
    for gap in ["-1", "60001", "NaN"] {
        let o = etch(&[
            "run",
            &fixture_arg("vision_resnet.pte"),
            "--input",
            &fixture_arg("vision_resnet/call0.in0.npy"),
            &format!("--gap-ms={gap}"),
        ]);
        assert!(!o.status.success(), "--gap-ms {gap}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--gap-ms"), "{gap}: {err}");
    }
}

#[test]
fn repeated_runs_give_the_official_outputs() {
    // ResNet's memory plan reuses the input's buffer once the input is dead: every
    // repetition must start from the given inputs again, not from what the last one left.
    // The repetitions idle a little first (`--gap-ms`), as cold calls do.
    let dir = tempfile::tempdir().unwrap();
    let o = etch(&[
        "run",
        &fixture_arg("vision_resnet.pte"),
        "--input",
        &fixture_arg("vision_resnet/call0.in0.npy"),
        "--repeat",
        "3",
        "--gap-ms",
        "5",
        "--output-dir",
        &dir.path().display().to_string(),
    ]);
    assert_ok(&o);
    let got = read_f32_npy(&dir.path().join("out0.npy"));
    let want = read_f32_npy(&fixture("vision_resnet/call0.out0.npy"));
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-4 * scale, "{g} vs {w}");
    }
}

/// `etch verify` on the bundled fixture made with the official `BundledProgram` API:
/// every test case of both methods passes, a line each and a summary, and `--json`
/// lists them.
#[test]
fn verify_passes_the_bundled_fixture() {
    let bpte = fixture_arg("bundled_two_methods.bpte");
    let o = etch(&["verify", &bpte]);
    assert_ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        text.lines().filter(|l| l.contains(" pass ")).count(),
        5,
        "{text}"
    );
    assert!(text.contains("5 passed, 0 failed"), "{text}");
    let v = json_stdout(&etch(&["verify", &bpte, "--json"]));
    assert_eq!(v["passed"], 5);
    assert_eq!(v["rtol"], 1e-5);
    assert_eq!(v["atol"], 1e-8);
    let cases = v["cases"].as_array().unwrap();
    let methods: Vec<_> = cases
        .iter()
        .map(|c| c["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        ["affine", "affine", "forward", "forward", "forward"]
    );
    assert!(cases.iter().all(|c| c["status"] == "pass"));
}

/// A copy whose expected output is off by 1e-3 in one element fails that case (exit
/// status 1) and passes the others; the same file passes with a looser --atol.
#[test]
fn verify_reports_a_corrupted_expected_output() {
    use etch_format::{BundledProgramFile, BundledValue};
    let path = fixture("bundled_two_methods.bpte");
    let file = BundledProgramFile::read(&path).unwrap();
    let suite = file.suite("forward").unwrap();
    let BundledValue::Tensor(t) = &suite.test_cases[1].expected_outputs[1] else {
        panic!("a tensor output")
    };
    let mut bytes = std::fs::read(&path).unwrap();
    let at = t.data.offset;
    let x = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    bytes[at..at + 4].copy_from_slice(&(x + 1e-3).to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("corrupt.bpte");
    std::fs::write(&bad, &bytes).unwrap();
    let bad = bad.display().to_string();

    let o = etch(&["verify", &bad]);
    assert_fails_with(&o, "1 of 5 test case(s) did not pass");
    let text = String::from_utf8_lossy(&o.stdout);
    let fail: Vec<_> = text.lines().filter(|l| l.contains(" FAIL ")).collect();
    assert_eq!(fail.len(), 1, "{text}");
    assert!(
        fail[0].starts_with("forward") && fail[0].contains("case 1"),
        "{text}"
    );
    assert!(fail[0].contains("output 1"), "{text}");

    let o = etch(&["verify", &bad, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["passed"].as_u64(), v["failed"].as_u64()),
        (Some(4), Some(1))
    );
    let case = &v["cases"][3];
    assert_eq!(
        (case["method"].as_str(), case["index"].as_u64()),
        (Some("forward"), Some(1))
    );
    assert_eq!(case["status"], "fail");
    let err = case["max_abs_error"].as_f64().unwrap();
    assert!((err - 1e-3).abs() < 1e-4, "max abs error {err}");

    assert_ok(&etch(&["verify", &bad, "--atol", "0.01"]));
}

/// `etch run` on the .bpte runs its wrapped program: the same outputs as the plain .pte.
#[test]
fn run_bundled_program_matches_plain_program() {
    let input = |k| fixture_arg(&format!("bundled_two_methods/call0.in{k}.npy"));
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for (file, dir) in [
        ("bundled_two_methods.pte", &a),
        ("bundled_two_methods.bpte", &b),
    ] {
        let out = dir.path().display().to_string();
        let args = [
            "run",
            &fixture_arg(file),
            "--input",
            &input(0),
            "--input",
            &input(1),
        ];
        assert_ok(&etch(&[&args[..], &["--output-dir", &out]].concat()));
    }
    for name in ["out0.npy", "out1.npy"] {
        let x = std::fs::read(a.path().join(name)).unwrap();
        let y = std::fs::read(b.path().join(name)).unwrap();
        assert_eq!(x, y, "{name}");
    }
}

/// Truncated and corrupt .bpte files end in a one-line error, never a panic.
#[test]
fn verify_and_run_reject_corrupt_bundled_programs() {
    let bytes = std::fs::read(fixture("bundled_two_methods.bpte")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.bpte");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let cut = cut.display().to_string();
    assert_fails_with(&etch(&["verify", &cut]), "cut.bpte");
    assert_fails_with(&etch(&["run", &cut]), "cut.bpte");
    assert_fails_with(
        &etch(&["verify", &fixture_arg("bundled_two_methods.pte")]),
        "not a bundled program",
    );
}

/// `two_methods.pte` with the dtype of `other`'s first stored tensor dtype set to
/// ScalarType 9 (unknown to etch), found with the format crate's FlatBuffers reader
/// (field ids of schema/program.fbs: Program.execution_plan 1; ExecutionPlan.name 0,
/// .values 2; EValue.val_type 0; Tensor.scalar_type 0).
fn two_methods_with_other_broken(dir: &Path) -> PathBuf {
    use etch_format::flatbuf::{Buffer, FieldPath};
    let mut bytes = std::fs::read(fixture("two_methods.pte")).unwrap();
    let aligned = etch_memory::SharedBytes::from_vec_aligned(bytes.clone()).unwrap();
    let program_size = etch_format::ProgramFile::from_bytes(aligned)
        .unwrap()
        .program_size();
    let position = {
        let buf = Buffer::new(&bytes[..program_size]);
        let path = FieldPath::Root;
        let plans = buf
            .root(&path)
            .unwrap()
            .tables(1, usize::MAX, &path)
            .unwrap();
        let plan = (0..plans.len())
            .map(|i| plans.get(i, &path).unwrap())
            .find(|p| p.required_string(0, &path).unwrap() == "other")
            .unwrap();
        let values = plan.tables(2, usize::MAX, &path).unwrap();
        (0..values.len())
            .find_map(
                |i| match values.get(i, &path).unwrap().union(0, &path).unwrap() {
                    (5, Some(tensor)) => tensor.field(0, 1, &path).unwrap(),
                    _ => None,
                },
            )
            .unwrap()
    };
    bytes[position] = 9;
    let path = dir.join("two_methods_other_broken.pte");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn inspect_marks_a_method_that_cannot_load_and_the_others_run() {
    let dir = tempfile::tempdir().unwrap();
    let pte = two_methods_with_other_broken(dir.path());
    let pte = pte.display().to_string();

    let o = etch(&["inspect", &pte]);
    assert_ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("2 method(s) (1 not loadable)"), "{text}");
    assert!(text.contains("method forward:"), "{text}");
    assert!(
        text.contains("method other: [not loadable] execution_plan[1].values[0].tensor.scalar_type: unknown ScalarType 9"),
        "{text}"
    );

    let v = json_stdout(&etch(&["inspect", "--json", &pte]));
    let methods = v["methods"].as_array().unwrap();
    assert_eq!(methods.len(), 2);
    assert_eq!(methods[0]["name"], "forward");
    assert_eq!(methods[0]["loadable"], true);
    assert!(methods[0].get("error").is_none());
    assert_eq!(methods[1]["name"], "other");
    assert_eq!(methods[1]["loadable"], false);
    let error = methods[1]["error"].as_str().unwrap();
    assert!(error.contains("unknown ScalarType 9"), "{error}");

    // `forward` runs; `other` fails with an error that names it.
    let input = fixture_arg("two_methods/call0.in0.npy");
    let out = dir.path().join("out").display().to_string();
    let o = etch(&[
        "run",
        &pte,
        "--method",
        "forward",
        "--input",
        &input,
        "--output-dir",
        &out,
    ]);
    assert_ok(&o);
    let o = etch(&["run", &pte, "--method", "other", "--output-dir", &out]);
    assert_fails_with(&o, "method \"other\" cannot be loaded");
}

#[test]
fn bench_measures_concurrent_sessions() {
    let xnn = fixture_arg("tiny_llama_8da4w_xnnpack.pte");
    let o = etch(&[
        "bench", "--model", &xnn, "-p", "6", "-n", "4", "-r", "2", "-t", "1", "-s", "1,3", "--json",
    ]);
    let v = json_stdout(&o);
    let rows = v["sessions_results"].as_array().expect("sessions_results");
    assert_eq!(rows.len(), 2, "{v}");
    for (r, sessions) in rows.iter().zip([1, 3]) {
        assert_eq!(
            (r["threads"].as_u64(), r["sessions"].as_u64()),
            (Some(1), Some(sessions))
        );
        let aggregate = r["aggregate_decode_tokens_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        let per = r["per_session_decode_tokens_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        assert!(aggregate > 0.0 && (per * sessions as f64 - aggregate).abs() < 1e-6 * aggregate);
        assert_eq!(r["aggregate_runs"].as_array().map(Vec::len), Some(2));
    }
    // The markdown table has a row per session count.
    let o = etch(&[
        "bench", "--model", &xnn, "-p", "6", "-n", "4", "-r", "1", "-t", "1", "-s", "2",
    ]);
    assert_ok(&o);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("| 1 | 2 |") && table.contains("aggregate t/s"),
        "{table}"
    );
    // A session count of 0 is refused.
    let o = etch(&["bench", "--model", &xnn, "-s", "0"]);
    assert!(!o.status.success());
}

/// `--profile` shows the time of the nodes inside an XNNPACK delegate, by kind.
#[test]
fn run_profile_shows_the_nodes_inside_delegates() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture_arg("xnn_q8_mobilenet_v2.pte");
    let input = fixture_arg("xnn_q8_mobilenet_v2/call0.in0.npy");
    let out = dir.path().display().to_string();
    let args = [
        "run",
        &model,
        "--input",
        &input,
        "--output-dir",
        &out,
        "--repeat",
        "2",
    ];
    let j = json_stdout(&etch(&[&args[..], &["--profile", "--json"]].concat()));
    let nodes = j["profile_delegate_nodes"]
        .as_array()
        .expect("profile_delegate_nodes");
    let runs = |node: &str| {
        nodes
            .iter()
            .find(|n| n["node"] == node && n["backend"] == "XnnpackBackend")
            .and_then(|n| n["runs"].as_u64())
    };
    // Two calls of the program's int8 convolutions and its one input quantization.
    assert!(
        runs("Conv2d qs8").is_some_and(|r| r > 0 && r % 2 == 0),
        "{nodes:?}"
    );
    assert!(
        runs("DepthwiseConv2d qs8").is_some_and(|r| r > 0 && r % 2 == 0),
        "{nodes:?}"
    );
    assert_eq!(runs("Convert qs8"), Some(2), "{nodes:?}");
    // Every ReLU6 after a convolution is folded into it at load (exact for int8).
    assert_eq!(runs("Clamp qs8"), None, "{nodes:?}");
    let text = etch(&[&args[..], &["--profile"]].concat());
    assert_ok(&text);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("inside delegates: node"), "{text}");
    assert!(text.contains("XnnpackBackend: Conv2d qs8"), "{text}");
}
