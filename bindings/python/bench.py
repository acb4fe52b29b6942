"""Times one decode step of an exported LLM (SmolLM2 by default) from Python:

* ``etch Method.execute``: the binding, a Python loop of ``method.execute([token, pos])``;
* ``etch TextGenerator``: the same decode steps in etch's Rust loop (``generate``'s
  ``decode_ms``: model plus greedy sampling);
* ``executorch.runtime``: the official runtime's Python API, the same loop on torch
  tensors (when ``executorch`` is importable; its LLM custom ops are loaded first).

The binding's own cost is measured on the same calls: each ``Method.execute``'s wall
time minus its time inside the Rust runtime (``Method.stats["run_ns"]``), which a
loaded machine does not skew the way two separate runs are skewed.

Each runtime prefills the same prompt, then decodes ``--steps`` tokens greedily after
``--warmup`` untimed steps. Keep runs short on a shared machine::

    nice -n 15 python bindings/python/bench.py --steps 32

To put etch and executorch in one process, run the fixtures venv's Python with the
etch wheel on PYTHONPATH (``pip install --target DIR etch-*.whl``).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "models" / "smollm2-135m-instruct" / "model_8da4w.pte"


def decode_loop(
    step: Callable[[int, int], np.ndarray], first_token: int, start: int, steps: int, warmup: int
) -> List[float]:
    """Runs ``warmup + steps`` greedy decode steps; returns the timed ones' seconds."""
    token, times = first_token, []
    for i in range(warmup + steps):
        t = time.perf_counter()
        logits = step(token, start + i)
        elapsed = time.perf_counter() - t
        if i >= warmup:
            times.append(elapsed)
        token = int(np.argmax(logits.reshape(-1)))
    return times


def summary(name: str, seconds: List[float]) -> Dict[str, Any]:
    ms = [s * 1e3 for s in seconds]
    return {
        "runtime": name,
        "steps": len(ms),
        "median_ms": statistics.median(ms),
        "mean_ms": statistics.fmean(ms),
        "min_ms": min(ms),
    }


def bench_etch_method(model: Path, prompt: List[int], args: argparse.Namespace) -> Dict[str, Any]:
    import etch

    program = etch.load(model, load_mode=args.load_mode, threads=args.threads)
    method = program.method("forward")
    logits = method.execute([np.array([prompt], np.int64), np.array([0], np.int64)])[0]
    first = int(np.argmax(logits.reshape(-1)))
    token = np.zeros((1, 1), np.int64)
    pos = np.zeros(1, np.int64)
    run_ns: List[int] = []

    def step(t: int, p: int) -> np.ndarray:
        token[0, 0] = t
        pos[0] = p
        before = method.stats["run_ns"]
        out: np.ndarray = method.execute([token, pos])[0]
        run_ns.append(method.stats["run_ns"] - before)
        return out

    wall = decode_loop(step, first, len(prompt), args.steps, args.warmup)
    result = summary("etch Method.execute", wall)
    # The same calls' time inside the runtime (Rust): what the binding adds is the rest.
    inside = [ns / 1e9 for ns in run_ns[args.warmup :]]
    extra_us = [(w - i) * 1e6 for w, i in zip(wall, inside)]
    result["inside_rust_mean_ms"] = statistics.fmean(inside) * 1e3
    result["binding_us_per_call_median"] = statistics.median(extra_us)
    result["binding_overhead_pct"] = 100.0 * statistics.fmean(extra_us) / (statistics.fmean(inside) * 1e6)
    return result


