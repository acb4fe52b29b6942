#!/usr/bin/env python3
"""etch on the portable (non-delegated) vision programs against the official
ExecuTorch runtime on the XNNPACK-delegated ones, timed call by call in one process
(issue #16's 0.8x bar).

Both runtimes live in this process: the official one through `executorch.runtime`, etch
through its Python binding. Each pair of calls runs one forward of each, the order
alternating from pair to pair, so that a shared machine's drift (other tenants, clock
changes) falls on both alike; the figure is the median over pairs of each pair's
ratio. `bench/vision_compare.py` times each runtime in its own process instead.

Needs the fixtures venv (executorch, torch) with the etch wheel on the path:

    tools/fixtures/.venv/bin/python -m pip install 'maturin>=1.5,<2'
    (cd bindings/python && ../../tools/fixtures/.venv/bin/maturin build --release \
        --out /tmp/etch-wheels --interpreter ../../tools/fixtures/.venv/bin/python)
    tools/fixtures/.venv/bin/python -m pip install --target /tmp/etch-py /tmp/etch-wheels/etch-*.whl
    PYTHONPATH=/tmp/etch-py tools/fixtures/.venv/bin/python bench/vision_paired.py [--pairs 40]
        [--threads 1 2] [--models mobilenet_v2 resnet18]

Prints a markdown table on stdout, progress on stderr.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_model

ROOT = Path(__file__).resolve().parent.parent
VISION = ROOT / "models" / "vision"


def paired(model: str, threads: int, pairs: int, warmup: int, gap_ms: float) -> str:
    """One model at one thread count; returns a table row."""
    import etch
    import numpy as np
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    portable_lib._unsafe_reset_threadpool(threads)
    x = np.load(VISION / f"{model}_input.npy")
    xt = torch.from_numpy(x)
    ours = etch.load(str(VISION / f"{model}_portable.pte"), threads=threads).method("forward")
    theirs = Runtime.get().load_program(str(VISION / f"{model}_xnnpack.pte")).load_method("forward")
    want = np.load(VISION / f"{model}_portable_output.npy")
    got = np.asarray(ours.execute([x])[0])
    err = float(np.abs(got - want).max() / np.abs(want).max())

    def etch_call() -> float:
        time.sleep(gap_ms / 1e3)
        t0 = time.perf_counter()
        ours.execute([x])
        return (time.perf_counter() - t0) * 1e3

    def official_call() -> float:
        time.sleep(gap_ms / 1e3)
        t0 = time.perf_counter()
        theirs.execute([xt])
        return (time.perf_counter() - t0) * 1e3

    for _ in range(warmup):
        etch_call()
        official_call()
    e_ms, o_ms, ratios = [], [], []
    for i in range(pairs):
        if i % 2 == 0:
            e, o = etch_call(), official_call()
        else:
            o, e = official_call(), etch_call()
        e_ms.append(e)
        o_ms.append(o)
        ratios.append(o / e)
    q = statistics.quantiles(ratios, n=4)
    return (f"| {model} | {threads} | {statistics.median(e_ms):.1f} | {statistics.median(o_ms):.1f} | "
            f"{statistics.median(ratios):.2f}x | {q[0]:.2f}-{q[2]:.2f}x | {err:.1e} |")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        _, _, model, threads, pairs, warmup, gap_ms = sys.argv
        print(paired(model, int(threads), int(pairs), int(warmup), float(gap_ms)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet18"])
    ap.add_argument("--gap-ms", type=float, default=20.0,
                    help="idle time before each call, so that neither runtime's workers, still "
                         "spinning after its own call, take a core from the other's next call")
    args = ap.parse_args()
    try:
        import etch  # noqa: F401
    except ImportError:
        print("the etch binding is not importable: see this script's docstring", file=sys.stderr)
        return 1
    rows = []
    for t in args.threads:
        for model in args.models:
            print(f"[vision_paired {time.strftime('%H:%M:%S')}] {model}, {t} thread(s)", file=sys.stderr, flush=True)
            # A process per thread count: the official runtime's pool is process-wide.
            out = subprocess.run(
                [sys.executable, __file__, "--one", model, str(t), str(args.pairs), str(args.warmup),
                 str(args.gap_ms)],
                check=True, capture_output=True, text=True,
            )
            rows.append(out.stdout.strip().splitlines()[-1])
    print(f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {cpu_model()}; "
          f"{os.cpu_count()} logical cores; {args.pairs} pairs of calls per row after {args.warmup} warm-up pairs, "
          f"order alternating, {args.gap_ms:g} ms idle before each call.\n")
    print("| model | threads | etch portable ms | official XNNPACK ms | official / etch (median of pairs) | "
          "interquartile | etch max rel. error |")
    print("|---|---|---:|---:|---:|---|---:|")
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
