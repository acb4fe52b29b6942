#!/usr/bin/env python3
"""Layer by layer: etch on a portable vision program against the official runtime's
XNNPACK delegate on the delegated one (which layers hold etch back).

The official side runs with its event tracer (ETDump) on, which times every XNNPACK
operator inside the delegate call; etch's side is `etch run --profile --json`, which
times every instruction. Both lists are in program order, and in these programs
every convolution, add, mean and linear layer is one instruction on etch's side and
one XNNPACK operator on the official side, so the two line up once layout changes
(transposes, reshapes, `_clone_dim_order`) are left out.

    tools/fixtures/.venv/bin/python bench/vision_layers.py [--model mobilenet_v2]
        [--threads 1] [--calls 30] [--etch target/release/etch] [--json]

Prints a table (markdown, or JSON with --json): per layer, the official median,
etch's mean per call, and their ratio; then the totals. The two runtimes run one
after the other, so on a machine whose speed drifts, run it twice.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VISION = ROOT / "models" / "vision"

# XNNPACK operator names and etch operator names of the layers that line up (pooling
# included).
XNN_LAYERS = ("Convolution", "Fully Connected", "Add", "Mean", "Max Pooling", "Global Average Pooling")
ETCH_LAYERS = ("aten::convolution", "aten::add", "aten::mean", "aten::addmm", "aten::linear",
               "aten::max_pool2d", "aten::adaptive_avg_pool2d", "aten::avg_pool2d")


def official_layers(model: str, threads: int, calls: int) -> list[tuple[str, float]]:
    """(operator, median ms) of every XNNPACK layer of one call, in order."""
    import numpy as np
    import torch
    from executorch.devtools import Inspector
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(threads)
    module = portable_lib._load_for_executorch(
        str(VISION / f"{model}_xnnpack.pte"), enable_etdump=True, debug_buffer_size=0)
    x = torch.from_numpy(np.load(VISION / f"{model}_input.npy"))
    for _ in range(calls):
        module.forward([x])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.etdp")
        module.write_etdump_result_to_file(path)
        frame = Inspector(etdump_path=path).to_dataframe()
    rows = []
    for name, p50 in zip(frame["event_name"], frame["p50 (ms)"]):
        if name.startswith(XNN_LAYERS):
            rows.append((name, float(p50)))
    return rows


def etch_layers(etch: str, model: str, threads: int, calls: int) -> list[tuple[str, float]]:
    """(operator, mean ms per call) of every etch layer instruction, in order."""
    cmd = [etch, "run", str(VISION / f"{model}_portable.pte"), "--input",
           str(VISION / f"{model}_input.npy"), "--repeat", str(calls), "--threads", str(threads),
           "--json", "--profile"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return [(s["operator"], s["ms"] / s["calls"]) for s in out["profile_steps"]
            if s["operator"].startswith(ETCH_LAYERS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--etch", default=str(ROOT / "target" / "release" / "etch"))
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    theirs = official_layers(args.model, args.threads, args.calls)
    ours = etch_layers(args.etch, args.model, args.threads, args.calls)
    if len(theirs) != len(ours):
        print(f"the layers do not line up: {len(theirs)} XNNPACK operators, {len(ours)} etch "
              "instructions", file=sys.stderr)
        return 1
    rows = [{"layer": i, "xnnpack": t[0], "etch": o[0], "xnnpack_ms": t[1], "etch_ms": o[1]}
            for i, (t, o) in enumerate(zip(theirs, ours))]
    if args.json:
        print(json.dumps({"model": args.model, "threads": args.threads, "layers": rows}, indent=1))
        return 0
    print(f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {cpu_model()}; "
          f"{args.model}, {args.threads} thread(s), {args.calls} calls each.\n")
    print("| # | XNNPACK operator | XNNPACK ms | etch ms | etch / XNNPACK |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layer']} | {r['xnnpack']} | {r['xnnpack_ms']:.3f} | {r['etch_ms']:.3f} | "
              f"{r['etch_ms'] / max(r['xnnpack_ms'], 1e-6):.2f} |")
    tx = sum(r["xnnpack_ms"] for r in rows)
    te = sum(r["etch_ms"] for r in rows)
    print(f"| | all layers | {tx:.3f} | {te:.3f} | {te / tx:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
