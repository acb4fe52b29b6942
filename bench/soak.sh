#!/usr/bin/env bash
# Soak test: decodes 20,000 tokens on SmolLM2 in one process, across context resets and
# chat turns (crates/bench/src/bin/soak.rs), and checks that peak resident memory stays
# flat after warm-up and the temp cache within its budget. Not part of CI.
#
# Usage: bench/soak.sh [--model FILE.pte] [--tokenizer tokenizer.json] [--tokens N]
#                      [--every N] [--warmup N] [--threads N] [--load MODE] [--out FILE]
#                      [--no-build]
#        bench/soak.sh --serve [--seconds N] [--model ...] [--tokenizer ...] [--threads N]
#                      [--out FILE] [--no-build] [-- more bench/serve_soak.py flags]
#
# --serve: the serving soak (issue #55). `etch serve` on a loopback port under the load
# mix of bench/serve_load.py with session churn (open, chat, reset, close, abandoned
# streams) for --seconds (default 3600), resident memory and /metrics sampled every
# minute (bench/serve_soak.py); exit status 1 if RSS grew by more than 5% after a
# 10-minute warm-up, a temp cache went over its budget, or an answer was malformed.
# Default model: models/smollm2-135m-instruct/model_8da4w.pte (the fastest), else
# model.pte there; MODELS=DIR points elsewhere. The JSON lines go to --out (default: a
# temporary file) and a summary to stdout. Exit status 1 if the temp cache went over its
# budget or peak RSS grew by more than 5% after warm-up.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODELS="${MODELS:-$ROOT/models/smollm2-135m-instruct}"
PTE=""; TOK=""; TOKENS=20000; EVERY=500; WARMUP=2500; THREADS=0; LOAD=huge-pages
OUT=""; BUILD=1; SERVE=0; SECONDS_TO_RUN=3600; SERVE_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --serve) SERVE=1; shift;;
    --seconds) SECONDS_TO_RUN="$2"; shift 2;;
    --) shift; SERVE_EXTRA=("$@"); break;;
    --model) PTE="$2"; shift 2;;
    --tokenizer) TOK="$2"; shift 2;;
    --tokens) TOKENS="$2"; shift 2;;
    --every) EVERY="$2"; shift 2;;
    --warmup) WARMUP="$2"; shift 2;;
    --threads) THREADS="$2"; shift 2;;
    --load) LOAD="$2"; shift 2;;
    --out) OUT="$2"; shift 2;;
    --no-build) BUILD=0; shift;;
    *) echo "unknown arg $1" >&2; exit 2;;
  esac
done
if [ -z "$PTE" ]; then
  PTE="$MODELS/model_8da4w.pte"
  [ -e "$PTE" ] || PTE="$MODELS/model.pte"
fi
[ -n "$TOK" ] || TOK="$(dirname "$PTE")/tokenizer.json"
for f in "$PTE" "$TOK"; do
  [ -e "$f" ] || { echo "missing $f (tools/models/smollm2.py builds it)" >&2; exit 2; }
done
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if [ "$SERVE" = 1 ]; then
  [ "$BUILD" = 1 ] && (cd "$ROOT" && cargo build --release -p etch-cli --bin etch >&2)
  OUT_ARGS=(); [ -n "$OUT" ] && OUT_ARGS=(--out "$OUT")
  exec python3 "$ROOT/bench/serve_soak.py" --etch "$TARGET/release/etch" --model "$PTE" \
    --tokenizer "$TOK" --seconds "$SECONDS_TO_RUN" --threads "${THREADS/#0/2}" \
    "${OUT_ARGS[@]}" "${SERVE_EXTRA[@]}"
fi
[ "$BUILD" = 1 ] && (cd "$ROOT" && cargo build --release -p etch-bench --bin soak >&2)
if [ -z "$OUT" ]; then OUT="$(mktemp)"; trap 'rm -f "$OUT"' EXIT; fi
echo "soak: $PTE, $TOKENS tokens, report every $EVERY, warm-up $WARMUP" >&2
"$TARGET/release/soak" --model "$PTE" --tokenizer "$TOK" --tokens "$TOKENS" \
  --every "$EVERY" --threads "$THREADS" --load "$LOAD" | tee "$OUT" >&2
python3 - "$OUT" "$WARMUP" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
warmup = int(sys.argv[2])
if not lines:
    sys.exit("soak: no report lines")
mb = lambda b: b / 2**20
warm = next((l for l in lines if l["tokens"] >= warmup), lines[0])
after = [l for l in lines if l["tokens"] >= warm["tokens"]]
end = lines[-1]
budget = end["temp_cache_budget_bytes"]
max_cached = max(l["temp_cached_bytes"] for l in lines)
max_rss = max(l["rss_bytes"] for l in after)
rss_growth = max_rss - warm["rss_bytes"]
hwm_growth = end["peak_rss_bytes"] - warm["peak_rss_bytes"]
print(f"tokens decoded:        {end['tokens']} in {end['elapsed_s']:.0f} s "
      f"({end['chat_turns']} chat turns, {end['context_resets']} context resets)")
print(f"tokens/s:              {end['tokens'] / end['elapsed_s']:.1f} overall (prefill included), "
      f"{end['decode_tok_per_s']:.1f} decode only")
print(f"RSS after warm-up:     {mb(warm['rss_bytes']):.1f} MiB at {warm['tokens']} tokens "
      f"(peak so far {mb(warm['peak_rss_bytes']):.1f} MiB)")
print(f"RSS at the end:        {mb(end['rss_bytes']):.1f} MiB (peak {mb(end['peak_rss_bytes']):.1f} MiB)")
print(f"growth after warm-up:  RSS max {mb(rss_growth):+.2f} MiB, peak RSS {mb(hwm_growth):+.2f} MiB")
print(f"temp cache:            at most {mb(max_cached):.2f} MiB cached of a {mb(budget):.0f} MiB budget; "
      f"most scratch live at once {mb(end['temp_live_peak_bytes']):.2f} MiB; "
      f"{end['temp_hits']} hits, {end['temp_misses']} misses")
bad = []
if max_cached > budget:
    bad.append("the temp cache went over its budget")
if hwm_growth > 0.05 * warm["peak_rss_bytes"]:
    bad.append("peak RSS grew by more than 5% after warm-up")
if bad:
    sys.exit("soak: FAIL: " + "; ".join(bad))
print("soak: ok (peak RSS flat after warm-up, temp cache within budget)")
PYEOF
