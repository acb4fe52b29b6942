#!/usr/bin/env python3
"""Two etch builds, step by step: which layers of a vision program a change moved.

Runs `etch run FILE --input INPUT --repeat 40 --threads T --profile --json` for build A
and build B in turn, `ROUNDS` times (the order alternating), and prints each step's
median time per call over the rounds for both builds and their ratio, then the sum.

    bench/ab_steps.py /tmp/etch-before target/release/etch mobilenet_v2 1 8
"""
import json
import statistics
import subprocess
import sys
from pathlib import Path

VISION = Path(__file__).resolve().parent.parent / "models" / "vision"


def steps(binary, model, threads):
    """(operator, milliseconds per call) of each step, in program order."""
    out = subprocess.run(
        [binary, "run", str(VISION / f"{model}_portable.pte"),
         "--input", str(VISION / f"{model}_input.npy"), "--repeat", "40",
         "--threads", threads, "--profile", "--json"],
        capture_output=True, text=True, check=True).stdout
    return [(s["operator"], s["ms"] / s["calls"]) for s in json.loads(out)["profile_steps"]]


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    a, b, model, threads, rounds = sys.argv[1:4] + [sys.argv[4], int(sys.argv[5])]
    runs = {a: [], b: []}
    for r in range(rounds):
        for binary in (a, b) if r % 2 == 0 else (b, a):
            runs[binary].append(steps(binary, model, threads))
    print("| step | operator | A ms | B ms | B / A |\n|---:|---|---:|---:|---:|")
    total_a = total_b = 0.0
    for i in range(len(runs[a][0])):
        ma = statistics.median(run[i][1] for run in runs[a])
        mb = statistics.median(run[i][1] for run in runs[b])
        total_a, total_b = total_a + ma, total_b + mb
        print(f"| {i} | {runs[a][0][i][0]} | {ma:.3f} | {mb:.3f} | {mb / ma:.3f} |")
    print(f"| all | | {total_a:.3f} | {total_b:.3f} | {total_b / total_a:.3f} |")


if __name__ == "__main__":
    main()
