"""The native API and the compatibility layer beyond the fixtures: input conversion,
bad inputs, sessions, metadata, loading."""

import threading

import numpy as np
import pytest

import etch
import etch.runtime
from conftest import FIXTURES, check_output, load_io, manifest

TINY_LLAMA = FIXTURES / "tiny_llama_fp32.pte"
LLAMA_DIR = FIXTURES / "tiny_llama_fp32"


def llama_call(k: int):
    return [np.load(LLAMA_DIR / f"call{k}.in0.npy"), np.load(LLAMA_DIR / f"call{k}.in1.npy")]


LLAMA_FIXTURE = next(f for f in manifest()["fixtures"] if f["name"] == "tiny_llama_fp32")
TOL = (LLAMA_FIXTURE["rtol"], LLAMA_FIXTURE["atol"])


def llama_out(k: int) -> dict:
    return {"npy": f"tiny_llama_fp32/call{k}.out0.npy", "dtype": "f32"}


@pytest.fixture(scope="module")
def llama() -> etch.Program:
    return etch.load(TINY_LLAMA)


def test_package_exports_the_native_api() -> None:
    expected = {"EtchError", "InputError", "Method", "MethodMeta", "Program", "TextGenerator",
                "TextStream", "ValueMeta", "__version__", "backend_names", "load", "operator_names"}
    assert expected <= set(etch.__all__)
    for name in etch.__all__:
        assert getattr(etch, name) is getattr(etch._etch, name)


