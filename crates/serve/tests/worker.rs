//! The worker protocol end to end on the tiny llama: ready line, generate, sessions
//! with warm resume, capacity, cancellation, errors that keep the worker serving.

mod common;

use etch_serve::worker::{CancelBook, Worker};
use serde_json::Value;

/// Runs the worker over `input` lines; returns every output line as JSON.
fn session(max_sessions: usize, book: CancelBook, input: &str) -> Vec<Value> {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = common::TokenizerDir::new(&format!("worker{run}"));
    let mut engine = common::engine(&dir.tokenizer(), max_sessions);
    let mut out = Vec::new();
    Worker::new(&mut engine, &mut out, book, true)
        .serve(input.as_bytes())
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

/// The replies to each request: the lines up to each terminal line.
fn replies(lines: &[Value]) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    for line in &lines[1..] {
        current.push(line.clone());
        if line.get("token").is_none() {
            out.push(std::mem::take(&mut current));
        }
    }
    assert!(current.is_empty(), "a request without a terminal line");
    out
}

fn text_of(reply: &[Value]) -> String {
    reply
        .iter()
        .filter_map(|l| l.get("token").and_then(Value::as_str))
        .collect()
}

#[test]
fn ready_then_generate_with_warm_resume_in_a_named_session() {
    let first = r#"{"max_new_tokens": 6, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "stop": [], "prompt": "Hello", "session_id": "a"}"#;
    let lines = session(3, CancelBook::default(), &format!("{first}\n"));
    assert_eq!(
        lines[0],
        serde_json::json!({"ready": true, "max_sessions": 3, "max_named_sessions": 2, "supports_cancel": true})
    );
    let r = replies(&lines);
    let done = r[0].last().unwrap();
    assert_eq!(done["done"], true);
    assert_eq!(done["prompt_tokens"], 5);
    assert_eq!(done["completion_tokens"], 6);
    assert_eq!(done["finish_reason"], "length");
    assert_eq!(done["session_reset_reason"], "new");
    let ids: Vec<u64> = serde_json::from_value(done["generated_token_ids"].clone()).unwrap();
    assert_eq!(ids.len(), 6);

    // The official server's second turn: text, the first reply as ids, more text.
    let second = format!(
        r#"{{"max_new_tokens": 4, "stop": [], "prompt_segments": [{{"text": "Hello"}}, {{"ids": {ids:?}}}, {{"text": " more"}}], "session_id": "a"}}"#
    );
    let lines = session(3, CancelBook::default(), &format!("{first}\n{second}\n"));
    let r = replies(&lines);
    let done = r[1].last().unwrap();
    assert_eq!(done["session_reset_reason"], "exact_prefix");
    assert_eq!(done["reused_prompt_tokens"], 11);
    assert_eq!(done["prefilled_prompt_tokens"], 5);
    assert_eq!(done["prompt_tokens"], 16);
    for key in [
        "prefill_ms",
        "decode_ms",
        "total_ms",
        "prefill_tok_s",
        "decode_tok_s",
    ] {
        assert!(done[key].is_number(), "{key}");
    }
    assert!(done.get("cancelled").is_none());
}

#[test]
fn ops_capacity_and_errors_keep_the_worker_serving() {
    let input = [
        r#"{"op": "open", "session_id": "a"}"#,
        r#"{"op": "open", "session_id": "a"}"#,
        r#"{"op": "open", "session_id": "b"}"#,
        r#"{"max_new_tokens": 1, "prompt": "x", "session_id": "b"}"#,
        r#"{"op": "reset", "session_id": "zzz"}"#,
        r#"{"op": "close", "session_id": "a"}"#,
        r#"{"op": "open", "session_id": "b"}"#,
        "not json",
        "",
        r#"{"prompt": ""}"#,
        r#"{"prompt": "x", "top_p": 2}"#,
        r#"{"prompt_segments": [{"ids": [9999]}], "max_new_tokens": 1}"#,
        r#"{"prompt": "still here", "max_new_tokens": 2}"#,
    ]
    .join("\n");
    let lines = session(2, CancelBook::default(), &input);
    let r = replies(&lines);
    let last = |i: usize| r[i].last().unwrap().clone();
    assert_eq!(
        last(0),
        serde_json::json!({"opened": true, "session_id": "a"})
    );
    assert_eq!(
        last(1),
        serde_json::json!({"opened": true, "session_id": "a"})
    );
    assert_eq!(
        last(2),
        serde_json::json!({"error": "cannot open session", "code": "capacity_exhausted", "session_id": "b"})
    );
    assert_eq!(last(3)["code"], "capacity_exhausted");
    assert_eq!(
        last(4),
        serde_json::json!({"reset": true, "session_id": "zzz"})
    );
    assert_eq!(
        last(5),
        serde_json::json!({"closed": true, "session_id": "a"})
    );
    assert_eq!(
        last(6),
        serde_json::json!({"opened": true, "session_id": "b"})
    );
    assert!(
        last(7)["error"]
            .as_str()
            .unwrap()
            .starts_with("invalid JSON")
    );
    assert_eq!(last(8)["error"], "empty prompt");
    assert_eq!(last(9)["error"], "top_p must be finite and in (0, 1]");
    assert!(last(10)["error"].as_str().unwrap().contains("9999"));
    assert_eq!(last(11)["done"], true);
    assert_eq!(r.len(), 12);

    let single = session(
        1,
        CancelBook::default(),
        r#"{"op": "open", "session_id": "a"}"#,
    );
    assert_eq!(single[0]["max_named_sessions"], 0);
    assert_eq!(single[1]["code"], "unsupported_session");
}

