#!/usr/bin/env bash
# etch chat on SmolLM2 through a pipe: turn 2 must prefill turn 2 only (the previous
# reply's last token, its closing and the new user message), never turn 1 again.
# The expected token count comes from the official `tokenizers` package (the fixtures
# venv), not from etch.
# Usage: bench/chat_turns.sh [--model FILE.pte (default: model_8da4w.pte, what smollm2.sh builds)] [--tokenizer tokenizer.json] [--no-build]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/tools/fixtures/.venv/bin/python}"
DIR="$ROOT/models/smollm2-135m-instruct"
PTE="$DIR/model_8da4w.pte"; TOK="$DIR/tokenizer.json"; BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --model) PTE="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    --no-build) BUILD=0; shift;;
    *) echo "unknown arg $1" >&2; exit 2;;
  esac
done
ETCH="$ROOT/target/release/etch"
[ "$BUILD" = 1 ] && (cd "$ROOT" && cargo build --release -p etch-cli >&2)
OUT="$(mktemp)"; trap 'rm -f "$OUT"' EXIT
T1="What is the capital of France?"
T2="And of Italy?"
printf '%s\n%s\n' "$T1" "$T2" | "$ETCH" chat --model "$PTE" --tokenizer "$TOK" --max-new-tokens 32 --threads 1 --json >"$OUT"
"$PY" - "$OUT" "$TOK" "$T1" "$T2" <<'PYEOF'
import json, sys
from tokenizers import Tokenizer
out, tok_path, t1, t2 = sys.argv[1:]
tok = Tokenizer.from_file(tok_path)
turns = [json.loads(l) for l in open(out)]
assert len(turns) == 2, turns
a, b = turns
n = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
user = lambda t: f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n"
im_end = tok.token_to_id("<|im_end|>")
ended = a["generated_token_ids"][-1] == im_end
closing = n("\n") if ended else n("<|im_end|>\n")
expected = 1 + closing + n(user(t2))
for t in turns:
    print(f"turn {t['turn']}: prefilled {t['prompt_tokens_prefilled']}, context {t['context_tokens']}, "
          f"{len(t['generated_token_ids'])} generated ({t['stop_reason']}): {t['text']!r}")
assert b["prompt_tokens_prefilled"] == expected, (b["prompt_tokens_prefilled"], expected)
assert b["context_tokens"] == a["context_tokens"] + b["prompt_tokens_prefilled"] + len(b["generated_token_ids"]) - 1
assert b["prompt_tokens_prefilled"] < a["prompt_tokens_prefilled"], "turn 2 re-prefilled turn 1"
print(f"ok: turn 2 prefilled {expected} tokens (turn 1's last token, closing {closing}, its user message {n(user(t2))})")
PYEOF
