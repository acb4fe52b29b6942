#!/usr/bin/env bash
# etch vs the official ExecuTorch runtime on the same .pte, same prompt ids
# (bench/prompt_ids.py, 128 tokens), 64 decoded tokens ignoring EOS.
# Prints a markdown table for BENCHMARKS.md (medians of --runs).
# Usage: bench/compare.sh [--runs 3] [--threads "1 2"] [--no-allocs] [--no-build] [--model-dir DIR]
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/tools/fixtures/.venv/bin/python}"
RUNS=3; THREADS="1 2"; ALLOCS=1; BUILD=1
DIR="$ROOT/models/smollm2-135m-instruct"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2;;
    --threads) THREADS="$2"; shift 2;;
    --no-allocs) ALLOCS=0; shift;;
    --no-build) BUILD=0; shift;;
    --model-dir) DIR="$2"; shift 2;;
    *) echo "unknown arg $1" >&2; exit 2;;
  esac
done
PTE="$DIR/model.pte"; XPTE="$DIR/model_xnnpack.pte"; TOK="$DIR/tokenizer.json"
ETCH="$ROOT/target/release/etch"; HW="$ROOT/target/release/hwlimits"
OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT
cd "$ROOT"
if [ "$BUILD" = 1 ]; then
  cargo build --release -p etch-cli >&2 || echo "etch build failed" >&2
  cargo build --release -p etch-bench >&2 || echo "etch-bench build failed (no hwlimits)" >&2
fi
IDS="$("$PY" "$ROOT/bench/prompt_ids.py" 128)"

for t in $THREADS; do
  # etch: one JSON per run
  for r in $(seq "$RUNS"); do
    if [ -x "$ETCH" ]; then
      "$ETCH" generate --model "$PTE" --tokenizer "$TOK" --prompt-token-ids "$IDS" --max-new-tokens 64 \
        --ignore-eos --threads "$t" --json >"$OUT/etch_t${t}_r$r.json" 2>"$OUT/etch_t${t}_r$r.err" \
        || echo "etch run failed (threads $t): $(tail -3 "$OUT/etch_t${t}_r$r.err")" >&2
    fi
  done
  for f in "$PTE" "$XPTE"; do
    [ -f "$f" ] || continue
    b="$(basename "$f" .pte)"
    "$PY" "$ROOT/bench/official_bench.py" --pte "$f" --prompt-len 128 --decode 64 --threads "$t" --runs "$RUNS" \
      >"$OUT/off_${b}_t$t.json" 2>"$OUT/off_${b}_t$t.err" || echo "official run failed ($b, threads $t)" >&2
    if [ "$ALLOCS" = 1 ]; then
      "$ROOT/bench/official_allocs.sh" --pte "$f" --threads "$t" >"$OUT/alloc_${b}_t$t.json" 2>/dev/null \
        || echo "official alloc count failed ($b, threads $t)" >&2
    fi
  done
done
if [ -x "$HW" ]; then
  for t in 1 2; do "$HW" "$t" >"$OUT/hw_t$t.json" 2>/dev/null || true; done
fi

"$PY" - "$OUT" "$PTE" "$XPTE" "$THREADS" <<'PYEOF'
import glob, json, os, statistics, sys, subprocess, datetime
out, pte, xpte, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()

def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except Exception:
        return None

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def fmt(x, nd=1):
    return "n/a" if x is None else f"{x:.{nd}f}"

