"""Shared helpers: the committed conformance fixtures and how to compare with them.

The fixtures (``tests/fixtures`` at the repository root, written by
``tools/fixtures/export.py``) hold the official runtime's recorded outputs; this
mirrors ``crates/runtime/tests/conformance.rs``: same manifest, same tolerances, same
expected-failures list. ``ETCH_REPO`` points at another checkout.
"""

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Set

import numpy as np
import pytest

REPO = Path(os.environ.get("ETCH_REPO", Path(__file__).resolve().parents[3]))
FIXTURES = REPO / "tests" / "fixtures"
EXPECTED_FAILURES_FILE = REPO / "tests" / "conformance" / "expected_failures.txt"
FLOAT_DTYPES = {"f32", "f64", "f16", "bf16"}


def manifest() -> Dict[str, Any]:
    with open(FIXTURES / "manifest.json") as f:
        return json.load(f)


def expected_failures() -> Set[str]:
    if not EXPECTED_FAILURES_FILE.exists():
        return set()
    names = set()
    for line in EXPECTED_FAILURES_FILE.read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.add(name)
    return names


def load_io(io: Dict[str, Any]) -> Any:
    """A manifest input or output as etch takes it: a numpy array (bf16 as uint16
    bits, as recorded) or a Python scalar."""
    if "npy" in io:
        return np.load(FIXTURES / io["npy"])
    for key in ("int", "double", "bool"):
        if key in io:
            return io[key]
    return None


def _as_float(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def check_output(got: Any, want_io: Dict[str, Any], rtol: float, atol: float) -> None:
    """Raises AssertionError unless ``got`` matches the recorded output, within the
    fixture's tolerances for floating-point tensors and exactly otherwise."""
    want = load_io(want_io)
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"expected an array, got {type(got).__name__}"
        assert got.dtype == want.dtype, f"dtype {got.dtype} != expected {want.dtype}"
        assert got.shape == want.shape, f"shape {got.shape} != expected {want.shape}"
        dtype = want_io.get("dtype", "f32")
        if dtype in FLOAT_DTYPES:
            a, b = _as_float(got, dtype), _as_float(want, dtype)
            ok = (np.isnan(a) & np.isnan(b)) | (a == b) | (np.abs(a - b) <= atol + rtol * np.abs(b))
            if not ok.all():
                i = int(np.argmax(np.where(ok, 0.0, np.nan_to_num(np.abs(a - b), nan=np.inf) + 1.0)))
                raise AssertionError(
                    f"element {i}: {a.flat[i]} vs expected {b.flat[i]} (rtol {rtol}, atol {atol})"
                )
        else:
            assert np.array_equal(got, want), f"{dtype} data differs"
    elif isinstance(want, float):
        assert isinstance(got, float) and abs(got - want) <= atol + rtol * abs(want), (
            f"{got!r} != expected {want!r}"
        )
    else:
        assert got == want and type(got) is type(want), f"{got!r} != expected {want!r}"


def fixture_params(names: List[str]) -> List[Any]:
    """pytest params, the expected failures marked strict xfail (a pass fails)."""
    expected = expected_failures()
    return [
        pytest.param(
            name,
            marks=pytest.mark.xfail(
                strict=True,
                reason="listed in tests/conformance/expected_failures.txt; "
                "remove it from there if it passes now",
            ),
        )
        if name in expected
        else name
        for name in names
    ]


def byte_tokenizer(path: Path, extra: int = 0) -> Path:
    """A Hugging Face tokenizer.json with one token per byte (ids 0-255), enough to
    drive the 256-token tiny llama; ``extra`` more tokens make it too big for it."""

    def byte_char(b: int) -> str:
        # GPT-2's byte-to-unicode table, as the ByteLevel pre-tokenizer uses it.
        visible = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        if b in visible:
            return chr(b)
        return chr(256 + sum(1 for x in range(b) if x not in visible))

    vocab = {byte_char(b): b for b in range(256)}
    for i in range(extra):
        vocab[f"extra{i}"] = 256 + i
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    path.write_text(json.dumps(tokenizer))
    return path
