//! `etch serve` over loopback on the tiny llama: chat, streaming, sessions with warm
//! resume, capacity, errors in OpenAI's envelope, a client that disconnects mid-stream.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use etch_serve::http::{ServeOptions, serve_on};
use serde_json::{Value, json};

struct Server {
    addr: SocketAddr,
    _dir: common::TokenizerDir,
}

/// Starts a server on a free loopback port (it lives as long as the test process).
fn start(name: &str, max_sessions: usize, api_key: Option<&str>) -> Server {
    let dir = common::TokenizerDir::new(&format!("http-{name}"));
    let engine = common::engine_for(&common::tiny_llama_chat(), &dir.tokenizer(), max_sessions);
    let options = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        model_id: "tiny".into(),
        api_key: api_key.map(str::to_string),
        chat_template: None,
        tokenizer: dir.tokenizer(),
        log_prompts: false,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let _ = runtime.block_on(serve_on(listener, engine, options));
    });
    Server { addr, _dir: dir }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build()
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POSTs JSON; returns the status and the body as JSON.
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(agent().post(&self.url(path)), body)
    }

    fn send(&self, request: ureq::Request, body: &Value) -> (u16, Value) {
        match request.send_json(body.clone()) {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
            Err(e) => panic!("request failed: {e}"),
        }
    }

    fn get(&self, path: &str) -> (u16, String) {
        match agent().get(&self.url(path)).call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => panic!("request failed: {e}"),
        }
    }
}

