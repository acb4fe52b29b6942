#!/usr/bin/env python3
"""Greedy tokens of etch and of the official ExecuTorch runtime, side by side.

For each prompt, runs

* ``tools/models/official_generate.py`` (the official runtime, ``executorch.runtime``:
  the same ``.pte``, the chat template from ``chat_template.jinja``, argmax decoding), and
* ``etch generate --chat --json`` (temperature 0),

with the same number of new tokens, and compares the prompt token ids and every
generated token id. ``--ignore-eos`` (on by default for the first prompt, whose answer
ends after 8 tokens) makes both keep decoding past end-of-sequence, so that at least
``--min-tokens`` tokens are compared on every prompt.

Exit status 0 when every prompt matches token for token over at least ``--min-tokens``
generated tokens, 1 otherwise. Prints a JSON report on stdout.

``--official-variants`` runs the official runtime three ways, because its own answer is
not one fixed function of the file: ``llama::custom_sdpa`` calls ``sgemm_``, which in a
process that imported torch resolves to torch's MKL (CPU-dispatched), and otherwise to
the Eigen BLAS that the pip package ships (``libexecutorch_kernels_optimized.so``).

* ``default``: as ``official_generate.py`` runs (MKL, its best code path for this CPU);
* ``mkl-compatible``: ``MKL_CBWR=COMPATIBLE`` (MKL's reproducible SSE path);
* ``eigen``: ``LD_PRELOAD`` of the package's own Eigen BLAS, which a torch-free
  deployment of the official runtime uses.

On a dynamically quantized model (8da4w) one-ulp differences in attention flip the
rounding of int8 activations, and greedy tokens part after a few tokens *between these
official runs*. The report then gives, per prompt, how many leading tokens all official
variants agree on (``official_agreement``) and the longest match of etch with any of
them; a prompt passes when etch equals one variant over ``--min-tokens`` tokens or
agrees with all of them for as long as they agree with one another.

Usage (from the repository root, after ``tools/models/smollm2.sh``)::

    tools/fixtures/.venv/bin/python tools/models/compare_greedy.py \\
        [--model-dir models/smollm2-135m-instruct] [--pte FILE] [--max-new-tokens 48] [--threads N] \\
        [--official-variants] \\
        [--etch target/release/etch] [PROMPT ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / "models" / "smollm2-135m-instruct"
# (prompt, ignore_eos): the first is the check prompt, whose greedy answer
# stops at EOS after 8 tokens; the second has a long answer on its own.
DEFAULT_PROMPTS = [
    ("What is the capital of France?", True),
    ("Write a short story about a robot who learns to paint.", False),
]


def first_difference(a: List[int], b: List[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def official_variants() -> Dict[str, Dict[str, str]]:
    """Environment overrides of the official runs of ``--official-variants``."""
    import executorch  # a namespace package: no __file__

    eigen = Path(list(executorch.__path__)[0]) / "lib" / "libexecutorch_kernels_optimized.so"
    if not eigen.is_file():
        raise SystemExit(f"{eigen} is missing: the eigen variant needs the pip package's own BLAS")
    preload = " ".join(p for p in [str(eigen), os.environ.get("LD_PRELOAD", "")] if p)
    return {"default": {}, "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"}, "eigen": {"LD_PRELOAD": preload}}


def run_json(cmd: List[str], env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def compare(args: argparse.Namespace, prompt: str, ignore_eos: bool) -> Dict[str, Any]:
    d = args.model_dir
    pte = args.pte or d / "model_8da4w.pte"
    official_cmd = [sys.executable, str(ROOT / "tools/models/official_generate.py"), prompt,
                    "--model-dir", str(d), "--pte", str(pte), "--max-new-tokens", str(args.max_new_tokens)]
    etch_cmd = [str(args.etch), "generate", "--model", str(pte), "--tokenizer",
                str(d / "tokenizer.json"), "--chat", "--prompt", prompt, "--max-new-tokens",
                str(args.max_new_tokens), "--temperature", "0", "--json"]
    if ignore_eos:
        official_cmd.append("--ignore-eos")
        etch_cmd.append("--ignore-eos")
    if args.threads:
        official_cmd += ["--threads", str(args.threads)]
        etch_cmd += ["--threads", str(args.threads)]
    variants = official_variants() if args.official_variants else {"default": {}}
    runs = {name: run_json(official_cmd, env) for name, env in variants.items()}
    official = runs["default"]
    etch = run_json(etch_cmd)
    o_ids, e_ids = official["generated_token_ids"], etch["generated_token_ids"]
    prompt_equal = official["prompt_token_ids"] == etch["prompt_token_ids"]
    diff = first_difference(o_ids, e_ids)
    matched = len(o_ids) if diff is None else diff
    extra: Dict[str, Any] = {}
    if args.official_variants:
        ids = {name: r["generated_token_ids"] for name, r in runs.items()}
        agreement = min(len(v) for v in ids.values())
        for v in ids.values():
            fd = first_difference(o_ids, v)
            agreement = min(agreement, len(v) if fd is None else fd)
        etch_match = {}
        for name, v in ids.items():
            fd = first_difference(v, e_ids)
            etch_match[name] = len(v) if fd is None else fd
        extra = {
            "official_agreement": agreement,
            "etch_matching_tokens_per_variant": etch_match,
            "official_generated_token_ids_per_variant": ids,
            "within_official_spread": prompt_equal and (max(etch_match.values()) >= args.min_tokens
                                                        or min(etch_match.values()) >= agreement),
        }
    return {
        "prompt": prompt,
        "ignore_eos": ignore_eos,
        "prompt_tokens": len(official["prompt_token_ids"]),
        "prompt_token_ids_equal": prompt_equal,
        "generated_tokens": {"official": len(o_ids), "etch": len(e_ids)},
        "matching_tokens": matched,
        "first_difference": diff,
        "equal": prompt_equal and diff is None,
        "official_text": official["text"],
        "etch_text": etch["text"],
        "official_generated_token_ids": o_ids,
        "etch_generated_token_ids": e_ids,
        **extra,
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompts", nargs="*", help="prompts (default: the capital of France, past EOS, and a story)")
    ap.add_argument("--model-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--pte", type=Path, help="program for both runtimes (default MODEL_DIR/model_8da4w.pte), e.g. model.pte")
    ap.add_argument("--etch", type=Path, default=ROOT / "target" / "release" / "etch")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--min-tokens", type=int, default=32, help="fewest generated tokens a prompt must compare")
    ap.add_argument("--ignore-eos", action="store_true", help="decode past EOS for the given prompts")
    ap.add_argument("--threads", type=int, help="threads for both runtimes (default: each one's own)")
    ap.add_argument("--official-variants", action="store_true",
                    help="run the official runtime with MKL, MKL_CBWR=COMPATIBLE and Eigen BLAS (see above)")
    args = ap.parse_args(argv)
    if not args.etch.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "etch-cli"], cwd=ROOT, check=True)
    prompts = [(p, args.ignore_eos) for p in args.prompts] or DEFAULT_PROMPTS

    results = [compare(args, p, ignore_eos) for p, ignore_eos in prompts]
    if args.official_variants:
        ok = all(r["within_official_spread"] for r in results)
    else:
        ok = all(r["equal"] and r["matching_tokens"] >= args.min_tokens for r in results)
    print(json.dumps({"model_dir": str(args.model_dir), "max_new_tokens": args.max_new_tokens,
                      "min_tokens": args.min_tokens, "all_equal": ok, "prompts": results},
                     indent=1, ensure_ascii=False))
    for r in results:
        status = "equal" if r["equal"] else f"DIFFER at generated token {r['first_difference']}"
        print(f"{status}: {r['matching_tokens']} of {r['generated_tokens']['official']} generated tokens match "
              f"({r['prompt_tokens']} prompt tokens, ignore_eos={r['ignore_eos']}): {r['prompt']!r}", file=sys.stderr)
        if args.official_variants:
            print(f"  official variants agree on {r['official_agreement']} tokens; etch matches "
                  f"{r['etch_matching_tokens_per_variant']}: "
                  f"{'within' if r['within_official_spread'] else 'OUTSIDE'} the official spread", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
