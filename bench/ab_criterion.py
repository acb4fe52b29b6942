#!/usr/bin/env python3
"""Two builds of a criterion bench binary, alternating: which kernels a change moved.

Runs `BIN --bench --warm-up-time 0.5 --measurement-time 1.5 --noplot FILTER` for build
A and build B in turn, `ROUNDS` times (the order alternating from round to round), and
prints, per benchmark, the median over rounds of each build's point estimate and their
ratio. On a machine whose speed drifts, the alternation puts the drift on both builds.

    cargo bench -p etch-linalg --bench conv_gemm --no-run   # prints the binary's path
    bench/ab_criterion.py /tmp/conv_gemm-before target/release/deps/conv_gemm-HASH \\
        'pointwise_14x14.*in_pass_t2' [ROUNDS]
"""
import re
import statistics
import subprocess
import sys

UNITS = {"ns": 1e-3, "µs": 1.0, "ms": 1e3}


def run(binary, pattern):
    """{benchmark name: point estimate in µs} of one run of `binary`."""
    out = subprocess.run(
        [binary, "--bench", "--warm-up-time", "0.5", "--measurement-time", "1.5",
         "--noplot", pattern],
        capture_output=True, text=True, check=True).stdout
    times, name = {}, None
    for line in out.splitlines():
        if line and not line[0].isspace() and not line.startswith("Benchmarking"):
            name = line.split()[0]
        t = re.search(r"time:\s+\[\S+ \S+ ([0-9.]+) (ns|µs|ms)", line)
        if t and name:
            times[name] = float(t.group(1)) * UNITS[t.group(2)]
    return times


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    a, b, pattern = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    found = {}
    for r in range(rounds):
        for binary in (a, b) if r % 2 == 0 else (b, a):
            for name, t in run(binary, pattern).items():
                found.setdefault(name, {}).setdefault(binary, []).append(t)
    print(f"| benchmark | A µs | B µs | B / A | rounds |\n|---|---:|---:|---:|---:|")
    for name, by in found.items():
        if a in by and b in by:
            ma, mb = statistics.median(by[a]), statistics.median(by[b])
            print(f"| {name} | {ma:.1f} | {mb:.1f} | {mb / ma:.3f} | {len(by[a])} |")


if __name__ == "__main__":
    main()
