#!/usr/bin/env python3
"""What streaming through `etch serve` costs against `etch bench` on the same model.

    bench/serve_overhead.py --model M.pte --tokenizer tokenizer.json [-p 128] [-n 128]
        [-r 5] [-t 2] [--etch target/release/etch]

Interleaves, round by round: `etch bench -p P -n N -r 1 -t T --json` (decode tok/s of the
runner alone), and one streamed `/v1/completions` request of the same P prompt tokens and N
generated tokens (`ignore_eos`, greedy) to an `etch serve --threads T` started once on a
loopback port. The server's rate is measured by the client: generated tokens after the
first, over the time from the first content chunk to the last (so HTTP, SSE and JSON per
token are in it). Prints medians and the overhead, `--json` for machines. Loopback only;
the server is stopped at the end.
"""
import argparse
import json
import os
import random
import statistics
import subprocess

from serve_client import etch_serve, stream

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_once(args):
    out = subprocess.run(
        [args.etch, "bench", "--model", args.model, "-p", str(args.prompt), "-n", str(args.new),
         "-r", "1", "-t", str(args.threads), "--json"],
        check=True, capture_output=True, text=True, timeout=600).stdout
    report = json.loads(out)
    return report["results"][0]["decode_tokens_per_second"]


def stream_once(port, ids, new):
    body = {"prompt": ids, "max_tokens": new, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    first = last = usage = None
    for now, chunk in stream(port, "/v1/completions", body):
        usage = chunk.get("usage") or usage
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            first = first or now
            last = now
    return (usage["completion_tokens"] - 1) / (last - first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("-p", "--prompt", type=int, default=128)
    ap.add_argument("-n", "--new", type=int, default=128)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--etch", default=os.path.join(ROOT, "target/release/etch"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with etch_serve(args.etch, args.model, args.tokenizer, args.threads) as port:
        rng = random.Random(1)
        ids = [rng.randrange(1000, 20000) for _ in range(args.prompt)]
        stream_once(port, ids, 8)  # warm-up
        bench, served = [], []
        for _ in range(args.rounds):
            bench.append(bench_once(args))
            served.append(stream_once(port, ids, args.new))
    b, s = statistics.median(bench), statistics.median(served)
    result = {
        "model": args.model, "prompt_tokens": args.prompt, "new_tokens": args.new,
        "threads": args.threads, "rounds": args.rounds,
        "bench_decode_tokens_per_second": bench, "served_decode_tokens_per_second": served,
        "bench_median": b, "served_median": s, "overhead_percent": 100.0 * (b - s) / b,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"etch bench decode  {b:8.1f} tok/s  (runs: {', '.join(f'{x:.1f}' for x in bench)})")
        print(f"etch serve stream  {s:8.1f} tok/s  (runs: {', '.join(f'{x:.1f}' for x in served)})")
        print(f"streaming overhead {result['overhead_percent']:+.2f}% of decode time")


if __name__ == "__main__":
    main()