rows, etch_by_t, off_by_t = [], {}, {}
for t in threads:
    runs = [load(p) for p in sorted(glob.glob(f"{out}/etch_t{t}_r*.json"))]
    st = [r.get("stats", r) for r in runs if r]
    if st:
        e = {k: med([s.get(k) for s in st]) for k in ("load_ms", "time_to_first_token_ms", "prefill_tokens_per_second",
                                                      "decode_tokens_per_second", "peak_rss_bytes",
                                                      "heap_allocations_per_decoded_token")}
        etch_by_t[t] = e
        rows.append(("etch", os.path.basename(pte), t, e["load_ms"], e["prefill_tokens_per_second"],
                     e["decode_tokens_per_second"], e["peak_rss_bytes"], e["heap_allocations_per_decoded_token"]))
    else:
        rows.append(("etch", os.path.basename(pte), t, None, None, None, None, None))
    for f in (pte, xpte):
        b = os.path.basename(f)[:-4]
        o = load(f"{out}/off_{b}_t{t}.json")
        if not os.path.exists(f):
            continue
        a = load(f"{out}/alloc_{b}_t{t}.json") or {}
        if o:
            if f == pte:
                off_by_t[t] = o
            rows.append(("official (python)", os.path.basename(f), t, o["load_ms"], o["prefill_tokens_per_second"],
                         o["decode_tokens_per_second"], o["peak_rss_bytes"], a.get("heap_allocations_per_decoded_token")))

def ratio(r):
    if r[0] != "etch" or r[2] not in off_by_t or r[5] is None:
        return ""
    o = off_by_t[r[2]]
    parts = []
    if r[4] and o["prefill_tokens_per_second"]:
        parts.append(f"prefill {r[4] / o['prefill_tokens_per_second']:.2f}x")
    if r[5] and o["decode_tokens_per_second"]:
        parts.append(f"decode {r[5] / o['decode_tokens_per_second']:.2f}x")
    return ", ".join(parts)

cpu = "?"
cores = os.cpu_count()
try:
    for ln in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if ln.startswith("Model name:"):
            cpu = ln.split(":", 1)[1].strip()
except Exception:
    pass
print(f"Date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; CPU: {cpu}; {cores} logical cores (os.cpu_count); "
      f"prompt 128 fixed ids (bench/prompt_ids.py), 64 decoded tokens ignoring EOS, medians of runs.")
print()
print("| runtime | file | threads | load ms | prefill tok/s (128) | decode tok/s (64) | peak RSS MiB | heap allocs/token | ratio etch/official |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    rss = None if r[6] is None else r[6] / 2**20
    print(f"| {r[0]} | {r[1]} | {r[2]} | {fmt(r[3], 0)} | {fmt(r[4])} | {fmt(r[5])} | {fmt(rss, 0)} | {fmt(r[7], 1)} | {ratio(r)} |")
print()
print("Official figures use the Python API loop (executorch.runtime, one forward.execute per token): they include "
      "binding overhead; its allocs/token also count the bindings' tensor glue.")

# roofline-ish line
size = os.path.getsize(pte)  # constant segment ~ file size (fp32 weights)
params = size / 4
for t in ("1", "2"):
    hw = load(f"{out}/hw_t{t}.json")
    if not hw:
        continue
    bw, flops = hw["triad_bytes_per_second"], hw["fma_f32_flops"]
    dec_limit = bw / size
    pre_limit = flops / (2 * params)  # tokens/s at peak FLOP/s
    line = (f"hwlimits {t} thread(s): triad {bw/1e9:.1f} GB/s, FMA peak {flops/1e9:.1f} GFLOP/s -> "
            f"decode limit {dec_limit:.1f} tok/s ({size/2**20:.0f} MiB weights/token), prefill limit {pre_limit:.1f} tok/s "
            f"(2*{params/1e6:.0f}M params FLOP/token)")
    for name, d in (("etch", etch_by_t.get(t)), ("official", off_by_t.get(t))):
        if d and d.get("decode_tokens_per_second"):
            line += f"; {name}: decode {100*d['decode_tokens_per_second']/dec_limit:.0f}% of bandwidth limit"
        if d and d.get("prefill_tokens_per_second"):
            line += f", prefill {100*d['prefill_tokens_per_second']/pre_limit:.0f}% of peak FLOP/s"
    print(line + ".")
PYEOF