#[test]
fn an_early_cancel_frame_ends_its_request_and_stale_ids_are_refused() {
    // The frame reaches the worker before its request line (the server reserves the id
    // first); a frame for another id while nothing runs would be dropped at activation.
    let book = CancelBook::default();
    book.on_frame(1);
    let input = [
        r#"{"max_new_tokens": 30, "prompt": "two", "session_id": "s", "cancel_request_id": 1}"#,
        r#"{"max_new_tokens": 3, "prompt": "two", "session_id": "s", "cancel_request_id": 2}"#,
        r#"{"max_new_tokens": 3, "prompt": "late", "cancel_request_id": 1}"#,
    ]
    .join("\n");
    let lines = session(2, book, &input);
    let r = replies(&lines);
    let cancelled = r[0].last().unwrap();
    assert_eq!(cancelled["cancelled"], true);
    assert_eq!(cancelled["finish_reason"], "stop");
    assert_eq!(cancelled["completion_tokens"], 0);
    assert!(cancelled.get("generated_token_ids").is_none());
    assert_eq!(r[1].last().unwrap()["session_reset_reason"], "dirty");
    assert_eq!(r[1].last().unwrap()["finish_reason"], "length");
    assert_eq!(
        r[2].last().unwrap()["error"],
        "cancel_request_id is stale or duplicate"
    );
}

#[test]
fn streamed_pieces_are_whole_text_and_stop_strings_cut_the_turn() {
    let plain = session(
        1,
        CancelBook::default(),
        r#"{"max_new_tokens": 24, "prompt": "abc"}"#,
    );
    let text = text_of(&replies(&plain)[0]);
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 6, "{text:?}");
    let stop: String = chars[4..6].iter().collect();
    let at = text.find(&stop).unwrap();
    let line = serde_json::json!({"max_new_tokens": 24, "prompt": "abc", "stop": [stop]});
    let cut = session(1, CancelBook::default(), &line.to_string());
    let r = replies(&cut);
    assert_eq!(text_of(&r[0]), text[..at]);
    assert_eq!(r[0].last().unwrap()["finish_reason"], "stop");
    assert!(r[0].last().unwrap().get("generated_token_ids").is_none());
}

/// Output that calls `hook` at the start of each line with the number of lines already
/// written (a cancel frame arriving while the worker streams, or a fault mid-turn).
struct Hooked<F: FnMut(usize)> {
    out: Vec<u8>,
    lines: usize,
    at_line_start: bool,
    hook: F,
}

impl<F: FnMut(usize)> Hooked<F> {
    fn new(hook: F) -> Self {
        Self {
            out: Vec::new(),
            lines: 0,
            at_line_start: true,
            hook,
        }
    }
}