fn chat(messages: Value, extra: Value) -> Value {
    let mut body = json!({"messages": messages, "temperature": 0, "max_tokens": 8});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn content(answer: &Value) -> String {
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn chat_streaming_and_completions() {
    let s = start("basic", 3, None);
    assert_eq!(s.get("/health"), (200, r#"{"status":"ok"}"#.into()));
    let (status, models) = s.get("/v1/models");
    assert_eq!(status, 200);
    assert!(models.contains("\"tiny\""));

    let hi = json!([{"role": "user", "content": "Hi there"}]);
    let (status, answer) = s.post("/v1/chat/completions", &chat(hi.clone(), json!({})));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["choices"][0]["message"]["role"], "assistant");
    let usage = &answer["usage"];
    assert_eq!(usage["completion_tokens"], 8);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + 8)
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "length");

    let body = chat(
        hi,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let text = agent()
        .post(&s.url("/v1/chat/completions"))
        .send_json(body)
        .unwrap()
        .into_string()
        .unwrap();
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content(&answer), "greedy: streamed = whole");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 8);

    let (status, completion) = s.post(
        "/v1/completions",
        &json!({"prompt": "Once", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["object"], "text_completion");
    assert_eq!(completion["usage"]["prompt_tokens"], 4);

    let (_, metrics) = s.get("/metrics");
    assert!(metrics.contains("etch_requests_total 3"), "{metrics}");
}

#[test]
fn sessions_resume_warm_and_run_out() {
    let s = start("sessions", 3, None);
    let first = json!([{"role": "user", "content": "Hello"}]);
    let (_, a1) = s.post(
        "/v1/chat/completions",
        &chat(first.clone(), json!({"session_id": "A"})),
    );
    assert_eq!(a1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = json!([
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": content(&a1)},
        {"role": "user", "content": "And then?"},
    ]);
    let (_, a2) = s.send(
        agent()
            .post(&s.url("/v1/chat/completions"))
            .set("X-ExecuTorch-Session-ID", "A"),
        &chat(second.clone(), json!({})),
    );
    let reused = a2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        reused,
        a1["usage"]["total_tokens"].as_u64().unwrap(),
        "the second turn reuses the first's prompt and reply"
    );
    // The same prompt again does not extend the session (it holds the second reply
    // too): prefilled from the start, it gives the same reply as the warm turn.
    let (_, again) = s.post(
        "/v1/chat/completions",
        &chat(second, json!({"session_id": "A"})),
    );
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(content(&again), content(&a2));

    // B is unaffected by A.
    let (_, b1) = s.post(
        "/v1/chat/completions",
        &chat(first.clone(), json!({"session_id": "B"})),
    );
    assert_eq!(content(&b1), content(&a1));

    // Two named sessions is all: a third is refused until one is closed.
    let (status, err) = s.post(
        "/v1/chat/completions",
        &chat(first.clone(), json!({"session_id": "C"})),
    );
    assert_eq!(status, 429, "{err}");
    assert_eq!(err["error"]["code"], "capacity_exhausted");
    assert!(err["error"]["message"].is_string() && err["error"]["type"].is_string());
    let closed = agent().delete(&s.url("/v1/sessions/A")).call().unwrap();
    assert_eq!(closed.into_json::<Value>().unwrap()["closed"], true);
    let (status, _) = s.post(
        "/v1/chat/completions",
        &chat(first, json!({"session_id": "C"})),
    );
    assert_eq!(status, 200);
    let reset = agent().post(&s.url("/v1/sessions/C/reset")).call().unwrap();
    assert_eq!(reset.into_json::<Value>().unwrap()["reset"], true);
}

#[test]
fn bad_requests_get_openai_errors() {
    let s = start("errors", 2, Some("sekret"));
    let hi = json!([{"role": "user", "content": "Hi"}]);
    // /health needs no key; everything else does.
    assert_eq!(s.get("/health").0, 200);
    let (status, e) = s.post("/v1/chat/completions", &chat(hi.clone(), json!({})));
    assert_eq!(
        (status, e["error"]["code"].clone()),
        (401, json!("invalid_api_key"))
    );
    let with_key = |path: &str| {
        agent()
            .post(&s.url(path))
            .set("Authorization", "Bearer sekret")
    };
    let long = "x".repeat(600);
    for (body, code) in [
        (chat(hi.clone(), json!({"n": 2})), "unsupported_parameter"),
        (chat(hi.clone(), json!({"temperature": 5})), "invalid_value"),
        (
            chat(hi.clone(), json!({"session_id": "has space"})),
            "invalid_session_id",
        ),
        (
            chat(json!([{"role": "user", "content": long}]), json!({})),
            "context_length_exceeded",
        ),
        (
            chat(hi.clone(), json!({"max_tokens": 100000})),
            "context_length_exceeded",
        ),
    ] {
        let (status, e) = s.send(with_key("/v1/chat/completions"), &body);
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["error"]["code"], code, "{body}");
    }
    let (status, e) = s.send(with_key("/v1/chat/completions"), &json!({"messages": "no"}));
    assert_eq!(status, 400, "{e}");
    for prompt in [json!([1, 99999]), json!({"text": "x"}), json!("")] {
        let (status, e) = s.send(
            with_key("/v1/completions"),
            &json!({"prompt": prompt, "max_tokens": 2}),
        );
        assert_eq!(status, 400, "{prompt}: {e}");
        assert!(e["error"]["message"].is_string(), "{e}");
    }
    let (status, _) = s.send(with_key("/v1/chat/completions"), &chat(hi, json!({})));
    assert_eq!(status, 200);
}

#[test]
fn a_client_that_disconnects_mid_stream_cancels_its_turn() {
    let s = start("disconnect", 2, None);
    let hi = json!([{"role": "user", "content": "Tell me everything"}]);
    let (_, before) = s.post("/v1/chat/completions", &chat(hi.clone(), json!({})));
    let body = chat(hi.clone(), json!({"stream": true, "max_tokens": 400})).to_string();
    let mut socket = TcpStream::connect(s.addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read until the first generated piece has arrived: the turn is decoding.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&seen).matches("data: ").count() < 3 {
        let n = socket.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    drop(socket);
    // The server is still healthy and gives the same answer as before.
    assert_eq!(s.get("/health").0, 200);
    let (status, after) = s.post("/v1/chat/completions", &chat(hi, json!({})));
    assert_eq!(status, 200);
    assert_eq!(content(&after), content(&before));
    // The abandoned turn was cancelled, not run to its 400 tokens.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, metrics) = s.get("/metrics");
        if metrics.contains("etch_requests_cancelled_total 1") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Mutated request bodies and worker lines give errors, never panics (a small,
/// deterministic stand-in for the fuzz targets `serve_request` and `worker_line`).
#[test]
fn mutated_bodies_and_worker_lines_never_panic() {
    use etch_llm::{ChatTemplate, JinjaChatTemplate};
    let template = JinjaChatTemplate::builtin(ChatTemplate::ChatMl);
    let seeds = [
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stop": ["x"], "session_id": "a", "tools": [{"type": "function", "function": {"name": "f"}}]}).to_string(),
        json!({"messages": [{"role": "assistant", "content": "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}], "stream": true, "stream_options": {"include_usage": true}}).to_string(),
        r#"{"max_new_tokens": 4, "prompt_segments": [{"text": "a"}, {"ids": [1, 2]}], "session_id": "s", "cancel_request_id": 3, "stop": ["z"]}"#.to_string(),
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..3000 {
        let mut bytes = seeds[i % seeds.len()].clone().into_bytes();
        for _ in 0..1 + next() % 4 {
            let at = (next() % bytes.len() as u64) as usize;
            match next() % 3 {
                0 => bytes[at] = (next() % 256) as u8,
                1 => {
                    bytes.remove(at);
                }
                _ => bytes.insert(at, b"{}[]\":,0a\\"[(next() % 10) as usize]),
            }
        }
        let _ = etch_serve::http::check_chat_body(&bytes, &template);
        if let Ok(line) = std::str::from_utf8(&bytes) {
            let _ = etch_serve::worker::parse(line);
        }
    }
}

/// Continuous batching: greedy requests sent together, decoded in shared steps, get the
/// answers they get sent one at a time.
#[test]
fn concurrent_requests_get_what_they_get_alone() {
    let s = start("batched", 5, None);
    let bodies: Vec<Value> = ["Hello", "What is two and two?", "Tell me a story", "Hi"]
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let mut body = chat(
                json!([{"role": "user", "content": text}]),
                json!({"session_id": format!("s{i}")}),
            );
            body["max_tokens"] = json!(24);
            body
        })
        .collect();
    let alone: Vec<String> = bodies
        .iter()
        .map(|b| content(&s.post("/v1/chat/completions", b).1))
        .collect();
    for round in 0..2 {
        let together: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = bodies
                .iter()
                .map(|b| scope.spawn(|| content(&s.post("/v1/chat/completions", b).1)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(together, alone, "round {round}");
    }
    let (_, metrics) = s.get("/metrics");
    let batched = metrics
        .lines()
        .find_map(|l| l.strip_prefix("etch_batched_decode_steps_total "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(batched > 0.0, "no decode step was batched:\n{metrics}");
}

/// A close or reset from one client while another client's turn runs in that session
/// waits for the turn: the turn ends whole (not cancelled), then the operation acts.
#[test]
fn a_close_waits_for_the_turn_running_in_its_session() {
    let s = start("close-waits", 3, None);
    let hi = json!([{"role": "user", "content": "Tell me everything"}]);
    let long = chat(hi.clone(), json!({"max_tokens": 300, "session_id": "A"}));
    let (_, alone) = s.post("/v1/chat/completions", &long);
    assert_eq!(alone["usage"]["completion_tokens"], 300);
    let closed = agent().delete(&s.url("/v1/sessions/A")).call().unwrap();
    assert_eq!(closed.into_json::<Value>().unwrap()["closed"], true);

    for op in ["close", "reset"] {
        let url = s.url("/v1/chat/completions");
        let body = long.clone();
        let turn = std::thread::spawn(move || match agent().post(&url).send_json(body) {
            Ok(r) => (r.status(), r.into_json::<Value>().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
            Err(e) => panic!("request failed: {e}"),
        });
        // Wait until the turn is running (the session is open), then act on it.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !s.get("/metrics").1.contains("etch_sessions_in_use 1") {
            assert!(
                std::time::Instant::now() < deadline,
                "the turn never started"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let acted = if op == "close" {
            agent().delete(&s.url("/v1/sessions/A")).call()
        } else {
            agent().post(&s.url("/v1/sessions/A/reset")).call()
        };
        let acted: Value = acted.unwrap().into_json().unwrap();
        let (status, answer) = turn.join().unwrap();
        assert_eq!(status, 200, "{op}: {answer}");
        assert_eq!(answer["usage"]["completion_tokens"], 300, "{op}");
        assert_eq!(content(&answer), content(&alone), "{op}");
        assert_eq!(acted[if op == "close" { "closed" } else { "reset" }], true);
        if op == "reset" {
            let closed = agent().delete(&s.url("/v1/sessions/A")).call().unwrap();
            assert_eq!(closed.into_json::<Value>().unwrap()["closed"], true);
        }
    }
    assert!(s.get("/metrics").1.contains("etch_sessions_in_use 0"));
    assert!(
        s.get("/metrics")
            .1
            .contains("etch_requests_cancelled_total 0")
    );
}
