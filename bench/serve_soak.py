#!/usr/bin/env python3
"""A long run of `etch serve` (issue #55, item 4): the load mix of `serve_load.py` for
`--seconds` (default an hour), with session churn, sampled every `--every` seconds.

`--clients` clients loop until the time is up. Each picks, per round:
- an anonymous chat request of mixed length, streamed or not, greedy or sampled, now
  and then a prompt longer than the context (400);
- a conversation in a named session (ids beyond the server's capacity included, so some
  meet 429): 1-4 turns, each resuming the last (warm), then a reset, a close, or
  nothing (the session is left open for a later round, as agent harnesses do);
- now and then a streamed request abandoned after its first piece (the client
  disconnects; the server must cancel the turn).

Every `--every` seconds a sampler records the server's resident memory (VmRSS, VmHWM)
and `/metrics`: the temp allocators' cached bytes, planned bytes, sessions open and
loaded, and the counters. JSON lines go to `--out`; a summary to stdout (`--json`: one
object). At the end every named session is closed and the named-session gauge must be
back at 0, `/health` must answer 200, and greedy requests sent again alone must give the
text they gave under load.

Exit status 1 when a request got a malformed answer or an undocumented error, when
resident memory grew by more than `--rss-growth` (default 5%) from the peak of a window
right after the warm-up (`--warmup` seconds) to the peak of the last window (each a
quarter of the time after the warm-up, at most 10 minutes; RSS dips when sessions close), when a session's temp cache went over its budget,
or when a check at the end failed.

    python3 bench/serve_soak.py --model models/smollm2-135m-instruct/model_8da4w.pte \\
        --tokenizer models/smollm2-135m-instruct/tokenizer.json [--seconds 3600]
"""
import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_client import etch_serve_process, proc_status_bytes, server_metrics  # noqa: E402
from serve_load import chat_body, send, words  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def call(port, method, path, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def abandon(port, body, timeout):
    """A streamed request dropped after its first bytes of content."""
    body = dict(body, stream=True)
    data = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + data)
        seen = b""
        while b"data: " not in seen:
            chunk = sock.recv(4096)
            if not chunk:
                break
            seen += chunk
    return {"status": int(seen[9:12] or 0) if seen.startswith(b"HTTP/1.1") else None}


