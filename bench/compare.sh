#!/usr/bin/env bash
# etch vs the official ExecuTorch runtime, on the same .pte files, in one run.
#
# Rows (each at every --threads value, medians of --runs):
#   etch                      etch bench -p 128 -n 64 -r 1 --warmup 0 per run (cold, like the
#                             official rows): 128 prompt ids prefilled,
#                             64 tokens decoded after them ignoring EOS (default load: huge pages)
#   etch --load mmap          the same on a memory map of the page cache
#   official (C++ runner)     the pip package's TextLLMRunner (bench/official_runner_bench.py),
#                             128 tokens of bench/prompt_text.txt, up to 64 new tokens; no
#                             Python per token: the fair official figure
#   official (python)         executorch.runtime's Method in a Python loop
#                             (bench/official_bench.py), the same ids as etch
# for model.pte (not delegated) and model_xnnpack.pte (XNNPACK-delegated, official only).
# Heap allocations per decoded token: etch from its counting allocator; official from an
# LD_PRELOAD malloc counter (bench/official_allocs.sh), difference of 64 and 16 tokens.
# The physical limits come from hwlimits (triad bandwidth, FMA peak).
# Prints markdown for BENCHMARKS.md on stdout; progress on stderr.
#
# Usage: bench/compare.sh [--runs 3] [--threads "1 2"] [--settle 5] [--no-allocs] [--no-python] [--no-build]
#                         [--model-dir DIR]
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/tools/fixtures/.venv/bin/python}"
RUNS=3; THREADS="1 2"; ALLOCS=1; PYTHON=1; BUILD=1; SETTLE=5
DIR="$ROOT/models/smollm2-135m-instruct"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2;;
    --threads) THREADS="$2"; shift 2;;
    --no-allocs) ALLOCS=0; shift;;
    --no-python) PYTHON=0; shift;;
    --no-build) BUILD=0; shift;;
    --model-dir) DIR="$2"; shift 2;;
    --settle) SETTLE="$2"; shift 2;;
    *) echo "unknown arg $1" >&2; exit 2;;
  esac
done
PTE="$DIR/model.pte"; XPTE="$DIR/model_xnnpack.pte"; TOK="$DIR/tokenizer.json"
ETCH="$ROOT/target/release/etch"; HW="$ROOT/target/release/hwlimits"
OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT
cd "$ROOT"
if [ "$BUILD" = 1 ]; then
  cargo build --release -p etch-cli -p etch-bench >&2 || echo "etch build failed" >&2
fi
# Every timed run starts after a pause: the kernel frees and compacts the previous
# process's memory in the background (kcompactd, khugepaged), which on 2 vCPUs takes a
# core from whatever runs next.
say() { echo "[compare $(date +%H:%M:%S)] $*" >&2; sleep "$SETTLE"; }

# Timed runs interleaved (run r of every row, then run r+1), so that the machine's drift
# (a shared VM: its speed moves by 20% within minutes) spreads over all rows alike.
for r in $(seq "$RUNS"); do
  for t in $THREADS; do
    say "run $r/$RUNS, $t thread(s): etch"
    "$ETCH" bench --model "$PTE" --tokenizer "$TOK" -p 128 -n 64 -r 1 --warmup 0 -t "$t" --json \
      >"$OUT/etch_model_t${t}_r$r.json" 2>"$OUT/etch_t${t}_r$r.err" \
      || say "etch run failed: $(tail -3 "$OUT/etch_t${t}_r$r.err")"
    say "run $r/$RUNS, $t thread(s): etch --load mmap"
    "$ETCH" bench --model "$PTE" --tokenizer "$TOK" -p 128 -n 64 -r 1 --warmup 0 -t "$t" --load mmap --json \
      >"$OUT/etchmmap_model_t${t}_r$r.json" 2>/dev/null || say "etch --load mmap run failed"
    for f in "$PTE" "$XPTE"; do
      [ -f "$f" ] || continue
      b="$(basename "$f" .pte)"
      say "run $r/$RUNS, $t thread(s): official C++ runner, $b"
      "$PY" "$ROOT/bench/official_runner_bench.py" --pte "$f" --tokenizer "$TOK" --prompt-len 128 --decode 64 \
        --threads "$t" >"$OUT/runner_${b}_t${t}_r$r.json" 2>/dev/null || say "official runner failed ($b)"
    done
  done
