#!/usr/bin/env bash
# How big the caching temp allocator's budget must be: runs etch generate on the same
# prompt ids with --temp-cache-mib 0, 1, 2, 4, 8, 16, 64 and prints, per budget, the
# temp allocator's hits, misses, peak live bytes, heap allocations per decoded token and
# decode tokens/s (a markdown table for BENCHMARKS.md).
# Usage: bench/temp_cache_sweep.sh [--prompt-len 128] [--threads 2] [--model-dir DIR]
#                                  [--file model_8da4w.pte (in --model-dir; model.pte needs smollm2.sh --fp32)]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LEN=128; THREADS=2; DIR="$ROOT/models/smollm2-135m-instruct"; FILE=model_8da4w.pte
while [ $# -gt 0 ]; do
  case "$1" in
    --prompt-len) LEN="$2"; shift 2;;
    --threads) THREADS="$2"; shift 2;;
    --model-dir) DIR="$2"; shift 2;;
    --file) FILE="$2"; shift 2;;
    *) echo "unknown arg $1" >&2; exit 2;;
  esac
done
ETCH="$ROOT/target/release/etch"
[ -x "$ETCH" ] || cargo build --release -p etch-cli >&2
IDS="$(python3 "$ROOT/bench/prompt_ids.py" "$LEN")"
echo "| --temp-cache-mib | hits | misses | peak live temp bytes | heap allocs / decoded token | decode tok/s |"
echo "|---|---|---|---|---|---|"
for mib in 0 1 2 4 8 16 64; do
  "$ETCH" generate --model "$DIR/$FILE" --tokenizer "$DIR/tokenizer.json" --prompt-token-ids "$IDS" \
    --max-new-tokens 64 --ignore-eos --threads "$THREADS" --temp-cache-mib "$mib" --json 2>/dev/null |
    python3 -c "
import json, sys
s = json.load(sys.stdin)['stats']
print(f\"| $mib | {s['temp_allocator_hits']} | {s['temp_allocator_misses']} | {s['temp_allocator_peak_bytes']:,} | {s['heap_allocations_per_decoded_token']:g} | {s['decode_tokens_per_second']:.1f} |\")"
done