def bench_etch_generator(model: Path, tokenizer: Path, prompt: List[int], args: argparse.Namespace) -> Dict[str, Any]:
    import etch

    gen = etch.TextGenerator(model, tokenizer, threads=args.threads, load_mode=args.load_mode)
    gen.generate(prompt, max_new_tokens=args.warmup + 1, ignore_eos=True)  # warm-up
    out = gen.generate(prompt, max_new_tokens=args.steps + 1, ignore_eos=True)
    stats = out["stats"]
    # decode_ms covers the steps after the first token (which prefill produced).
    per_step = stats["decode_ms"] / max(1, stats["generated_tokens"] - 1)
    return {
        "runtime": "etch TextGenerator (Rust loop)",
        "steps": stats["generated_tokens"] - 1,
        "median_ms": None,
        "mean_ms": per_step,
        "min_ms": None,
    }


def bench_executorch(model: Path, prompt: List[int], args: argparse.Namespace) -> Dict[str, Any]:
    import torch
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama:: ops)
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: ops)
    from executorch.runtime import Runtime

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    program = Runtime.get().load_program(str(model))
    method = program.load_method("forward")
    logits = method.execute([torch.tensor([prompt], dtype=torch.long), torch.tensor([0], dtype=torch.long)])[0]
    first = int(torch.argmax(logits.reshape(-1)))

    def step(t: int, p: int) -> np.ndarray:
        out = method.execute([torch.tensor([[t]], dtype=torch.long), torch.tensor([p], dtype=torch.long)])[0]
        logits: np.ndarray = out.numpy()
        return logits

    return summary("executorch.runtime", decode_loop(step, first, len(prompt), args.steps, args.warmup))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: tokenizer.json beside the model")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="0: one per core")
    parser.add_argument("--load-mode", default="auto", help="etch's load mode (the runner's default)")
    parser.add_argument(
        "--runtimes", default="method,generator,executorch", help="comma-separated: method, generator, executorch"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if not args.model.exists():
        print(f"{args.model} does not exist (tools/models/smollm2.sh builds it)", file=sys.stderr)
        return 1
    tokenizer = args.tokenizer or args.model.parent / "tokenizer.json"
    # Ids of ordinary vocabulary entries; the content does not change the step's cost.
    prompt = [(1000 + 37 * i) % 40000 for i in range(args.prompt_tokens)]

    wanted = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    results = []
    for name in wanted:
        if name == "method":
            results.append(bench_etch_method(args.model, prompt, args))
        elif name == "generator":
            results.append(bench_etch_generator(args.model, tokenizer, prompt, args))
        elif name == "executorch":
            try:
                results.append(bench_executorch(args.model, prompt, args))
            except ImportError as e:
                print(f"executorch.runtime skipped: {e}", file=sys.stderr)
        else:
            parser.error(f"unknown runtime {name!r}")

    by_name = {r["runtime"]: r for r in results}
    method = by_name.get("etch Method.execute")
    rust = by_name.get("etch TextGenerator (Rust loop)")
    report: Dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "model": str(args.model),
        "prompt_tokens": len(prompt),
        "results": results,
    }
    if method and rust:
        report["method_vs_rust_loop_pct"] = 100.0 * (method["mean_ms"] / rust["mean_ms"] - 1.0)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['date']}, {report['cores']} cores, {args.model.name}, prompt {len(prompt)} tokens")
    print(f"{'runtime':34} {'steps':>5} {'median ms':>10} {'mean ms':>9} {'tok/s':>7}")
    for r in results:
        median = "-" if r["median_ms"] is None else f"{r['median_ms']:.2f}"
        print(f"{r['runtime']:34} {r['steps']:>5} {median:>10} {r['mean_ms']:>9.2f} {1e3 / r['mean_ms']:>7.1f}")
    if method:
        print(
            f"binding's own cost per Method.execute (the same calls, minus their time inside the Rust "
            f"runtime, {method['inside_rust_mean_ms']:.2f} ms): median {method['binding_us_per_call_median']:.1f} us, "
            f"{method['binding_overhead_pct']:.2f}% of the step"
        )
    if "method_vs_rust_loop_pct" in report:
        print(
            f"Method.execute loop vs etch's Rust decode loop (separate runs, load-sensitive): "
            f"{report['method_vs_rust_loop_pct']:+.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
