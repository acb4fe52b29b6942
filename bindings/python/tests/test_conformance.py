"""Every committed conformance fixture through both APIs (``etch`` and
``etch.runtime``), compared with the official runtime's recorded outputs.

Calls of one method share one session, so the tiny llama fixtures carry their KV cache
from the prefill call to the decode calls, as the official runtime's did when the
outputs were recorded.
"""

from typing import Any, Callable, Dict, List

import pytest

import etch
import etch.runtime
from conftest import FIXTURES, check_output, expected_failures, fixture_params, load_io, manifest

FIXTURE_LIST = manifest()["fixtures"]
BY_NAME = {f["name"]: f for f in FIXTURE_LIST}


def native_runner(fixture: Dict[str, Any]) -> Callable[[str, List[Any]], List[Any]]:
    program = etch.load(FIXTURES / fixture["pte"])
    sessions: Dict[str, etch.Method] = {}

    def call(method: str, inputs: List[Any]) -> List[Any]:
        if method not in sessions:
            sessions[method] = program.method(method)
        return sessions[method](*inputs)

    return call


def runtime_runner(fixture: Dict[str, Any]) -> Callable[[str, List[Any]], List[Any]]:
    # From bytes, as scripts that read the file themselves do.
    data = (FIXTURES / fixture["pte"]).read_bytes()
    program = etch.runtime.Runtime.get().load_program(data)

    def call(method: str, inputs: List[Any]) -> List[Any]:
        return list(program.load_method(method).execute(inputs))

    return call


RUNNERS = {"native": native_runner, "runtime": runtime_runner}


def run_fixture(fixture: Dict[str, Any], api: str) -> None:
    call = RUNNERS[api](fixture)
    for k, c in enumerate(fixture["calls"]):
        inputs = [load_io(io) for io in c["inputs"]]
        outputs = call(c["method"], inputs)
        assert len(outputs) == len(c["outputs"]), (
            f"call {k}: {len(outputs)} outputs, expected {len(c['outputs'])}"
        )
        for j, (got, want) in enumerate(zip(outputs, c["outputs"])):
            try:
                check_output(got, want, fixture["rtol"], fixture["atol"])
            except AssertionError as e:
                raise AssertionError(f"call {k} ({c['method']}) output {j}: {e}") from None


@pytest.mark.parametrize("api", sorted(RUNNERS))
@pytest.mark.parametrize("name", fixture_params([f["name"] for f in FIXTURE_LIST]))
def test_fixture(name: str, api: str) -> None:
    run_fixture(BY_NAME[name], api)


def test_expected_failures_are_in_the_manifest() -> None:
    missing = sorted(expected_failures() - set(BY_NAME))
    assert not missing, f"listed as expected failures but not in the manifest: {missing}"


def test_llm_fixtures_have_several_calls() -> None:
    # The KV cache test above is only meaningful with prefill plus decode calls.
    multi = [f["name"] for f in FIXTURE_LIST if f["name"].startswith("tiny_llama") and len(f["calls"]) > 1]
    assert "tiny_llama_fp32" in multi, multi


def test_folding_off_gives_the_official_outputs_too() -> None:
    # A vision fixture whose batch norms fold into its convolutions by default.
    fixture = BY_NAME["vision_resnet"]
    program = etch.load(FIXTURES / fixture["pte"], fold_constants=False)
    session = program.method("forward")
    for c in fixture["calls"]:
        outputs = session(*[load_io(io) for io in c["inputs"]])
        for got, want in zip(outputs, c["outputs"]):
            check_output(got, want, fixture["rtol"], fixture["atol"])