done
for t in $THREADS; do
  for f in "$PTE" "$XPTE"; do
    [ -f "$f" ] || { say "missing $f, skipped"; continue; }
    b="$(basename "$f" .pte)"
    if [ "$PYTHON" = 1 ]; then
      say "official python loop, $b, $t thread(s), $RUNS runs"
      "$PY" "$ROOT/bench/official_bench.py" --pte "$f" --prompt-len 128 --decode 64 --threads "$t" --runs "$RUNS" \
        >"$OUT/python_${b}_t$t.json" 2>/dev/null || say "official python run failed ($b)"
    fi
    if [ "$ALLOCS" = 1 ]; then
      say "official allocation count (LD_PRELOAD), $b, $t thread(s)"
      bench/official_allocs.sh --runner --pte "$f" --tokenizer "$TOK" --threads "$t" \
        >"$OUT/alloc_runner_${b}_t$t.json" 2>/dev/null || say "runner alloc count failed ($b)"
      if [ "$PYTHON" = 1 ]; then
        bench/official_allocs.sh --pte "$f" --threads "$t" >"$OUT/alloc_python_${b}_t$t.json" 2>/dev/null \
          || say "python alloc count failed ($b)"
      fi
    fi
  done
done
if [ -x "$HW" ]; then
  for t in $THREADS; do say "hwlimits $t"; "$HW" "$t" >"$OUT/hw_t$t.json" 2>/dev/null || true; done
fi

"$PY" - "$OUT" "$DIR" "$THREADS" "$RUNS" <<'PYEOF'
import datetime, glob, json, os, statistics, subprocess, sys
out, model_dir, threads, runs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]

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
    return "n/a" if x is None else f"{x:,.{nd}f}"

KEYS = ("load_ms", "prefill_tokens_per_second", "decode_tokens_per_second", "peak_rss_bytes",
        "heap_allocations_per_decoded_token")

def summary(jsons, allocs=None):
    # etch bench --json lists its figures per thread count under "results" (one here);
    # the official scripts put them at the top
    runs = [(j.get("results") or [{}])[0] if "results" in j else j for j in jsons if j]
    if not runs:
        return None
    s = {k: med([r.get(k) for r in runs]) for k in KEYS}
    s["all_decode"] = [r.get("decode_tokens_per_second") for r in runs]
    if allocs is not None:
        s["heap_allocations_per_decoded_token"] = (allocs or {}).get("heap_allocations_per_decoded_token")
    return s

rows = {}  # (runtime, file, threads) -> summary
for t in threads:
    rows[("etch", "model.pte", t)] = summary([load(p) for p in sorted(glob.glob(f"{out}/etch_model_t{t}_r*.json"))])
    rows[("etch --load mmap", "model.pte", t)] = summary(
        [load(p) for p in sorted(glob.glob(f"{out}/etchmmap_model_t{t}_r*.json"))])
    for b in ("model", "model_xnnpack"):
        rows[("official (C++ runner)", f"{b}.pte", t)] = summary(
            [load(p) for p in sorted(glob.glob(f"{out}/runner_{b}_t{t}_r*.json"))], load(f"{out}/alloc_runner_{b}_t{t}.json"))
        py = load(f"{out}/python_{b}_t{t}.json")
        if py:
            rows[("official (python loop)", f"{b}.pte", t)] = summary([py], load(f"{out}/alloc_python_{b}_t{t}.json"))

cpu = "?"
try:
    for ln in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if ln.startswith("Model name:"):
            cpu = ln.split(":", 1)[1].strip()
except Exception:
    pass
