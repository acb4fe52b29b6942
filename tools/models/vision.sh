#!/usr/bin/env bash
# Full-size MobileNetV2 and ResNet-18 (224x224, random weights) as ExecuTorch
# programs for benchmarks, XNNPACK-delegated and portable, with the official
# runtime's outputs and latencies, in models/vision/ (git-ignored):
#
#   tools/models/vision.sh [--force] [--runs N] [--portable-runs N] [--threads N] [--only mobilenet_v2|resnet18 ...]
#
# See tools/models/vision.py and tools/models/README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${FIXTURES_VENV:-$root/tools/fixtures/.venv}"  # another checkout's venv may be named here
py="$venv/bin/python"
if [ ! -x "$py" ]; then
    echo "[vision] $venv is missing: running tools/fixtures/setup.sh"
    "$root/tools/fixtures/setup.sh"
fi
"$py" -c "import torchvision, executorch.runtime" \
    || { echo "[vision] the toolchain venv lacks torchvision; rerun tools/fixtures/setup.sh" >&2; exit 1; }
exec "$py" "$here/vision.py" "$@"
