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

Usage (from the repository root, after ``tools/models/smollm2.sh``)::

    tools/fixtures/.venv/bin/python tools/models/compare_greedy.py \\
        [--model-dir models/smollm2-135m-instruct] [--pte FILE] [--max-new-tokens 48] [--threads N] \\
        [--etch target/release/etch] [PROMPT ...]
"""

from __future__ import annotations

import argparse
import json
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


def run_json(cmd: List[str]) -> Dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def first_difference(a: List[int], b: List[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(args: argparse.Namespace, prompt: str, ignore_eos: bool) -> Dict[str, Any]:
    d = args.model_dir
    pte = args.pte or d / "model.pte"
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
    official = run_json(official_cmd)
    etch = run_json(etch_cmd)
    o_ids, e_ids = official["generated_token_ids"], etch["generated_token_ids"]
    prompt_equal = official["prompt_token_ids"] == etch["prompt_token_ids"]
    diff = first_difference(o_ids, e_ids)
    matched = len(o_ids) if diff is None else diff
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
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompts", nargs="*", help="prompts (default: the capital of France, past EOS, and a story)")
    ap.add_argument("--model-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--pte", type=Path, help="program for both runtimes (default MODEL_DIR/model.pte), e.g. model_8da4w.pte")
    ap.add_argument("--etch", type=Path, default=ROOT / "target" / "release" / "etch")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--min-tokens", type=int, default=32, help="fewest generated tokens a prompt must compare")
    ap.add_argument("--ignore-eos", action="store_true", help="decode past EOS for the given prompts")
    ap.add_argument("--threads", type=int, help="threads for both runtimes (default: each one's own)")
    args = ap.parse_args(argv)
    if not args.etch.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "etch-cli"], cwd=ROOT, check=True)
    prompts = [(p, args.ignore_eos) for p in args.prompts] or DEFAULT_PROMPTS

    results = [compare(args, p, ignore_eos) for p, ignore_eos in prompts]
    ok = all(r["equal"] and r["matching_tokens"] >= args.min_tokens for r in results)
    print(json.dumps({"model_dir": str(args.model_dir), "max_new_tokens": args.max_new_tokens,
                      "min_tokens": args.min_tokens, "all_equal": ok, "prompts": results},
                     indent=1, ensure_ascii=False))
    for r in results:
        status = "equal" if r["equal"] else f"DIFFER at generated token {r['first_difference']}"
        print(f"{status}: {r['matching_tokens']} of {r['generated_tokens']['official']} generated tokens match "
              f"({r['prompt_tokens']} prompt tokens, ignore_eos={r['ignore_eos']}): {r['prompt']!r}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
