#!/usr/bin/env python3
"""Time to first token of a resumed turn against the same conversation sent cold.

    bench/serve_resume.py --model M.pte --tokenizer tokenizer.json [-t 2] [-r 5]
        [--etch target/release/etch]

Starts `etch serve` on a loopback port. Each round: a first turn in a fresh named session
(a long user message), then the second turn of that conversation (the first reply sent
back as returned, then a short question) twice -- in the session, where it resumes warm,
and without a session, where the whole conversation is prefilled -- timing each to its
first content chunk. Greedy, streamed. Prints medians and the prompt tokens reused
(`usage.prompt_tokens_details.cached_tokens`). Loopback only; the server is stopped.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG = ("Here are my notes on the history of the city, please keep them in mind. " * 24).strip()


def chat(port, messages, session=None, max_tokens=16):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if session:
        body["session_id"] = session
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    first, text, usage = None, [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            piece = c.get("delta", {}).get("content")
            if piece:
                first = first or time.perf_counter()
                text.append(piece)
    conn.close()
    return (first or time.perf_counter()) - start, "".join(text), usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--etch", default=os.path.join(ROOT, "target/release/etch"))
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [args.etch, "serve", "--model", args.model, "--tokenizer", args.tokenizer, "--host",
         "127.0.0.1", "--port", str(port), "--threads", str(args.threads)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            sys.exit("etch serve did not come up")
        warm, cold, reused, prompt = [], [], [], []
        for i in range(args.rounds):
            first = [{"role": "user", "content": LONG}]
            _, reply, _ = chat(port, first, session=f"s{i}")
            second = first + [{"role": "assistant", "content": reply},
                              {"role": "user", "content": "And in one word?"}]
            t_warm, _, u = chat(port, second, session=f"s{i}")
            t_cold, _, uc = chat(port, second)
            warm.append(t_warm * 1e3)
            cold.append(t_cold * 1e3)
            reused.append(u["prompt_tokens_details"]["cached_tokens"])
            prompt.append(u["prompt_tokens"])
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("DELETE", f"/v1/sessions/s{i}")
            c.getresponse().read()
    finally:
        server.terminate()
        server.wait(timeout=20)
    print(f"second turn: {statistics.median(prompt)} prompt tokens, "
          f"{statistics.median(reused)} reused in the session")
    print(f"time to first token, resumed  {statistics.median(warm):7.1f} ms  "
          f"(runs: {', '.join(f'{x:.0f}' for x in warm)})")
    print(f"time to first token, cold     {statistics.median(cold):7.1f} ms  "
          f"(runs: {', '.join(f'{x:.0f}' for x in cold)})")


if __name__ == "__main__":
    main()
