#!/usr/bin/env python3
"""Two builds of etch on one LLM file, interleaved: is a change within noise?

Runs `etch generate --prompt-token-ids <128 fixed ids> --max-new-tokens 64 --ignore-eos
--json --threads T` (a command every etch build since the first runner has) for build A
and build B in turn, --runs times per thread count, each in a fresh process, and prints
the medians of prefill and decode tok/s and the ratio B / A as a Markdown table.

Build the older side in a worktree first, for example:

    git worktree add /tmp/before <rev>
    CARGO_TARGET_DIR=/tmp/before/target cargo build --release -p etch-cli --manifest-path /tmp/before/Cargo.toml
    cargo build --release -p etch-cli
    bench/ab_etch.py /tmp/before/target/release/etch target/release/etch \\
        --model models/smollm2-135m-instruct/model.pte --runs 5
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402
from prompt_ids import prompt_ids  # noqa: E402


def one_run(etch: str, model: Path, tokenizer: Path, ids: str, new_tokens: int, threads: int) -> dict:
    cmd = [etch, "generate", "--model", str(model), "--tokenizer", str(tokenizer),
           "--prompt-token-ids", ids, "--max-new-tokens", str(new_tokens), "--ignore-eos",
           "--json", "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["stats"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("etch_a", help="the etch binary of build A (before)")
    ap.add_argument("etch_b", help="the etch binary of build B (after)")
    ap.add_argument("--model", type=Path, required=True, help="the .pte both builds run")
    ap.add_argument("--tokenizer", type=Path, help="default: tokenizer.json beside the model")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of rest between runs")
    args = ap.parse_args()
    tokenizer = args.tokenizer or args.model.parent / "tokenizer.json"
    ids = ",".join(map(str, prompt_ids(args.prompt_tokens)))

    results: dict = {}
    for r in range(args.runs):
        for t in args.threads:
            for side, etch in (("A", args.etch_a), ("B", args.etch_b)):
                print(f"run {r + 1}/{args.runs}, {t} thread(s), build {side}", file=sys.stderr)
                s = one_run(etch, args.model, tokenizer, ids, args.new_tokens, t)
                results.setdefault((t, side), []).append(s)
                time.sleep(args.settle)

    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Date: {now}; CPU: {cpu_model()}; medians of {args.runs} interleaved runs; "
          f"prompt {args.prompt_tokens} tokens, {args.new_tokens} decoded; file {args.model.name}.")
    print()
    print("| threads | A prefill tok/s | B prefill tok/s | B / A | A decode tok/s | B decode tok/s | B / A |")
    print("|---|---|---|---|---|---|---|")
    for t in args.threads:
        med = {}
        for side in ("A", "B"):
            runs = results[(t, side)]
            med[side] = (statistics.median(s["prefill_tokens_per_second"] for s in runs),
                         statistics.median(s["decode_tokens_per_second"] for s in runs))
        (pa, da), (pb, db) = med["A"], med["B"]
        print(f"| {t} | {pa:.1f} | {pb:.1f} | {pb / pa:.2f}x | {da:.1f} | {db:.1f} | {db / da:.2f}x |")


if __name__ == "__main__":
    main()
