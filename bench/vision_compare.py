#!/usr/bin/env python3
"""etch vs the official ExecuTorch runtime on the full-size vision programs of
tools/models/vision.sh (MobileNetV2 and ResNet-18, 224x224, batch 1; each as an
XNNPACK-delegated and a portable file), interleaved in one run.

Every measurement is its own process: `etch run FILE --input X.npy --repeat N
--threads T --json` (median of N calls after loading) and the official runtime's
`Method.execute` from Python (`--official` mode of this script: load, one warm-up
call, the median of N calls; its thread pool set with `_unsafe_reset_threadpool`).
Runs are interleaved (run 1 of every row, then run 2, ...) with a pause before each,
so that the drift of a shared machine spreads over all rows alike. The output of
each etch run is compared with the official runtime's recorded output.

Prints a markdown table (medians over --runs of each run's median) on stdout,
progress on stderr.

Usage: tools/fixtures/.venv/bin/python bench/vision_compare.py [--runs 3]
       [--threads 1 2] [--calls 20] [--portable-calls 3] [--settle 3] [--models mobilenet_v2 resnet18]
       [--skip-official-portable] [--kinds xnnpack portable int8]

`--kinds int8` times the PT2E static int8 files (`tools/models/vision.sh --kinds int8`).

After the table, a second one sets etch on the portable file against the official
runtime on the XNNPACK file (issue #16's 0.8x bar), by medians and by the fastest call of
all runs (on a shared machine the medians move with the host's load; the fastest calls
much less). --skip-official-portable leaves
out the official runtime's portable rows (seconds per call for ResNet-18).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_model

ROOT = Path(__file__).resolve().parent.parent
VISION = ROOT / "models" / "vision"
ETCH = ROOT / "target" / "release" / "etch"


def official(pte: str, x: str, calls: int, threads: int) -> None:
    import numpy as np
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    portable_lib._unsafe_reset_threadpool(threads)
    t0 = time.perf_counter()
    method = Runtime.get().load_program(pte).load_method("forward")
    load_ms = (time.perf_counter() - t0) * 1e3
    inp = torch.from_numpy(np.load(x))
    method.execute([inp])
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        method.execute([inp])
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"median_ms": statistics.median(times), "min_ms": min(times), "load_ms": load_ms}))


def say(msg: str) -> None:
    print(f"[vision_compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_etch(pte: Path, x: Path, calls: int, threads: int, outdir: Path) -> dict:
    out = subprocess.run(
        [str(ETCH), "run", str(pte), "--input", str(x), "--repeat", str(calls), "--threads", str(threads),
         "--output-dir", str(outdir), "--json"],
        check=True, capture_output=True, text=True,
    )
    j = json.loads(out.stdout)
    call = j["calls"][0]
    return {"median_ms": call["median_ms"], "min_ms": call["min_ms"], "load_ms": j["load_ms"]}


def run_official(pte: Path, x: Path, calls: int, threads: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--official", str(pte), str(x), str(calls), str(threads)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--official":
        official(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--calls", type=int, default=20, help="timed calls per run (XNNPACK files, and etch on portable ones)")
    ap.add_argument("--portable-calls", type=int, default=3, help="timed calls per run of the official portable runtime")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds of pause before each run")
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet18"])
    ap.add_argument("--skip-official-portable", action="store_true",
                    help="do not time the official runtime on the portable files")
    ap.add_argument("--kinds", nargs="+", choices=["xnnpack", "portable", "int8"], default=["xnnpack", "portable"],
                    help="which files of each model (int8: the PT2E static int8 XNNPACK file)")
    args = ap.parse_args()
    import numpy as np

    if not ETCH.exists():
        print(f"{ETCH} is missing: cargo build --release -p etch-cli", file=sys.stderr)
        return 1
    rows = {}
    errs = {}
    outdir = Path(os.environ.get("TMPDIR", "/tmp")) / "etch_vision_compare"
    outdir.mkdir(exist_ok=True)
    for r in range(1, args.runs + 1):
        for t in args.threads:
            for model in args.models:
                x = VISION / f"{model}_input.npy"
                for kind in args.kinds:
                    pte = VISION / f"{model}_{kind}.pte"
                    if not pte.exists():
                        print(f"{pte} is missing: tools/models/vision.sh", file=sys.stderr)
                        return 1
                    for runtime in ("etch", "official"):
                        if runtime == "official" and kind == "portable" and args.skip_official_portable:
                            continue
                        time.sleep(args.settle)
                        say(f"run {r}/{args.runs}, {t} thread(s): {runtime} {pte.name}")
                        if runtime == "etch":
                            res = run_etch(pte, x, args.calls, t, outdir)
                            want = np.load(VISION / f"{model}_{kind}_output.npy")
                            got = np.load(outdir / "out0.npy")
                            errs[(model, kind)] = float(np.abs(got - want).max() / np.abs(want).max())
                        else:
                            calls = args.portable_calls if kind == "portable" else args.calls
                            res = run_official(pte, x, calls, t)
                        rows.setdefault((model, kind, t, runtime), []).append(res)
    print(f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {cpu_model()}; "
          f"{os.cpu_count()} logical cores; medians of {args.runs} interleaved runs, each the median of "
          f"{args.calls} calls ({args.portable_calls} for the official portable runtime).\n")
    print("| model | file | threads | etch ms | official ms | official / etch | etch load ms | official load ms | etch max rel. error |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for t in args.threads:
        for model in args.models:
            for kind in args.kinds:
                e = rows[(model, kind, t, "etch")]
                em = statistics.median(v["median_ms"] for v in e)
                el = statistics.median(v["load_ms"] for v in e)
                o = rows.get((model, kind, t, "official"))
                if o is None:
                    print(f"| {model} | {kind} | {t} | {em:.1f} | - | - | {el:.0f} | - | {errs[(model, kind)]:.1e} |")
                    continue
                om = statistics.median(v["median_ms"] for v in o)
                ol = statistics.median(v["load_ms"] for v in o)
                print(f"| {model} | {kind} | {t} | {em:.1f} | {om:.1f} | {om / em:.2f}x | {el:.0f} | {ol:.0f} | "
                      f"{errs[(model, kind)]:.1e} |")
    if not {"portable", "xnnpack"} <= set(args.kinds):
        return 0
    print("\n| model | threads | etch portable ms | official XNNPACK ms | official XNNPACK / etch portable | "
          "each run's ratio | fastest calls, etch / official ms | ratio of the fastest |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for t in args.threads:
        for model in args.models:
            e = [v["median_ms"] for v in rows[(model, "portable", t, "etch")]]
            o = [v["median_ms"] for v in rows[(model, "xnnpack", t, "official")]]
            each = ", ".join(f"{b / a:.2f}x" for a, b in zip(e, o))
            em, om = statistics.median(e), statistics.median(o)
            # The fastest call of all runs: what a shared machine's noise cannot lower.
            ef = min(v["min_ms"] for v in rows[(model, "portable", t, "etch")])
            of = min(v["min_ms"] for v in rows[(model, "xnnpack", t, "official")])
            print(f"| {model} | {t} | {em:.1f} | {om:.1f} | {om / em:.2f}x | {each} | {ef:.2f} / {of:.2f} | "
                  f"{of / ef:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
