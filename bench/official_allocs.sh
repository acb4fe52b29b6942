#!/usr/bin/env bash
# Heap allocations per decoded token of the official ExecuTorch Python runtime:
# run bench/official_bench.py with --decode 16 and --decode 64 under the
# LD_PRELOAD counter (bench/malloc_count.c); per token = (count64 - count16) / 48.
# Caveat: this is the Python-API loop, so it includes the bindings' own
# allocations per step (torch.tensor inputs, EValue conversion, output tensor,
# argmax), not only the runtime's.
# --runner counts the official C++ text LLM runner instead (bench/official_runner_bench.py,
# no Python per token): per token = (count64 - count16) / (generated64 - generated16).
# Usage: bench/official_allocs.sh [--pte FILE] [--threads N] [--runner]   (prints JSON)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/tools/fixtures/.venv/bin/python}"
PTE="$ROOT/models/smollm2-135m-instruct/model_8da4w.pte"
THREADS=1; RUNNER=0
TOK="$ROOT/models/smollm2-135m-instruct/tokenizer.json"
while [ $# -gt 0 ]; do
  case "$1" in
    --pte) PTE="$2"; shift 2;;
    --threads) THREADS="$2"; shift 2;;
    --runner) RUNNER=1; shift;;
    --tokenizer) TOK="$2"; shift 2;;
    *) echo "unknown arg $1" >&2; exit 2;;
  esac
done
SO="$ROOT/bench/.build/libmalloc_count.so"
mkdir -p "$ROOT/bench/.build"
if [ ! -f "$SO" ] || [ "$ROOT/bench/malloc_count.c" -nt "$SO" ]; then
  cc -O2 -shared -fPIC -o "$SO" "$ROOT/bench/malloc_count.c" -ldl
fi
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
count() { # $1 = decode tokens; prints the total of the python process (first line written = the longest-lived? no: pick the max)
  rm -f "$TMP/c$1"
  if [ "$RUNNER" = 1 ]; then
    LD_PRELOAD="$SO" MALLOC_COUNT_OUT="$TMP/c$1" "$PY" "$ROOT/bench/official_runner_bench.py" --pte "$PTE" \
      --tokenizer "$TOK" --prompt-len 128 --decode "$1" --threads "$THREADS" >"$TMP/j$1" 2>/dev/null
  else
    LD_PRELOAD="$SO" MALLOC_COUNT_OUT="$TMP/c$1" "$PY" "$ROOT/bench/official_bench.py" --pte "$PTE" \
      --prompt-len 128 --decode "$1" --threads "$THREADS" --runs 1 >"$TMP/j$1"
  fi
  # one line per process that ran under the preload; the python process has by far the most
  sed -n 's/.*total=\([0-9]*\).*/\1/p' "$TMP/c$1" | sort -n | tail -1
}
C16="$(count 16)"
C64="$(count 64)"
"$PY" - "$C16" "$C64" "$THREADS" "$PTE" "$RUNNER" "$TMP" <<'PYEOF'
import json, sys
c16, c64, threads, pte, runner, tmp = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1", sys.argv[6]
if runner:
    g16 = json.load(open(f"{tmp}/j16"))["generated_tokens"]
    g64 = json.load(open(f"{tmp}/j64"))["generated_tokens"]
    print(json.dumps({"runtime": "executorch.extension.llm.runner.TextLLMRunner", "pte": pte, "threads": threads,
                      "allocs_decode16": c16, "allocs_decode64": c64, "generated16": g16, "generated64": g64,
                      "heap_allocations_per_decoded_token": round((c64 - c16) / max(1, g64 - g16), 1),
                      "note": "C++ runner loop: no Python per token"}))
else:
    print(json.dumps({"runtime": "executorch.runtime (python)", "pte": pte, "threads": threads,
                      "allocs_decode16": c16, "allocs_decode64": c64,
                      "heap_allocations_per_decoded_token": round((c64 - c16) / 48, 1),
                      "note": "python-API loop: includes binding/tensor-glue allocations"}))
PYEOF
