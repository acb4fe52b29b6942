#!/usr/bin/env python3
"""A load test of `etch serve` over loopback (issue #55, item 1): `--clients` concurrent
clients send `--requests` chat requests of mixed lengths, streamed and not, over
`--sessions` named sessions (ids beyond the server's capacity included, so some are
refused with 429), anonymous requests, and a few prompts longer than the context (400).

Checks: every request gets a complete, well-formed answer (a finish reason, content, and
for streams a `[DONE]`) or a documented error (429 capacity_exhausted, 400 for a prompt
too long); none hangs (`--request-timeout`); and the greedy anonymous requests, sent
again one at a time after the load, give the same text (the server decodes concurrent
turns in shared batched steps; each must get what it gets alone).

Reports requests/s, p50/p95/p99 time to first token (streams) and per-token latency,
the errors by kind, the batched-step counters of `/metrics` and the server's peak RSS;
`--json` prints one object. Bounded in requests and in time (`--max-seconds`).

    python3 bench/serve_load.py --model models/smollm2-135m-instruct/model_8da4w.pte \\
        --tokenizer models/smollm2-135m-instruct/tokenizer.json [--threads 2] [--json]
"""
import argparse
import concurrent.futures as cf
import http.client
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_client import etch_serve_process, proc_status_bytes, server_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORDS = (ROOT / "bench" / "prompt_text.txt").read_text().split()


def words(rng, n):
    """`n` words of the prompt text from a random place in it."""
    start = rng.randrange(len(WORDS))
    return " ".join(WORDS[(start + j) % len(WORDS)] for j in range(n))


def chat_body(rng, messages):
    """A chat body of the mix: a short or longer reply, streamed or not, greedy or
    sampled."""
    body = {"messages": messages, "max_tokens": rng.choice([4, 16, 32, 64]),
            "stream": rng.random() < 0.5}
    if rng.random() < 0.7:
        body["temperature"] = 0
    else:
        body.update(temperature=0.8, seed=rng.randrange(1 << 30))
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    return body


def make_requests(n, sessions, seed):
    """The request mix: (session id or None, body, kind) per request."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.02:
            kind, length = "too_long", 3000
        else:
            kind, length = "normal", rng.choice([3, 10, 40, 120, 300])
        body = chat_body(rng, [{"role": "user", "content": words(rng, length)}])
        # Named sessions s0.. (two more ids than the server holds: those meet 429), or none.
        session = f"s{rng.randrange(sessions + 2)}" if rng.random() < 0.6 else None
        if session is not None:
            body["session_id"] = session
        out.append((i, session, body, kind))
    return out


def send(port, body, timeout):
    """One request: returns a result dict (status, text, timings, well-formedness)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200 or not body.get("stream"):
            raw = r.read()
            t1 = time.perf_counter()
            answer = json.loads(raw)
            if r.status != 200:
                return {"status": r.status, "code": answer.get("error", {}).get("code"),
                        "ok_shape": "message" in answer.get("error", {}), "total": t1 - t0}
            choice = answer["choices"][0]
            return {"status": 200, "text": choice["message"]["content"] or "",
                    "finish": choice.get("finish_reason"), "tokens": answer["usage"]["completion_tokens"],
                    "ok_shape": choice.get("finish_reason") in ("stop", "length"), "total": t1 - t0}
        text, first, last, finish, tokens, done = [], None, None, None, None, False
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    text.append(piece)
                    first = first if first is not None else now
                    last = now
                finish = c.get("finish_reason") or finish
        t1 = time.perf_counter()
        return {"status": 200, "text": "".join(text), "finish": finish, "tokens": tokens,
                "ttft": (first - t0) if first is not None else None,
                "per_token": ((last - first) / (tokens - 1)) if first is not None and tokens and tokens > 1 else None,
                "ok_shape": done and finish in ("stop", "length"), "total": t1 - t0}
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        return {"status": None, "error": f"{type(e).__name__}: {e}", "ok_shape": False,
                "total": time.perf_counter() - t0}
    finally:
        conn.close()