load_avg = os.getloadavg()[0]
print(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; CPU: {cpu}; {os.cpu_count()} logical cores; "
      f"load average at the end {load_avg:.2f}. Medians of {runs} runs; prompt 128 tokens, 64 decoded.")
print()
print("| runtime | file | threads | load ms | prefill tok/s | decode tok/s (all runs) | peak RSS MiB | heap allocs / decoded token |")
print("|---|---|---|---|---|---|---|---|")
for (rt, f, t), s in rows.items():
    if s is None:
        print(f"| {rt} | {f} | {t} | failed | | | | |")
        continue
    rss = None if s["peak_rss_bytes"] is None else s["peak_rss_bytes"] / 2**20
    alls = ", ".join(fmt(x) for x in s["all_decode"])
    print(f"| {rt} | {f} | {t} | {fmt(s['load_ms'], 0)} | {fmt(s['prefill_tokens_per_second'])} | "
          f"{fmt(s['decode_tokens_per_second'])} ({alls}) | {fmt(rss, 0)} | {fmt(s['heap_allocations_per_decoded_token'], 1)} |")
print()
print("Ratios, etch / official (above 1: etch faster; RSS below 1: etch smaller):")
print()
print("| threads | against | prefill | decode | peak RSS |")
print("|---|---|---|---|---|")
def ratio(a, b, k):
    return f"{a[k] / b[k]:.2f}x" if a and b and a.get(k) and b.get(k) else "n/a"
for t in threads:
    e = rows.get(("etch", "model.pte", t))
    for key in (("official (C++ runner)", "model.pte"), ("official (python loop)", "model.pte"),
                ("official (C++ runner)", "model_xnnpack.pte")):
        o = rows.get((key[0], key[1], t))
        if o is None:
            continue
        print(f"| {t} | {key[0]}, {key[1]} | {ratio(e, o, 'prefill_tokens_per_second')} | "
              f"{ratio(e, o, 'decode_tokens_per_second')} | {ratio(e, o, 'peak_rss_bytes')} |")
print()

# physical limits: decode streams every weight once per token; prefill does 2 FLOPs per
# weight of the layers per token (the output head runs for the last position only)
p = load(os.path.join(model_dir, "params.json")) or {}
pte = os.path.join(model_dir, "model.pte")
weight_bytes = os.path.getsize(pte) if os.path.exists(pte) else None
layer_params = None
if p and weight_bytes:
    layer_params = weight_bytes / 4 - p["vocab_size"] * p["dim"]
for t in threads:
    hw = load(f"{out}/hw_t{t}.json")
    if not hw or not weight_bytes:
        continue
    bw, flops = hw["triad_bytes_per_second"], hw["fma_f32_flops"]
    read = hw.get("read_bytes_per_second")
    dec_limit = bw / weight_bytes
    line = (f"- {t} thread(s): triad {bw / 1e9:.1f} GB/s"
            + (f" (read-only {read / 1e9:.1f} GB/s, bound {read / weight_bytes:.1f} tok/s)" if read else "")
            + f", FMA peak {flops / 1e9:.1f} GFLOP/s. Decode bound from the triad "
            f"{dec_limit:.1f} tok/s ({weight_bytes / 2**20:.0f} MiB of weights per token)")
    pre_limit = flops / (2 * layer_params) if layer_params else None
    if pre_limit:
        line += f", prefill bound {pre_limit:.0f} tok/s ({2 * layer_params / 1e6:.0f} MFLOP per token)"
    for name, key in (("etch", ("etch", "model.pte")), ("official runner", ("official (C++ runner)", "model.pte")),
                      ("official XNNPACK", ("official (C++ runner)", "model_xnnpack.pte"))):
        s = rows.get((key[0], key[1], t))
        if s and s.get("decode_tokens_per_second"):
            line += f"; {name}: decode {100 * s['decode_tokens_per_second'] / dec_limit:.0f}%"
            if pre_limit and s.get("prefill_tokens_per_second"):
                line += f", prefill {100 * s['prefill_tokens_per_second'] / pre_limit:.0f}%"
    print(line + ".")
PYEOF
