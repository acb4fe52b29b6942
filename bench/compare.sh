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
#   llama.cpp (--llama-cpp)   llama-bench -p 128 -n 64 -r 1 per run on model_q4_0.gguf: the
#                             same SmolLM2 weights as the 8da4w file, requantized to Q4_0
#                             (bench/llama_cpp.sh builds llama.cpp from PyPI's sdist and
#                             writes the GGUF); the peer for model_8da4w.pte
# for each file of --files present in the model directory: model.pte (not delegated),
# model_xnnpack.pte (fp32 through the XNNPACK delegate) and model_8da4w.pte (8da4w through
# XNNPACK), built by tools/models/smollm2.sh [--xnnpack] [--8da4w]. The mmap row runs for
# model.pte only.
# Heap allocations per decoded token: etch from its counting allocator; official from an
# LD_PRELOAD malloc counter (bench/official_allocs.sh), difference of 64 and 16 tokens.
# The physical limits come from hwlimits (triad bandwidth, FMA peak).
# Prints markdown for BENCHMARKS.md on stdout; progress on stderr.
#
# Usage: bench/compare.sh [--runs 3] [--threads "1 2"] [--settle 5] [--no-allocs] [--no-python] [--no-build]
#                         [--model-dir DIR] [--files "model model_xnnpack model_8da4w"] [--no-mmap]
#                         [--llama-cpp]
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/tools/fixtures/.venv/bin/python}"
RUNS=3; THREADS="1 2"; ALLOCS=1; PYTHON=1; BUILD=1; SETTLE=5; MMAP=1; LLAMA=0
FILES="model model_xnnpack model_8da4w"
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
    --files) FILES="$2"; shift 2;;
    --no-mmap) MMAP=0; shift;;
    --llama-cpp) LLAMA=1; shift;;
    *) echo "unknown arg $1" >&2; exit 2;;
  esac
done
PTE="$DIR/model.pte"; TOK="$DIR/tokenizer.json"
PRESENT=""
for b in $FILES; do
  if [ -f "$DIR/$b.pte" ]; then PRESENT="$PRESENT $b"; else echo "[compare] missing $DIR/$b.pte, skipped" >&2; fi
done
ETCH="$ROOT/target/release/etch"; HW="$ROOT/target/release/hwlimits"
GGUF="$DIR/model_q4_0.gguf"; LLAMA_BENCH=""
if [ "$LLAMA" = 1 ]; then
  # builds once, then only prints the path
  LLAMA_BENCH="$(bench/llama_cpp.sh)" || { echo "[compare] bench/llama_cpp.sh failed: no llama.cpp rows" >&2; LLAMA=0; }
fi
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
    for b in $PRESENT; do
      say "run $r/$RUNS, $t thread(s): etch, $b"
      "$ETCH" bench --model "$DIR/$b.pte" --tokenizer "$TOK" -p 128 -n 64 -r 1 --warmup 0 -t "$t" --json \
        >"$OUT/etch_${b}_t${t}_r$r.json" 2>"$OUT/etch_${b}_t${t}_r$r.err" \
        || say "etch run failed ($b): $(tail -3 "$OUT/etch_${b}_t${t}_r$r.err")"
      if [ "$b" = model ] && [ "$MMAP" = 1 ]; then
        say "run $r/$RUNS, $t thread(s): etch --load mmap, $b"
        "$ETCH" bench --model "$DIR/$b.pte" --tokenizer "$TOK" -p 128 -n 64 -r 1 --warmup 0 -t "$t" --load mmap --json \
          >"$OUT/etchmmap_${b}_t${t}_r$r.json" 2>/dev/null || say "etch --load mmap run failed"
      fi
      say "run $r/$RUNS, $t thread(s): official C++ runner, $b"
      "$PY" "$ROOT/bench/official_runner_bench.py" --pte "$DIR/$b.pte" --tokenizer "$TOK" --prompt-len 128 --decode 64 \
        --threads "$t" >"$OUT/runner_${b}_t${t}_r$r.json" 2>/dev/null || say "official runner failed ($b)"
    done
    if [ "$LLAMA" = 1 ]; then
      say "run $r/$RUNS, $t thread(s): llama.cpp, model_q4_0.gguf"
      "$LLAMA_BENCH" -m "$GGUF" -p 128 -n 64 -r 1 -t "$t" -o json >"$OUT/llama_t${t}_r$r.json" 2>/dev/null \
        || say "llama-bench failed"
    fi
  done
done
for t in $THREADS; do
  for b in $PRESENT; do
    f="$DIR/$b.pte"
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

