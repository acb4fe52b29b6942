#!/usr/bin/env python3
"""Two etch builds on a vision program, step by step and whole calls, by minima.

Runs build A and build B in turn (the order alternating), `ROUNDS` times: each time one
`etch run ... --profile --json` process (per-step times) and one plain `--json` process
(the whole call's median over 20 calls). Prints each step whose minimum over the rounds
moved by more than 5% between the builds, the sums of the per-step minima, and the
whole-call minimum and median of each build. On a machine whose speed drifts (a shared
VM), a minimum is what additive noise cannot lower, so it moves less than a median.

    bench/ab_minima.py /tmp/etch-before target/release/etch mobilenet_v2 2 10
"""
import json
import statistics
import subprocess
import sys
from pathlib import Path

VISION = Path(__file__).resolve().parent.parent / "models" / "vision"


def run(binary, model, threads, profile):
    """Per-step ms per call with `profile`, else the whole call's median ms."""
    cmd = [binary, "run", str(VISION / f"{model}_portable.pte"),
           "--input", str(VISION / f"{model}_input.npy"), "--repeat", "20",
           "--threads", threads, "--json"] + (["--profile"] if profile else [])
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    if profile:
        return [s["ms"] / s["calls"] for s in out["profile_steps"]]
    return out["calls"][0]["median_ms"]


def main():
    if len(sys.argv) < 6:
        print(__doc__, file=sys.stderr)
        return 2
    builds = {"A": sys.argv[1], "B": sys.argv[2]}
    model, threads, rounds = sys.argv[3], sys.argv[4], int(sys.argv[5])
    a, b = "A", "B"
    steps = {a: [], b: []}
    whole = {a: [], b: []}
    for r in range(rounds):
        for x in (a, b) if r % 2 == 0 else (b, a):
            steps[x].append(run(builds[x], model, threads, True))
            whole[x].append(run(builds[x], model, threads, False))
    n = len(steps[a][0])
    mins = {x: [min(s[i] for s in steps[x]) for i in range(n)] for x in (a, b)}
    print("| step | A min ms | B min ms | B / A |\n|---:|---:|---:|---:|")
    for i in range(n):
        ma, mb = mins[a][i], mins[b][i]
        if ma > 0.015 and abs(mb / ma - 1) > 0.05:
            print(f"| {i} | {ma:.3f} | {mb:.3f} | {mb / ma:.3f} |")
    sa, sb = sum(mins[a]), sum(mins[b])
    print(f"\nsum of per-step minima: A {sa:.3f} ms, B {sb:.3f} ms, B / A {sb / sa:.3f}")
    wa, wb = min(whole[a]), min(whole[b])
    print(f"whole call, minimum: A {wa:.3f} ms, B {wb:.3f} ms, B / A {wb / wa:.3f}")
    print(f"whole call, median: A {statistics.median(whole[a]):.3f} ms, "
          f"B {statistics.median(whole[b]):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
