#!/usr/bin/env python3
"""Benchmark the official ExecuTorch Python runtime (executorch.runtime) on a
.pte LLM: load, prefill a fixed prompt (bench/prompt_ids.py) in one call, then
greedy decode ignoring EOS. Prints JSON with medians over --runs.

Thread pool: executorch 1.5.1 exposes
``executorch.extension.pybindings.portable_lib._unsafe_reset_threadpool(n)``
(and ``_threadpool_get_thread_count`` is probed if present); that is what --threads uses.

--import-order torch-first|et-first controls whether torch or executorch.runtime
is imported first (sgemm_ symbol binding: MKL inside libtorch vs ExecuTorch's own).
The loaded shared objects that export sgemm_ are reported (best effort, from
/proc/self/maps + nm -D). bench/sgemm_binding.sh shows the actual binding
(LD_DEBUG=bindings): measured with executorch 1.5.1, in BOTH import orders
libexecutorch_kernels_optimized.so binds sgemm_ to its own copy, while
libcustom_ops_aot_lib.so (llama:: custom ops) binds sgemm_ to torch's
libtorch_cpu.so (MKL). Import order made no difference to the bindings.

Caveat: each step goes through the Python bindings (torch.tensor creation,
EValue conversion, output copy), so the timings include binding overhead.

Usage: tools/fixtures/.venv/bin/python bench/official_bench.py --pte models/smollm2-135m-instruct/model.pte \
        --prompt-len 128 --decode 64 --threads 2 --runs 3
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prompt_ids import prompt_ids  # noqa: E402


def sgemm_providers():
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if p.startswith("/") and ".so" in p:
                    libs.add(p)
    except OSError:
        return None
    out = []
    for lib in sorted(libs):
        try:
            env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_COUNT_OUT")}
            r = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, timeout=30, env=env)
        except Exception:
            continue
        for ln in r.stdout.splitlines():
            parts = ln.split()
            if len(parts) >= 3 and parts[2] == "sgemm_" and parts[1] in "TtWi":
                out.append(lib)
                break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pte", required=True)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="0: leave the runtime's default")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--import-order", choices=["torch-first", "et-first"], default="torch-first")
    args = ap.parse_args()

    if args.import_order == "et-first":
        from executorch.runtime import Runtime
        import torch
    else:
        import torch
        from executorch.runtime import Runtime
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama:: ops)
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels, e.g. embedding_byte)
    from executorch.extension.pybindings import portable_lib

    threadpool_info = {"api": "executorch.extension.pybindings.portable_lib._unsafe_reset_threadpool"}
    if hasattr(portable_lib, "_threadpool_get_thread_count"):
        threadpool_info["default_size"] = portable_lib._threadpool_get_thread_count()
    if args.threads:
        portable_lib._unsafe_reset_threadpool(args.threads)
    if hasattr(portable_lib, "_threadpool_get_thread_count"):
        threadpool_info["size"] = portable_lib._threadpool_get_thread_count()
    torch.set_num_threads(max(1, args.threads or 1))  # only affects the argmax / tensor glue

    ids = prompt_ids(args.prompt_len)
    runtime = Runtime.get()
    loads, prefills, decodes, ttfts = [], [], [], []
    first_tokens = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        program = runtime.load_program(args.pte)
        forward = program.load_method("forward")
        loads.append((time.perf_counter() - t0) * 1e3)

        def step(tok, pos):
            out = forward.execute([torch.tensor([tok], dtype=torch.int64), torch.tensor([pos], dtype=torch.int64)])[0]
            return out.reshape(-1, out.shape[-1])[-1]

        t0 = time.perf_counter()
        logits = step(ids, 0)
        nxt = int(torch.argmax(logits.float()))
        t1 = time.perf_counter()
        prefills.append(len(ids) / (t1 - t0))
        ttfts.append((t1 - t0) * 1e3)
        gen = [nxt]
        pos = len(ids)
        t0 = time.perf_counter()
        for _ in range(args.decode):
            logits = step([nxt], pos)
            pos += 1
            nxt = int(torch.argmax(logits.float()))
            gen.append(nxt)
        dt = time.perf_counter() - t0
        decodes.append(args.decode / dt if args.decode else 0.0)
        first_tokens = gen[:8]
        del forward, program

    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    res = {
        "runtime": "executorch.runtime (python)",
        "pte": args.pte,
        "threads": args.threads or None,
        "threadpool": threadpool_info,
        "import_order": args.import_order,
        "runs": args.runs,
        "prompt_tokens": len(ids),
        "decode_tokens": args.decode,
        "load_ms": round(statistics.median(loads), 1),
        "time_to_first_token_ms": round(statistics.median(ttfts), 1),
        "prefill_tokens_per_second": round(statistics.median(prefills), 2),
        "decode_tokens_per_second": round(statistics.median(decodes), 2),
        "peak_rss_bytes": ru,
        "all_load_ms": [round(x, 1) for x in loads],
        "all_prefill_tps": [round(x, 2) for x in prefills],
        "all_decode_tps": [round(x, 2) for x in decodes],
        "first_generated_ids": first_tokens,
        "sgemm_providers": sgemm_providers(),
    }
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
