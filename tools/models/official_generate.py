#!/usr/bin/env python3
"""Greedy text generation with the official ExecuTorch runtime (the reference
for etch).

Default mode (``executorch.runtime``: Runtime / Program / Method, the same
.pte etch runs):

1. render the prompt with the model's chat template
   (``chat_template.jinja``, taken from the GGUF; SmolLM2's adds a default
   system prompt when the conversation has none) and tokenize it with
   ``tokenizer.json`` (the ``tokenizers`` package);
2. prefill in one call: tokens i64 [1, n], input_pos i64 [1] = [0] (chunked by
   max_seq_len - 1 if the prompt is longer, the most one call takes);
3. decode one token per call (argmax, ties to the lowest id): tokens [1, 1],
   input_pos [n], [n+1], ...; stop at an EOS id (read from the program's
   ``get_eos_ids`` method) or after N new tokens.

It prints JSON: prompt_token_ids, generated_token_ids (an EOS that stopped the
generation is included), text (special tokens skipped),
prefill_tokens_per_second, decode_tokens_per_second, and some context.

``--runner`` uses the official C++ text LLM runner instead
(``executorch.extension.llm.runner.TextLLMRunner``, i.e. create_text_llm_runner
with pytorch/tokenizers' HF tokenizer, temperature 0). It reports the decoded
pieces and the runner's own stats; it does not expose token ids.

Usage::

    tools/fixtures/.venv/bin/python tools/models/official_generate.py \\
        [--model-dir models/smollm2-135m-instruct] [--pte FILE] \\
        [--max-new-tokens 32] [--threads N] [--ignore-eos] [--runner] "What is the capital of France?"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / "models" / "smollm2-135m-instruct"


def render_chat(template: Optional[str], prompt: str, system: Optional[str]) -> str:
    messages = [{"role": "user", "content": prompt}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    if template:
        import jinja2

        # as transformers renders chat templates
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(template).render(messages=messages, add_generation_prompt=True)
    # plain ChatML
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n"


def scalar_outputs(method) -> List[int]:
    return [int(o.item()) if isinstance(o, torch.Tensor) else int(o) for o in method.execute([])]


def generate_runtime(
    pte: Path, tokenizer_path: Path, chat_text: str, max_new: int, threads: Optional[int], ignore_eos: bool = False
) -> Dict[str, Any]:
    from tokenizers import Tokenizer
    from executorch.runtime import Runtime

    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama::update_cache, custom_sdpa)
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels, e.g. embedding_byte)

    tok = Tokenizer.from_file(str(tokenizer_path))
    prompt_ids = tok.encode(chat_text, add_special_tokens=False).ids

    runtime = Runtime.get()
    if threads:
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(threads)
    t0 = time.perf_counter()
    program = runtime.load_program(str(pte))
    forward = program.load_method("forward")
    load_s = time.perf_counter() - t0
    names = set(program.method_names)
    eos_ids = scalar_outputs(program.load_method("get_eos_ids")) if "get_eos_ids" in names else []
    max_seq_len = scalar_outputs(program.load_method("get_max_seq_len"))[0]
    max_ctx = scalar_outputs(program.load_method("get_max_context_len"))[0] if "get_max_context_len" in names else max_seq_len
    if len(prompt_ids) + max_new > max_ctx:
        raise SystemExit(f"prompt ({len(prompt_ids)}) + {max_new} new tokens exceed the context length {max_ctx}")

    def step(ids: List[int], pos: int) -> torch.Tensor:
        out = forward.execute([torch.tensor([ids], dtype=torch.int64), torch.tensor([pos], dtype=torch.int64)])[0]
        return out.reshape(-1, out.shape[-1])[-1]

    # prefill: one call (the exported token input takes at most max_seq_len - 1 tokens)
    chunk = max_seq_len - 1
    t0 = time.perf_counter()
    pos = 0
    while pos < len(prompt_ids):
        logits = step(prompt_ids[pos : pos + chunk], pos)
        pos += len(prompt_ids[pos : pos + chunk])
    prefill_s = time.perf_counter() - t0

    generated: List[int] = []
    stopped = "max_new_tokens"
    decode_calls = 0
    t0 = time.perf_counter()
    while True:
        nxt = int(torch.argmax(logits.float()))  # ties: the lowest index, as the runner's sampler
        generated.append(nxt)
        if nxt in eos_ids and not ignore_eos:
            stopped = "eos"
            break
        if len(generated) >= max_new:
            break
        logits = step([nxt], pos)
        pos += 1
        decode_calls += 1
    decode_s = time.perf_counter() - t0

    return {
        "mode": "executorch.runtime",
        "pte": str(pte),
        "prompt_token_ids": prompt_ids,
        "generated_token_ids": generated,
        "text": tok.decode(generated, skip_special_tokens=True),
        "prefill_tokens_per_second": round(len(prompt_ids) / prefill_s, 2),
        "decode_tokens_per_second": round(decode_calls / decode_s, 2) if decode_calls else None,
        "stopped": stopped,
        "eos_ids": eos_ids,
        "max_seq_len": max_seq_len,
        "max_context_len": max_ctx,
        "prefill_seconds": round(prefill_s, 4),
        "decode_calls": decode_calls,
        "decode_seconds": round(decode_s, 4),
        "load_seconds": round(load_s, 3),
        "threads": threads,
        "ignore_eos": ignore_eos,
    }


def generate_runner(pte: Path, tokenizer_path: Path, chat_text: str, max_new: int) -> Dict[str, Any]:
    # the runner shares the runtime's operator registry; the llama:: kernels
    # (update_cache, custom_sdpa) are registered by loading the custom-ops library
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels, e.g. embedding_byte)
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    t0 = time.perf_counter()
    runner = TextLLMRunner(str(pte), str(tokenizer_path))
    load_s = time.perf_counter() - t0
    pieces: List[str] = []
    stats: Dict[str, Any] = {}

    def on_stats(s) -> None:
        stats.update(json.loads(s.to_json_string()))

    config = GenerationConfig(echo=False, max_new_tokens=max_new, temperature=0.0, num_bos=0, num_eos=0)
    # The C++ runner prints the generated text and a "PyTorchObserver {...}"
    # line on stdout itself; send those to stderr, so that stdout is our JSON.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        runner.generate(chat_text, config, pieces.append, on_stats)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)

    def rate(n: int, start: str, end: str) -> Optional[float]:
        if start not in stats or end not in stats or stats[end] <= stats[start]:
            return None
        return round(n * stats.get("SCALING_FACTOR_UNITS_PER_SECOND", 1000) / (stats[end] - stats[start]), 2)

    n_prompt = stats.get("prompt_tokens")
    n_gen = stats.get("generated_tokens")
    return {
        "mode": "executorch.extension.llm.runner.TextLLMRunner",
        "pte": str(pte),
        "pieces": pieces,
        "text": "".join(pieces),
        "prompt_tokens": n_prompt,
        "generated_tokens": n_gen,
        "prefill_tokens_per_second": rate(n_prompt or 0, "inference_start_ms", "prompt_eval_end_ms"),
        # the runner's own "generation rate": generated tokens / (end - prompt_eval_end)
        "decode_tokens_per_second": rate(n_gen or 0, "prompt_eval_end_ms", "inference_end_ms"),
        "load_seconds": round(load_s, 3),
        "stats": stats,
    }


def to_json(o: Any, level: int = 0) -> str:
    """Indented JSON with lists of numbers and strings on one line."""
    pad, pad1 = " " * level, " " * (level + 1)
    if isinstance(o, dict) and o:
        items = [f"{pad1}{json.dumps(k)}: {to_json(v, level + 1)}" for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return json.dumps(o, ensure_ascii=False)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("--model-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--pte", type=Path, help="program to run (default MODEL_DIR/model_8da4w.pte)")
    ap.add_argument("--tokenizer", type=Path, help="default MODEL_DIR/tokenizer.json")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--system", help="system prompt (default: whatever the chat template adds)")
    ap.add_argument("--raw", action="store_true", help="no chat template: tokenize the prompt as it is")
    ap.add_argument("--threads", type=int, help="official runtime threadpool size (default: the runtime's)")
    ap.add_argument("--runner", action="store_true", help="use the official C++ text LLM runner (TextLLMRunner)")
    ap.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS ids (executorch.runtime mode only)")
    args = ap.parse_args(argv)

    d = args.model_dir
    pte = args.pte or d / "model_8da4w.pte"
    tokenizer = args.tokenizer or d / "tokenizer.json"
    template_path = d / "chat_template.jinja"
    template = template_path.read_text(encoding="utf-8") if template_path.exists() else None
    chat_text = args.prompt if args.raw else render_chat(template, args.prompt, args.system)

    if args.runner:
        res = generate_runner(pte, tokenizer, chat_text, args.max_new_tokens)
    else:
        res = generate_runtime(pte, tokenizer, chat_text, args.max_new_tokens, args.threads, args.ignore_eos)
    res = {
        "prompt": args.prompt,
        "chat_text": chat_text,
        "chat_template": str(template_path) if (template and not args.raw) else None,
        "max_new_tokens": args.max_new_tokens,
        **res,
    }
    order = ["prompt_token_ids", "generated_token_ids", "text", "prefill_tokens_per_second", "decode_tokens_per_second"]
    res = {**{k: res[k] for k in order if k in res}, **{k: v for k, v in res.items() if k not in order}}
    print(to_json(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
