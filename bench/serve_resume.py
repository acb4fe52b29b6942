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
import os
import statistics
import time

from serve_client import etch_serve, stream

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG = ("Here are my notes on the history of the city, please keep them in mind. " * 24).strip()


def chat(port, messages, session=None, max_tokens=16):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if session:
        body["session_id"] = session
    start = time.perf_counter()
    first, text, usage = None, [], None
    for now, chunk in stream(port, "/v1/chat/completions", body):
        usage = chunk.get("usage") or usage
        for c in chunk.get("choices", []):
            piece = c.get("delta", {}).get("content")
            if piece:
                first = first or now
                text.append(piece)
    return (first or time.perf_counter()) - start, "".join(text), usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--etch", default=os.path.join(ROOT, "target/release/etch"))
    args = ap.parse_args()
    with etch_serve(args.etch, args.model, args.tokenizer, args.threads) as port:
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
    print(f"second turn: {statistics.median(prompt)} prompt tokens, "
          f"{statistics.median(reused)} reused in the session")
    print(f"time to first token, resumed  {statistics.median(warm):7.1f} ms  "
          f"(runs: {', '.join(f'{x:.0f}' for x in warm)})")
    print(f"time to first token, cold     {statistics.median(cold):7.1f} ms  "
          f"(runs: {', '.join(f'{x:.0f}' for x in cold)})")


if __name__ == "__main__":
    main()