class Tally:
    """What the clients saw, under a lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes = {}
        self.problems = []
        self.greedy = []
        self.tokens = 0
        self.ops = {"reset": 0, "close": 0, "abandoned": 0}

    def add(self, kind, session, body, r):
        with self.lock:
            key = "ok" if r["status"] == 200 else f"{r['status']} {r.get('code') or r.get('error', '')}"
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
            documented = (r["status"] == 429 and r.get("code") == "capacity_exhausted") or (
                r["status"] == 400 and kind == "too_long")
            if r["status"] == 200 and not r["ok_shape"]:
                self.problems.append(f"malformed answer {r}")
            elif r["status"] != 200 and not (documented and r["ok_shape"]):
                self.problems.append(f"{kind} request, session {session}: {r}")
            if r["status"] == 200:
                self.tokens += r.get("tokens") or 0
                if session is None and body.get("temperature") == 0 and len(self.greedy) < 200:
                    self.greedy.append((body, r.get("text")))


def client(port, seed, deadline, sessions, tally, timeout):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        roll = rng.random()
        if roll < 0.03:
            body = chat_body(rng, [{"role": "user", "content": words(rng, 40)}])
            body["max_tokens"] = 400
            abandon(port, body, timeout)
            with tally.lock:
                tally.ops["abandoned"] += 1
        elif roll < 0.40:
            too_long = rng.random() < 0.03
            n = 3000 if too_long else rng.choice([3, 10, 40, 120, 300])
            body = chat_body(rng, [{"role": "user", "content": words(rng, n)}])
            tally.add("too_long" if too_long else "normal", None, body, send(port, body, timeout))
        else:
            session = f"soak{rng.randrange(sessions + 2)}"
            messages = []
            for _ in range(rng.randint(1, 4)):
                messages.append({"role": "user", "content": words(rng, rng.choice([3, 10, 40]))})
                body = chat_body(rng, messages)
                body["session_id"] = session
                r = send(port, body, timeout)
                tally.add("normal", session, body, r)
                if r["status"] != 200:
                    break
                messages.append({"role": "assistant", "content": r.get("text") or ""})
            end = rng.random()
            if end < 0.3:
                status, _ = call(port, "POST", f"/v1/sessions/{session}/reset", timeout)
                with tally.lock:
                    tally.ops["reset"] += 1
            elif end < 0.6:
                status, _ = call(port, "DELETE", f"/v1/sessions/{session}", timeout)
                with tally.lock:
                    tally.ops["close"] += 1
            else:
                status = 200
            if status not in (200, 404):
                with tally.lock:
                    tally.problems.append(f"session op on {session}: status {status}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--etch", default=str(ROOT / "target" / "release" / "etch"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--sessions", type=int, default=8, help="named sessions the server holds")
    ap.add_argument("--seconds", type=float, default=3600.0)
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=600.0, help="seconds before memory must be flat")
    ap.add_argument("--rss-growth", type=float, default=0.05)
    ap.add_argument("--temp-cache-budget", type=int, default=16 << 20,
                    help="bytes each session's temp allocator may cache (etch's default)")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--replay", type=int, default=20)
    ap.add_argument("--out", help="JSON lines of the samples (default: not kept)")
    ap.add_argument("--log", help="the server's stderr (default: discarded)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    log = open(a.log, "wb") if a.log else open("/dev/null", "wb")
    out = open(a.out, "w") if a.out else None
    tally = Tally()
    samples = []
    extra = ["--max-sessions", str(a.sessions + 1)]
    with etch_serve_process(a.etch, a.model, a.tokenizer, a.threads, extra, log) as (port, server):
        started = time.monotonic()
        deadline = started + a.seconds
        clients = [threading.Thread(target=client, daemon=True,
                                    args=(port, a.seed * 1000 + c, deadline, a.sessions, tally,
                                          a.request_timeout))
                   for c in range(a.clients)]
        for t in clients:
            t.start()

        def sample():
            m = server_metrics(port)
            s = {"seconds": round(time.monotonic() - started, 1),
                 "rss_bytes": proc_status_bytes(server.pid, "VmRSS"),
                 "peak_rss_bytes": proc_status_bytes(server.pid, "VmHWM"),
                 **{k[len("etch_"):]: v for k, v in m.items()}}
            samples.append(s)
            if out:
                out.write(json.dumps(s) + "\n")
                out.flush()
            print(f"soak: {s['seconds']:7.0f} s  rss {s['rss_bytes'] / 2**20:7.1f} MiB  "
                  f"temp cache {s['temp_cached_bytes'] / 2**20:5.1f} MiB  "
                  f"sessions {s['sessions_in_use']:.0f} named / {s['sessions_loaded']:.0f} loaded  "
                  f"tokens {s['completion_tokens_total']:.0f}", file=sys.stderr, flush=True)

        sample()
        while any(t.is_alive() for t in clients):
            next_at = started + len(samples) * a.every
            while time.monotonic() < next_at and any(t.is_alive() for t in clients):
                time.sleep(0.5)
            sample()
        for t in clients:
            t.join(a.request_timeout)
        # Close every named session; the gauge must come back to 0.
        for i in range(a.sessions + 2):
            call(port, "DELETE", f"/v1/sessions/soak{i}")
        time.sleep(0.5)
        sample()
        final = samples[-1]
        mismatches = []
        for body, text in tally.greedy[: a.replay]:
            alone = send(port, body, a.request_timeout)
            if alone.get("text") != text:
                mismatches.append({"under_load": text, "alone": alone.get("text")})
        health, _ = call(port, "GET", "/health")

    warm = next((s for s in samples if s["seconds"] >= a.warmup), samples[0])
    after = [s for s in samples if s["seconds"] >= warm["seconds"]]
    mib = lambda b: round(b / 2**20, 1)
    # Resident memory dips whenever sessions close, so a single sample is no baseline:
    # the highest RSS of a window right after the warm-up against the highest of the
    # last window (each a quarter of the time after the warm-up, at most 10 minutes).
    # The final sample, taken after every session was closed, is left out.
    running = after[:-1] or after
    window = min(600.0, (running[-1]["seconds"] - warm["seconds"]) / 4)
    first_peak = max(s["rss_bytes"] for s in running if s["seconds"] <= warm["seconds"] + window)
    last_peak = max(s["rss_bytes"] for s in running if s["seconds"] >= running[-1]["seconds"] - window)
    rss_growth = last_peak - first_peak
    temp_growth = max(s["temp_cached_bytes"] for s in after) - warm["temp_cached_bytes"]
    checks = {
        "no malformed answers or undocumented errors": not tally.problems,
        f"RSS after warm-up within {a.rss_growth:.0%}": rss_growth <= a.rss_growth * first_peak,
        "temp cache within its budget per session": all(
            s["temp_cached_bytes"] <= s["sessions_loaded"] * a.temp_cache_budget for s in samples),
        "named sessions back to 0": final["sessions_in_use"] == 0,
        "health 200 at the end": health == 200,
        "greedy requests alone give the same text": not mismatches,
    }
    report = {
        "seconds": a.seconds, "clients": a.clients, "threads": a.threads, "samples": len(samples),
        "completion_tokens": final["completion_tokens_total"], "requests": final["requests_total"],
        "requests_failed": final["requests_failed_total"],
        "requests_cancelled": final["requests_cancelled_total"],
        "sessions_opened": final["sessions_opened_total"], "sessions_closed": final["sessions_closed_total"],
        "client_ops": tally.ops, "outcomes": tally.outcomes,
        "rss_mib": {"start": mib(samples[0]["rss_bytes"]), "warm": mib(warm["rss_bytes"]),
                    "peak_first_window": mib(first_peak), "peak_last_window": mib(last_peak),
                    "window_seconds": round(window),
                    "max_after_warm": mib(max(s["rss_bytes"] for s in after)),
                    "end": mib(final["rss_bytes"]), "peak": mib(final["peak_rss_bytes"])},
        "temp_cached_mib": {"warm": mib(warm["temp_cached_bytes"]), "growth_after_warm": mib(temp_growth),
                            "max": mib(max(s["temp_cached_bytes"] for s in samples)),
                            "end": mib(final["temp_cached_bytes"])},
        "planned_mib_max": mib(max(s["planned_bytes"] for s in samples)),
        "replayed_alone": min(len(tally.greedy), a.replay), "replay_mismatches": mismatches[:5],
        "problems": tally.problems[:20], "problem_count": len(tally.problems),
        "checks": checks,
    }
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        for k, v in report.items():
            print(f"{k}: {v}")
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
