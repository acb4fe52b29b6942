#!/usr/bin/env bash
# The README's test command: every Rust test of the workspace, then the Python
# bindings' tests (bindings/python/tests) against an extension built into a throwaway
# virtual environment, then serving end to end over HTTP (tools/test-serving.sh:
# ExecuTorch 1.5.1's own LLM server driving etch-worker, and `etch serve`).
#
#   tools/test-all.sh                        # all three
#   ETCH_TEST_RUST=0 tools/test-all.sh       # without the Rust tests (says so)
#   ETCH_TEST_PYTHON=0 tools/test-all.sh     # without the bindings' tests (says so)
#   ETCH_TEST_SERVING=0 tools/test-all.sh    # without the serving tests (says so)
#
# The Python part needs python3 (3.9 or later, with venv) and pip access to numpy,
# pytest, maturin and mypy (for its stubtest of the type stubs): PyPI, or whatever
# PIP_INDEX_URL / PIP_FIND_LINKS point at. The serving part needs Python 3.10-3.14
# and pip access to executorch==1.5.1, fastapi, uvicorn, pydantic and pytest.
# PYTHON picks the interpreter. The extension is built with the `quick` profile of
# bindings/python/Cargo.toml (opt-level 1: the tests need answers, not speed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ "${ETCH_TEST_RUST:-1}" = "0" ]; then
    echo "== cargo test --workspace: SKIPPED (ETCH_TEST_RUST=0)"
else
    echo "== cargo test --workspace"
    cargo test --workspace
fi

if [ "${ETCH_TEST_PYTHON:-1}" = "0" ]; then
    echo "== Python bindings: SKIPPED (ETCH_TEST_PYTHON=0)"
else
    # A subshell: its trap and cd stay inside.
    (
        echo "== Python bindings (bindings/python)"
        python=${PYTHON:-python3}
        if ! "$python" -c 'import sys, venv; assert sys.version_info >= (3, 9)' 2>/dev/null; then
            echo "error: $python is missing or older than 3.9 (set PYTHON, or ETCH_TEST_PYTHON=0 to skip)" >&2
            exit 1
        fi
        scratch=$(mktemp -d "${TMPDIR:-/tmp}/etch-python-test.XXXXXX")
        trap 'rm -rf "$scratch"' EXIT
        "$python" -m venv "$scratch/venv"
        venv_python="$scratch/venv/bin/python"
        "$venv_python" -m pip install --quiet --disable-pip-version-check numpy pytest 'maturin>=1.5,<2' mypy
        (
            cd bindings/python
            "$scratch/venv/bin/maturin" build --quiet --profile quick \
                --interpreter "$venv_python" --out "$scratch/wheels"
        )
        "$venv_python" -m pip install --quiet --disable-pip-version-check --no-deps "$scratch"/wheels/*.whl
        # From outside the source tree, so `import etch` is the installed wheel.
        cd "$scratch"
        ETCH_REPO="$root" "$venv_python" -m pytest -q -p no:cacheprovider "$root/bindings/python/tests"
    )
fi

if [ "${ETCH_TEST_SERVING:-1}" = "0" ]; then
    echo "== Serving (tests/serving): SKIPPED (ETCH_TEST_SERVING=0)"
else
    echo "== Serving (tests/serving): tools/test-serving.sh"
    tools/test-serving.sh
fi
