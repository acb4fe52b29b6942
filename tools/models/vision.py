#!/usr/bin/env python3
"""Full-size vision programs for benchmarks: MobileNetV2 and ResNet-18, 224x224.

torchvision architectures with seeded random weights (pretrained weights cannot
be downloaded here) and randomised BatchNorm statistics, each exported twice:

* ``NAME_xnnpack.pte``: ``to_edge_transform_and_lower`` with ``XnnpackPartitioner``;
* ``NAME_portable.pte``: no partitioner (portable kernels);
* ``NAME_int8.pte``: static int8 as the XNNPACK quantizer's PT2E recipe makes it
  (``XNNPACKQuantizer``, symmetric, per-channel weights, calibrated on 8 seeded N(0, 1)
  inputs), then ``XnnpackPartitioner``: how vision models are shipped to phones.

For every program the official runtime (``executorch.runtime``) runs a seeded
``[1, 3, 224, 224]`` input; the input, the output and the latencies (first call,
then the median and minimum of ``--runs`` more) go to ``models/vision/`` (git-ignored),
as ``NAME_input.npy``, ``NAME_{xnnpack,portable}_output.npy`` and ``results.json``.

    tools/fixtures/.venv/bin/python tools/models/vision.py [--force] [--runs N] [--threads N] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "fixtures"))
sys.path.insert(0, str(ROOT / "bench"))
import vision_models  # noqa: E402
import xnn_payload  # noqa: E402
from machine import cpu_model  # noqa: E402

OUT = ROOT / "models" / "vision"
SEED = 20261202
MODELS = {
    "mobilenet_v2": lambda: vision_models.randomize_batchnorm(
        vision_models.randomize_linears(__import__("torchvision").models.mobilenet_v2())
    ),
    "resnet18": lambda: vision_models.resnet18(),
}
log = logging.getLogger("vision")


CALIBRATION_BATCHES = 8
KINDS = ("xnnpack", "portable", "int8")


def quantize_int8(model: torch.nn.Module, x: torch.Tensor) -> torch.nn.Module:
    """The PT2E static int8 recipe of the XNNPACK quantizer, calibrated on seeded inputs."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    gm = prepare_pt2e(torch.export.export(model, (x,), strict=True).module(), quantizer)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for _ in range(CALIBRATION_BATCHES):
            gm(torch.randn(x.shape, generator=gen))
    return convert_pt2e(gm)


def export(model: torch.nn.Module, x: torch.Tensor, kind: str) -> bytes:
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    config = None
    if kind == "int8":
        model = quantize_int8(model, x)
        config = EdgeCompileConfig(_check_ir_validity=False)
    ep = torch.export.export(model, (x,), strict=kind != "int8")
    partitioner = None
    if kind in ("xnnpack", "int8"):
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    return to_edge_transform_and_lower(ep, partitioner=partitioner, compile_config=config).to_executorch().buffer


def run(pte: Path, x: torch.Tensor, runs: int) -> Dict[str, Any]:
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    t0 = time.perf_counter()
    out = method.execute([x])[0].clone()
    first = time.perf_counter() - t0
    times: List[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        method.execute([x])
        times.append(time.perf_counter() - t0)
    return {
        "output": out,
        "first_call_ms": round(first * 1e3, 2),
        "median_ms": round(statistics.median(times) * 1e3, 2) if times else None,
        "min_ms": round(min(times) * 1e3, 2) if times else None,
        "runs": runs,
    }


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="re-export programs that exist")
    ap.add_argument("--runs", type=int, default=10, help="timed calls after the first (default 10)")
    ap.add_argument("--portable-runs", type=int, default=1, help="timed calls for the slow portable programs (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="official runtime threadpool size (default 1)")
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS), help="only these models")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="only these programs")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[vision] %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)

    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(args.threads)
    results_path = OUT / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for name in args.only or sorted(MODELS):
        torch.manual_seed(SEED)
        model = MODELS[name]().eval()
        x = torch.randn(1, 3, 224, 224)
        np.save(OUT / f"{name}_input.npy", x.numpy())
        with torch.no_grad():
            eager = model(x)
        for kind in args.kinds:
            pte = OUT / f"{name}_{kind}.pte"
            if args.force or not pte.exists():
                t0 = time.perf_counter()
                pte.write_bytes(export(model, x, kind))
                log.info("%s: exported in %.0f s (%.1f MB)", pte.name, time.perf_counter() - t0, pte.stat().st_size / 1e6)
            r = run(pte, x, args.portable_runs if kind == "portable" else args.runs)
            out = r.pop("output")
            np.save(OUT / f"{name}_{kind}_output.npy", out.numpy())
            delegates = xnn_payload.delegates(pte.read_bytes())
            r.update(
                {
                    "pte_bytes": pte.stat().st_size,
                    "threads": args.threads,
                    "max_abs_diff_vs_eager": float((out - eager).abs().max()),
                    "max_abs_output": float(out.abs().max()),
                    "xnnpack_nodes": xnn_payload.totals(delegates) if delegates else None,
                }
            )
            log.info("%s: %s", pte.name, json.dumps(r))
            results[f"{name}_{kind}"] = r
    results["_machine"] = {"cpu": cpu_model(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
