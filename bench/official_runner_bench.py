#!/usr/bin/env python3
"""Benchmark the official ExecuTorch C++ text LLM runner
(``executorch.extension.llm.runner.TextLLMRunner``, the pip package's runner) on a
.pte LLM: one generation of a fixed English prompt (``bench/prompt_text.txt``, cut to
``--prompt-len`` tokens of the model's tokenizer, default 128), greedy, up to
``--decode`` new tokens (the runner has no ignore-EOS switch, so the prompt is prose
whose continuation does not end early; ``generated_tokens`` says how many it made).

Figures come from the runner's own stats (model load, prompt evaluation and generation
rates), so unlike ``official_bench.py`` they include no Python per token. Peak RSS is
this process's. Prints one JSON object (one run; compare.sh repeats and takes medians).

Thread pool: ``portable_lib._unsafe_reset_threadpool(n)`` before the runner is made
(the runner's kernels use the same process-wide pool); the size read back is reported.

Usage: tools/fixtures/.venv/bin/python bench/official_runner_bench.py \\
        --pte models/smollm2-135m-instruct/model.pte --tokenizer models/smollm2-135m-instruct/tokenizer.json \\
        [--prompt-len 128] [--decode 64] [--threads 2]
"""
import argparse
import json
import os
import resource
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def prompt_text(tokenizer_path: str, n: int) -> str:
    """The first n tokens of bench/prompt_text.txt, as text that re-encodes to n tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    text = (HERE / "prompt_text.txt").read_text(encoding="utf-8").strip()
    ids = tok.encode(text, add_special_tokens=False).ids
    if len(ids) < n:
        raise SystemExit(f"bench/prompt_text.txt has only {len(ids)} tokens, fewer than {n}")
    for cut in range(n, n + 8):
        candidate = tok.decode(ids[:cut])
        if len(tok.encode(candidate, add_special_tokens=False).ids) == n:
            return candidate
    raise SystemExit(f"could not cut the prompt to exactly {n} tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pte", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="0: leave the runtime's default")
    ap.add_argument("--print-prompt", action="store_true", help="print the prompt text and exit")
    args = ap.parse_args()

    text = prompt_text(args.tokenizer, args.prompt_len)
    if args.print_prompt:
        sys.stdout.write(text)
        return

    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama:: kernels)
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels, e.g. embedding_byte)
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
    from executorch.extension.pybindings import portable_lib

    threadpool = {}
    if args.threads:
        portable_lib._unsafe_reset_threadpool(args.threads)
    if hasattr(portable_lib, "_threadpool_get_thread_count"):
        threadpool["size"] = portable_lib._threadpool_get_thread_count()

    runner = TextLLMRunner(args.pte, args.tokenizer)
    stats = {}

    def on_stats(s):
        stats.update(json.loads(s.to_json_string()))

    config = GenerationConfig(echo=False, max_new_tokens=args.decode, temperature=0.0, num_bos=0, num_eos=0)
    # the C++ runner prints text and its stats on stdout itself: send them to stderr
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        runner.generate(text, config, lambda piece: None, on_stats)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)

    unit = stats.get("SCALING_FACTOR_UNITS_PER_SECOND", 1000)

    def span(a, b):
        return (stats[b] - stats[a]) / unit if a in stats and b in stats else None

    n_prompt, n_gen = stats.get("prompt_tokens"), stats.get("generated_tokens")
    prefill_s = span("inference_start_ms", "prompt_eval_end_ms")
    decode_s = span("prompt_eval_end_ms", "inference_end_ms")
    load_s = span("model_load_start_ms", "model_load_end_ms")
    print(json.dumps({
        "runtime": "executorch.extension.llm.runner.TextLLMRunner",
        "pte": args.pte,
        "threads": args.threads or None,
        "threadpool": threadpool,
        "prompt_tokens": n_prompt,
        "generated_tokens": n_gen,
        "load_ms": None if load_s is None else round(load_s * 1e3, 1),
        "time_to_first_token_ms": None if prefill_s is None else round(prefill_s * 1e3, 1),
        "prefill_tokens_per_second": round(n_prompt / prefill_s, 2) if prefill_s else None,
        # the runner's own "generation rate": generated tokens / (end - end of prompt evaluation)
        "decode_tokens_per_second": round(n_gen / decode_s, 2) if decode_s and n_gen else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "stats": stats,
    }, indent=1))


if __name__ == "__main__":
    main()
