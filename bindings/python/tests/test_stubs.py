"""The type stubs (etch/_etch.pyi) agree with the native module (mypy's stubtest)."""

import subprocess
import sys

import pytest


def test_stubs_match_the_native_module() -> None:
    pytest.importorskip("mypy.stubtest")
    command = [sys.executable, "-m", "mypy.stubtest", "etch._etch"]
    # PyO3 classes are "disjoint bases" (PEP 800); stubs need not say so.
    result = subprocess.run(command + ["--ignore-disjoint-bases"], capture_output=True, text=True)
    if "unrecognized arguments" in result.stderr:  # a mypy older than that check
        result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