class ArrayLike:
    """An object numpy converts through ``__array__``, as it does torch tensors."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)


def test_inputs_convert_from_lists_scalars_and_array_likes(llama: etch.Program) -> None:
    tokens, pos = llama_call(0)
    want = llama_out(0)
    check_output(llama.method("forward")(tokens.tolist(), pos.tolist())[0], want, *TOL)
    check_output(llama.method("forward")(ArrayLike(tokens), ArrayLike(pos))[0], want, *TOL)
    # int32 lists become the int64 the program takes; non-contiguous arrays are copied.
    strided = np.stack([tokens[0], tokens[0]], axis=1)[:, 0][None, :]
    assert not strided.flags.c_contiguous
    check_output(llama.method("forward").execute((strided, pos))[0], want, *TOL)


def test_sessions_keep_their_own_kv_cache(llama: etch.Program) -> None:
    a, b = llama.method("forward"), llama.method("forward")
    a(*llama_call(0))
    b(*llama_call(0))
    check_output(a(*llama_call(1))[0], llama_out(1), *TOL)
    check_output(a(*llama_call(2))[0], llama_out(2), *TOL)
    # b is one step behind a and still sees its own history.
    check_output(b(*llama_call(1))[0], llama_out(1), *TOL)


def test_outputs_are_owned_copies(llama: etch.Program) -> None:
    m = llama.method("forward")
    first = m(*llama_call(0))[0]
    kept = first.copy()
    assert first.flags.writeable and first.flags.c_contiguous
    m(*llama_call(1))
    assert np.array_equal(first, kept), "the next call must not overwrite returned outputs"


def test_stats_count_executions_and_time_inside_the_runtime(llama: etch.Program) -> None:
    m = llama.method("forward")
    assert m.stats["executions"] == 0 and m.stats["run_ns"] == 0
    m(*llama_call(0))
    stats = m.stats
    assert stats["executions"] == 1 and stats["run_ns"] > 0 and stats["planned_bytes"] > 0


def test_scalar_outputs_are_python_scalars(llama: etch.Program) -> None:
    assert llama.method("get_max_seq_len").execute([]) == [32]
    assert llama.method("use_kv_cache")() == [True]


@pytest.mark.parametrize(
    "inputs, words",
    [
        ([np.zeros((1, 2), np.float32), np.zeros(1, np.int64)], ["input 0", "int64", "float32"]),
        ([np.zeros((1, 2), np.int64)], ["takes 2 inputs", "got 1"]),
        ([np.zeros((1, 2), np.int64)] * 3, ["takes 2 inputs", "got 3"]),
        ([np.zeros((1, 100), np.int64), np.zeros(1, np.int64)], ["input 0", "bound"]),
        ([np.zeros((1, 2), np.int64), np.zeros((2, 2), np.int64)], ["input 1", "shape"]),
        ([[[1.5, 2.5]], [0]], ["input 0", "int64", "float64"]),
        ([np.zeros((1, 2), np.int64), "text"], ["input 1"]),
        ([np.zeros((1, 2), np.int64), object()], ["input 1"]),
    ],
)
def test_bad_inputs_raise_value_errors_naming_the_input(llama: etch.Program, inputs, words) -> None:
    m = llama.method("forward")
    with pytest.raises(ValueError) as info:
        m.execute(inputs)
    assert isinstance(info.value, etch.InputError)
    # Scripts written for executorch.runtime catch RuntimeError.
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    for word in words:
        assert word in message, message
    # The session still works after a rejected call.
    check_output(m(*llama_call(0))[0], llama_out(0), *TOL)


def test_inputs_must_be_a_sequence(llama: etch.Program) -> None:
    with pytest.raises(ValueError, match="sequence"):
        llama.method("forward").execute(3)


def test_scalar_inputs_are_checked_against_the_traced_value() -> None:
    fixture = next(f for f in manifest()["fixtures"] if f["name"] == "scalar_inputs")
    call = fixture["calls"][0]
    inputs = [load_io(io) for io in call["inputs"]]
    m = etch.load(FIXTURES / fixture["pte"]).method(call["method"])
    m.execute(inputs)
    index = next(i for i, io in enumerate(call["inputs"]) if "int" in io)
    wrong = list(inputs)
    wrong[index] = inputs[index] + 1
    with pytest.raises(etch.InputError, match=f"input {index}"):
        m.execute(wrong)
    wrong[index] = "not an int"
    with pytest.raises(etch.InputError, match=f"input {index}.*int"):
        m.execute(wrong)


def test_method_meta_describes_inputs_and_outputs(llama: etch.Program) -> None:
    meta = llama.method_meta("forward")
    assert meta.name == "forward"
    tokens, pos = meta.inputs
    assert (tokens.kind, tokens.dtype, tokens.shape, tokens.dynamism) == ("tensor", "int64", (1, 31), "bound")
    assert tokens.scalar_type == 4 and tokens.nbytes == 31 * 8
    assert pos.dynamism == "static"
    (logits,) = meta.outputs
    assert (logits.dtype, logits.shape, logits.memory_planned) == ("float32", (1, 256), True)
    assert meta.instructions > 0 and meta.operators
    assert llama.method_meta("get_max_seq_len").outputs[0].kind == "int"
    assert "forward" in repr(meta)


def test_program_names_methods_and_rejects_unknown_ones(llama: etch.Program) -> None:
    assert llama.method_names[0] == "forward" and "get_max_seq_len" in llama.method_names
    assert "forward" in llama and "nope" not in llama
    with pytest.raises(KeyError, match="nope"):
        llama.method("nope")
    with pytest.raises(KeyError, match="nope"):
        llama.method_meta("nope")


@pytest.mark.parametrize("mode", ["mmap", "read", "huge-pages", "huge_pages", "auto"])
def test_load_modes_and_sources(mode: str) -> None:
    for source in (TINY_LLAMA, str(TINY_LLAMA), TINY_LLAMA.read_bytes(), bytearray(TINY_LLAMA.read_bytes())):
        program = etch.load(source, load_mode=mode, threads=1)
        assert program.threads == 1
        check_output(program.method("forward")(*llama_call(0))[0], llama_out(0), *TOL)


def test_bad_programs_are_reported(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        etch.load(tmp_path / "missing.pte")
    with pytest.raises(ValueError, match="load_mode"):
        etch.load(TINY_LLAMA, load_mode="bogus")
    with pytest.raises(etch.EtchError):
        etch.load(b"not a program at all")
    truncated = tmp_path / "truncated.pte"
    truncated.write_bytes(TINY_LLAMA.read_bytes()[:1000])
    with pytest.raises(etch.EtchError, match="truncated.pte"):
        etch.load(truncated)
    with pytest.raises(TypeError):
        etch.load(12)


def test_max_memory_bounds_what_a_program_may_hold() -> None:
    with pytest.raises(etch.EtchError, match="max_memory"):
        etch.load(TINY_LLAMA, load_mode="read", max_memory=1024)
    program = etch.load(TINY_LLAMA, load_mode="read", threads=1, max_memory=1 << 30)
    check_output(program.method("forward")(*llama_call(0))[0], llama_out(0), *TOL)


def test_sessions_run_in_parallel_threads(llama: etch.Program) -> None:
    results = {}

    def work(i: int) -> None:
        m = llama.method("forward")
        results[i] = m(*llama_call(0))[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        check_output(results[i], llama_out(0), *TOL)


def test_runtime_layer_mirrors_executorch_runtime() -> None:
    runtime = etch.runtime.Runtime.get()
    assert runtime is etch.runtime.Runtime.get()
    assert runtime.backend_registry.is_available("XnnpackBackend")
    assert "aten::add.out" in runtime.operator_registry.operator_names
    program = runtime.load_program(str(TINY_LLAMA))
    assert isinstance(program.method_names, set) and "forward" in program.method_names
    method = program.load_method("forward")
    assert program.load_method("forward") is method
    meta = method.metadata
    assert (meta.name(), meta.num_inputs(), meta.num_outputs()) == ("forward", 2, 1)
    info = meta.input_tensor_meta(0)
    assert (info.sizes(), info.dtype(), info.is_memory_planned(), info.nbytes()) == ((1, 31), 4, False, 248)
    assert repr(info) == "TensorInfo(sizes=[1, 31], dtype=Long, is_memory_planned=False, nbytes=248)"
    assert repr(program.metadata("forward")).startswith("MethodMeta(name='forward', num_inputs=2")
    with pytest.raises(IndexError):
        meta.input_tensor_meta(2)
    with pytest.raises(KeyError):
        program.load_method("nope")
    with open(TINY_LLAMA, "rb") as f:
        from_file = runtime.load_program(f)
    check_output(from_file.load_method("forward").execute(llama_call(0))[0], llama_out(0), *TOL)
    with pytest.raises(TypeError):
        runtime.load_program(12)
    with pytest.raises(RuntimeError):
        method.execute([np.zeros((1, 2), np.float32), np.zeros(1, np.int64)])
