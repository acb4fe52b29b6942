#!/usr/bin/env python3
"""Two builds of etch on the vision programs, interleaved: is a change within noise?

Runs `etch run FILE --input INPUT --repeat R --threads T --json` for build A and build
B in turn, --pairs times per model and thread count (the order alternating from pair
to pair), and prints, per model and thread count, the median call time of each build
and the median over pairs of each pair's ratio B / A with its interquartile range. On
a shared machine whose speed drifts, the paired ratio is the figure to trust.

Build the older side in a worktree first, for example:

    git worktree add /tmp/before <rev>
    CARGO_TARGET_DIR=/tmp/before/target cargo build --release -p etch-cli --manifest-path /tmp/before/Cargo.toml
    cargo build --release -p etch-cli
    bench/ab_vision.py /tmp/before/target/release/etch target/release/etch --pairs 15
"""
import argparse
import json
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402

VISION = Path(__file__).resolve().parent.parent / "models" / "vision"


def median_ms(etch: str, model: str, threads: int, repeat: int) -> float:
    """The median call time of one `etch run` process."""
    cmd = [etch, "run", str(VISION / f"{model}_portable.pte"),
           "--input", str(VISION / f"{model}_input.npy"),
           "--repeat", str(repeat), "--threads", str(threads), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["calls"][0]["median_ms"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("etch_a", help="the etch binary of build A (before)")
    ap.add_argument("etch_b", help="the etch binary of build B (after)")
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet18"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=10, help="calls per process")
    args = ap.parse_args()

    rows = []
    for model in args.models:
        for t in args.threads:
            a_ms, b_ms, ratios = [], [], []
            for p in range(args.pairs):
                print(f"{model}, {t} thread(s), pair {p + 1}/{args.pairs}", file=sys.stderr)
                sides = [("A", args.etch_a), ("B", args.etch_b)]
                if p % 2:
                    sides.reverse()
                got = {side: median_ms(etch, model, t, args.repeat) for side, etch in sides}
                a_ms.append(got["A"])
                b_ms.append(got["B"])
                ratios.append(got["B"] / got["A"])
            q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
            rows.append(f"| {model} | {t} | {statistics.median(a_ms):.2f} | "
                        f"{statistics.median(b_ms):.2f} | {statistics.median(ratios):.3f} "
                        f"({q[0]:.3f}-{q[2]:.3f}) |")

    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Date: {now}; CPU: {cpu_model()}; {args.pairs} interleaved pairs of processes, "
          f"{args.repeat} calls each; A = {args.etch_a}, B = {args.etch_b}.")
    print()
    print("| model | threads | A ms | B ms | B / A (IQR) |")
    print("|---|---|---:|---:|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
