#!/usr/bin/env python3
"""Where etch's portable vision program loses to the official runtime's XNNPACK delegate,
layer by layer, by minima (for a noisy machine).

Takes the per-layer minimum over `--rounds` etch processes (`etch run --profile`, each
the mean of 20 calls) and the minimum over 3 official ETDump runs of each XNNPACK
operator's median (layers aligned as in `vision_layers.py`), then prints both totals and
the layers with the largest gap, etch minus XNNPACK.

    tools/fixtures/.venv/bin/python bench/vision_gaps.py [--threads 2] [--rounds 6]
        [--model mobilenet_v2] [--etch target/release/etch] [--most 25]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vision_layers as layers  # noqa: E402
from machine import cpu_model  # noqa: E402


def minima(runs):
    """Per-layer minimum over several runs of (name, ms) lists in one order."""
    best = None
    for run in runs:
        best = run if best is None else [(a[0], min(a[1], b[1])) for a, b in zip(best, run)]
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--most", type=int, default=25)
    ap.add_argument("--etch", default=str(layers.ROOT / "target" / "release" / "etch"))
    args = ap.parse_args()
    theirs = minima(layers.official_layers(args.model, args.threads, 40) for _ in range(3))
    ours = minima(layers.etch_layers(args.etch, args.model, args.threads, 20)
                  for _ in range(args.rounds))
    if len(theirs) != len(ours):
        print(f"the layers do not line up: {len(theirs)} XNNPACK operators, {len(ours)} etch "
              "instructions", file=sys.stderr)
        return 1
    rows = [(i, t[0], t[1], o[1]) for i, (t, o) in enumerate(zip(theirs, ours))]
    print(f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {cpu_model()}; "
          f"{args.model}, {args.threads} thread(s).")
    print(f"sum: XNNPACK {sum(r[2] for r in rows):.3f} ms, etch {sum(r[3] for r in rows):.3f} ms")
    for i, name, x, e in sorted(rows, key=lambda r: r[2] - r[3])[:args.most]:
        print(f"{i:3d} {name[:36]:36s} XNNPACK {x:.3f} etch {e:.3f} gap {(e - x) * 1000:+.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