"$PY" - "$OUT" "$DIR" "$THREADS" "$RUNS" "$PRESENT" <<'PYEOF'
import datetime, glob, json, os, statistics, subprocess, sys
out, model_dir, threads, runs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
files = sys.argv[5].split()

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
    for b in files:
        rows[("etch", f"{b}.pte", t)] = summary([load(p) for p in sorted(glob.glob(f"{out}/etch_{b}_t{t}_r*.json"))])
        mm = sorted(glob.glob(f"{out}/etchmmap_{b}_t{t}_r*.json"))
        if mm:
            rows[("etch --load mmap", f"{b}.pte", t)] = summary([load(p) for p in mm])
        rows[("official (C++ runner)", f"{b}.pte", t)] = summary(
            [load(p) for p in sorted(glob.glob(f"{out}/runner_{b}_t{t}_r*.json"))], load(f"{out}/alloc_runner_{b}_t{t}.json"))
        py = load(f"{out}/python_{b}_t{t}.json")
        if py:
            rows[("official (python loop)", f"{b}.pte", t)] = summary([py], load(f"{out}/alloc_python_{b}_t{t}.json"))

def llama_run(p):
    # llama-bench -o json: one record per test, the prompt test (n_gen 0) and the
    # generation test (n_prompt 0), with their mean tokens per second
    recs = load(p)
    if not recs:
        return None
    r = {}
    for rec in recs:
        if rec.get("n_gen") == 0:
            r["prefill_tokens_per_second"] = rec.get("avg_ts")
        elif rec.get("n_prompt") == 0:
            r["decode_tokens_per_second"] = rec.get("avg_ts")
    return r

for t in threads:
    runs_l = [llama_run(p) for p in sorted(glob.glob(f"{out}/llama_t{t}_r*.json"))]
    if runs_l:
        rows[("llama.cpp (llama-bench)", "model_q4_0.gguf", t)] = summary([r for r in runs_l if r])

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
print("Ratios, etch / peer (above 1: etch faster; RSS below 1: etch smaller):")
print()
print("| threads | etch file vs | prefill | decode | peak RSS |")
print("|---|---|---|---|---|")
def ratio(a, b, k):
    return f"{a[k] / b[k]:.2f}x" if a and b and a.get(k) and b.get(k) else "n/a"
for t in threads:
    for b in files:
        e = rows.get(("etch", f"{b}.pte", t))
        against = [("official (C++ runner)", f"{b}.pte"), ("official (python loop)", f"{b}.pte")]
        if b == "model":
            against.append(("official (C++ runner)", "model_xnnpack.pte"))
        else:
            against.append(("etch", "model.pte"))
        if b == "model_8da4w":
            against.append(("llama.cpp (llama-bench)", "model_q4_0.gguf"))
        for key in against:
            o = rows.get((key[0], key[1], t))
            if e is None or o is None:
                continue
            print(f"| {t} | etch {b}.pte vs {key[0]}, {key[1]} | {ratio(e, o, 'prefill_tokens_per_second')} | "
                  f"{ratio(e, o, 'decode_tokens_per_second')} | {ratio(e, o, 'peak_rss_bytes')} |")
print()

# physical limits: decode streams every weight of the file once per token (the file
# size stands for its weights); prefill does 2 FLOPs per weight of the layers per token
# (the output head runs for the last position only), counted from the fp32 model.
p = load(os.path.join(model_dir, "params.json")) or {}
fp32 = os.path.join(model_dir, "model.pte")
layer_params = None
if p and os.path.exists(fp32):
    layer_params = os.path.getsize(fp32) / 4 - p["vocab_size"] * p["dim"]
for t in threads:
    hw = load(f"{out}/hw_t{t}.json")
    if not hw:
        continue
    bw, flops = hw["triad_bytes_per_second"], hw["fma_f32_flops"]
    read = hw.get("read_bytes_per_second")
    pre_limit = flops / (2 * layer_params) if layer_params else None
    line = (f"- {t} thread(s): triad {bw / 1e9:.1f} GB/s"
            + (f" (read-only {read / 1e9:.1f} GB/s)" if read else "")
            + f", FMA peak {flops / 1e9:.1f} GFLOP/s"
            + (f", fp32 prefill bound {pre_limit:.0f} tok/s ({2 * layer_params / 1e6:.0f} MFLOP per token)"
               if pre_limit else "") + ".")
    print(line)
    for b in files:
        weight_bytes = os.path.getsize(os.path.join(model_dir, f"{b}.pte"))
        dec_limit = bw / weight_bytes
        line = (f"  - {b}.pte: {weight_bytes / 2**20:.0f} MiB per token, decode bound from the triad "
                f"{dec_limit:.1f} tok/s" + (f" (read-only {read / weight_bytes:.1f})" if read else ""))
        for rt in ("etch", "official (C++ runner)"):
            s = rows.get((rt, f"{b}.pte", t))
            if s and s.get("decode_tokens_per_second"):
                line += f"; {rt}: decode {100 * s['decode_tokens_per_second'] / dec_limit:.0f}%"
                if pre_limit and b != "model_8da4w" and s.get("prefill_tokens_per_second"):
                    line += f", prefill {100 * s['prefill_tokens_per_second'] / pre_limit:.0f}%"
        print(line + ".")
PYEOF