def percentile(xs, p):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--etch", default=str(ROOT / "target" / "release" / "etch"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--sessions", type=int, default=8, help="named sessions the server holds")
    ap.add_argument("--replay", type=int, default=40, help="greedy anonymous requests sent again alone")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    plan = make_requests(a.requests, a.sessions, a.seed)
    extra = ["--max-sessions", str(a.sessions + 1)]
    with etch_serve_process(a.etch, a.model, a.tokenizer, a.threads, extra) as (port, server):
        started = time.perf_counter()
        results = {}
        with cf.ThreadPoolExecutor(a.clients) as pool:
            futures = {}
            for i, session, body, kind in plan:
                futures[pool.submit(
                    lambda b=body: None if time.perf_counter() - started > a.max_seconds
                    else send(port, b, a.request_timeout))] = (i, session, body, kind)
            for f in cf.as_completed(futures):
                results[futures[f][0]] = (futures[f], f.result())
        elapsed = time.perf_counter() - started
        m = server_metrics(port)
        batched_steps = m.get("etch_batched_decode_steps_total")
        batched_tokens = m.get("etch_batched_decode_tokens_total")
        # The greedy anonymous requests again, one at a time, on the now idle server.
        greedy = [(meta, r) for meta, r in results.values()
                  if r and r["status"] == 200 and meta[1] is None and meta[2].get("temperature") == 0]
        mismatches = []
        for (i, _, body, _), r in greedy[: a.replay]:
            alone = send(port, body, a.request_timeout)
            if alone.get("text") != r.get("text"):
                mismatches.append({"request": i, "under_load": r.get("text"), "alone": alone.get("text")})
        rss = proc_status_bytes(server.pid, "VmHWM")
        health_conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        health_conn.request("GET", "/health")
        health = health_conn.getresponse().status

    done = [r for _, r in results.values() if r is not None]
    by_kind = {}
    problems = []
    for (i, session, body, kind), r in results.values():
        if r is None:
            by_kind["not sent (time bound)"] = by_kind.get("not sent (time bound)", 0) + 1
            continue
        key = "ok" if r["status"] == 200 else f"{r['status']} {r.get('code') or r.get('error', '')}"
        by_kind[key] = by_kind.get(key, 0) + 1
        documented = (r["status"] == 429 and r.get("code") == "capacity_exhausted") or (
            r["status"] == 400 and kind == "too_long")
        if r["status"] == 200 and not r["ok_shape"]:
            problems.append(f"request {i}: malformed answer {r}")
        elif r["status"] != 200 and not (documented and r["ok_shape"]):
            problems.append(f"request {i} ({kind}, session {session}): {r}")
    ok = [r for r in done if r["status"] == 200]
    report = {
        "requests": len(plan), "answered": len(done), "clients": a.clients, "threads": a.threads,
        "seconds": round(elapsed, 1), "requests_per_second": round(len(done) / elapsed, 2),
        "completion_tokens": sum(r.get("tokens") or 0 for r in ok),
        "ttft_ms": {p: (lambda v: v and round(v * 1e3, 1))(percentile([r.get("ttft") for r in ok], p)) for p in (50, 95, 99)},
        "per_token_ms": {p: (lambda v: v and round(v * 1e3, 2))(percentile([r.get("per_token") for r in ok], p)) for p in (50, 95, 99)},
        "slowest_request_s": round(max((r["total"] for r in done), default=0), 1),
        "outcomes": by_kind, "problems": problems[:20], "problem_count": len(problems),
        "replayed_alone": min(len(greedy), a.replay), "replay_mismatches": mismatches[:5],
        "batched_decode_steps": batched_steps, "batched_decode_tokens": batched_tokens,
        "server_peak_rss_mib": rss and round(rss / 2**20, 1), "health_after": health,
    }
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        for k, v in report.items():
            print(f"{k}: {v}")
    sys.exit(1 if problems or mismatches or health != 200 or len(done) < len(plan) else 0)


if __name__ == "__main__":
    main()