impl<F: FnMut(usize)> std::io::Write for Hooked<F> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.at_line_start && !buf.is_empty() {
            (self.hook)(self.lines);
            self.at_line_start = false;
        }
        self.out.extend_from_slice(buf);
        let newlines = buf.iter().filter(|&&b| b == b'\n').count();
        self.lines += newlines;
        if buf.last() == Some(&b'\n') {
            self.at_line_start = true;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs the worker over `input` with a hooked output; every line must be protocol JSON.
fn hooked_session(
    max_sessions: usize,
    book: CancelBook,
    input: &str,
    hook: impl FnMut(usize),
) -> Vec<Value> {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = common::TokenizerDir::new(&format!("hooked{run}"));
    let mut engine = common::engine(&dir.tokenizer(), max_sessions);
    let mut out = Hooked::new(hook);
    Worker::new(&mut engine, &mut out, book, true)
        .serve(input.as_bytes())
        .unwrap();
    let text = String::from_utf8(out.out).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

const LONG: &str =
    r#"{"max_new_tokens": 40, "prompt": "abc", "session_id": "s", "cancel_request_id": ID}"#;

fn long(id: u64) -> String {
    LONG.replace("ID", &id.to_string())
}

#[test]
fn cancel_frames_late_twice_and_for_finished_requests() {
    // Uncancelled, for reference: 40 tokens.
    let plain = session(2, CancelBook::default(), &long(1));
    let whole = text_of(&replies(&plain)[0]);
    assert_eq!(replies(&plain)[0].last().unwrap()["completion_tokens"], 40);

    // Late: the frame for the running request arrives after its third piece, twice,
    // with a frame for some other id between (dropped). The request ends at its next
    // step, cancelled, its pieces a prefix of the whole reply. Then a frame for the
    // finished request (stale) arrives: it cancels nothing, and the next request, with
    // a newer id, runs to its end in the dirty session, started over.
    let book = CancelBook::default();
    let frames = book.clone();
    let input = [long(1), long(2)].join("\n");
    let lines = hooked_session(2, book, &input, move |line| match line {
        // Line 0 is the ready line; 1.. are request 1's pieces.
        4 => {
            frames.on_frame(1);
            frames.on_frame(7);
            frames.on_frame(1);
        }
        _ => {
            if line > 4 {
                frames.on_frame(1);
            }
        }
    });
    let r = replies(&lines);
    assert_eq!(r.len(), 2);
    let cut = r[0].last().unwrap();
    assert_eq!(cut["cancelled"], true, "{cut}");
    assert_eq!(cut["finish_reason"], "stop");
    let cut_text = text_of(&r[0]);
    assert!(
        (3..40).contains(&r[0].len().saturating_sub(1)),
        "{} pieces",
        r[0].len() - 1
    );
    assert!(whole.starts_with(&cut_text), "{cut_text:?} vs {whole:?}");
    let next = r[1].last().unwrap();
    assert!(next.get("cancelled").is_none(), "{next}");
    assert_eq!(next["completion_tokens"], 40);
    assert_eq!(next["session_reset_reason"], "dirty");
    assert_eq!(text_of(&r[1]), whole);

    // Early and twice: both frames for request 3 arrive before it; it is cancelled
    // before its first piece, once. A frame for a finished id (2) and one for a later
    // id (9) while nothing runs do not touch request 4.
    let book = CancelBook::default();
    book.on_frame(3);
    book.on_frame(3);
    let frames = book.clone();
    let input = [long(3), long(4)].join("\n");
    let lines = hooked_session(2, book, &input, move |line| {
        if line == 2 {
            frames.on_frame(2);
            frames.on_frame(3);
        }
    });
    let r = replies(&lines);
    assert_eq!(r[0].last().unwrap()["cancelled"], true);
    assert_eq!(r[0].last().unwrap()["completion_tokens"], 0);
    assert_eq!(r[1].last().unwrap()["completion_tokens"], 40);
    assert_eq!(text_of(&r[1]), whole);
}

#[test]
fn a_panic_mid_turn_is_an_error_line_and_the_session_serves_again() {
    let plain = session(2, CancelBook::default(), &long(1));
    let whole = text_of(&replies(&plain)[0]);
    // Writing the fifth line (request 1's fourth piece) panics before a byte of it is
    // written: the worker catches it, answers with an error line, and goes on.
    let mut armed = true;
    let input = [long(1), long(2)].join("\n");
    let lines = hooked_session(2, CancelBook::default(), &input, move |line| {
        if line == 4 && std::mem::take(&mut armed) {
            panic!("injected fault");
        }
    });
    let r = replies(&lines);
    assert_eq!(r.len(), 2, "{lines:?}");
    assert_eq!(r[0].len(), 4, "three pieces, then the error: {:?}", r[0]);
    assert_eq!(
        r[0].last().unwrap()["error"],
        "internal error: injected fault"
    );
    // The session the fault left mid-turn starts over, with the whole reply.
    let next = r[1].last().unwrap();
    assert_eq!(next["done"], true, "{next}");
    assert_eq!(next["completion_tokens"], 40);
    assert_ne!(next["session_reset_reason"], "exact_prefix");
    assert_eq!(text_of(&r[1]), whole);
}
