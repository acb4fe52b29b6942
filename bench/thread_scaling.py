#!/usr/bin/env python3
"""How each step of a vision program scales from 1 to 2 threads in one etch build.

Runs `etch run FILE --input INPUT --repeat 30 --threads T --profile --json` for T = 1
and T = 2 in turn, `ROUNDS` times, and prints each step's minimum time per call over the
rounds at each thread count and their ratio (the speed-up), then the sums and the
whole profile's minimum per thread count.

    bench/thread_scaling.py target/release/etch mobilenet_v2 8
"""
import json
import subprocess
import sys
from pathlib import Path

VISION = Path(__file__).resolve().parent.parent / "models" / "vision"
THREADS = (1, 2)


def steps(binary, model, threads):
    """(operator, ms per call) of each step."""
    out = subprocess.run(
        [binary, "run", str(VISION / f"{model}_portable.pte"), "--input",
         str(VISION / f"{model}_input.npy"), "--repeat", "30", "--threads", str(threads),
         "--json", "--profile"], capture_output=True, text=True, check=True).stdout
    return [(s["operator"], s["ms"] / s["calls"]) for s in json.loads(out)["profile_steps"]]


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    binary, model, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    runs = {t: [] for t in THREADS}
    for _ in range(rounds):
        for t in THREADS:
            runs[t].append(steps(binary, model, t))
    names = [n for n, _ in runs[THREADS[0]][0]]
    mins = {t: [min(r[i][1] for r in runs[t]) for i in range(len(names))] for t in THREADS}
    print("| step | operator | 1 thread ms | 2 threads ms | speed-up |\n|---:|---|---:|---:|---:|")
    for i, name in enumerate(names):
        one, two = mins[1][i], mins[2][i]
        print(f"| {i} | {name} | {one:.3f} | {two:.3f} | {one / max(two, 1e-9):.2f} |")
    totals = {t: sum(mins[t]) for t in THREADS}
    print(f"| | sum of minima | {totals[1]:.3f} | {totals[2]:.3f} | {totals[1] / totals[2]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
