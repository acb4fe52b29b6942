#!/usr/bin/env bash
# Which library the official optimized kernels' sgemm_ calls bind to, for both
# import orders (torch first vs executorch.runtime first). Uses the dynamic
# linker's own trace (LD_BIND_NOW resolves every PLT entry at load time).
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/tools/fixtures/.venv/bin/python}"
for order in torch-first et-first; do
  if [ "$order" = torch-first ]; then code='import torch; from executorch.runtime import Runtime; import executorch.extension.llm.custom_ops.custom_ops'
  else code='from executorch.runtime import Runtime; import torch; import executorch.extension.llm.custom_ops.custom_ops'; fi
  echo "== $order"
  LD_BIND_NOW=1 LD_DEBUG=bindings "$PY" -c "$code" 2>&1 >/dev/null \
    | grep -E "binding file .*executorch.* to .*: normal symbol \`sgemm_'" \
    | sed -E 's/^ *[0-9]+: *//; s#[^ ]*/site-packages/##g' | sort -u
done
