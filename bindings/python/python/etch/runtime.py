"""``executorch.runtime``'s API on etch: change the import, keep the script.

.. code-block:: python

    from etch.runtime import Runtime          # was: from executorch.runtime import Runtime

    runtime = Runtime.get()
    program = runtime.load_program("model.pte")
    forward = program.load_method("forward")
    outputs = forward.execute([x, y])

Outputs are numpy arrays where the official module returns torch tensors; inputs may
be numpy arrays, torch tensors (converted with ``numpy.asarray``, torch is never
imported) or Python scalars. The remaining differences are listed in the package
README (``bindings/python/README.md``).
"""

import enum
import functools
import os
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Set, Tuple, Union

from . import _etch

__all__ = [
    "BackendRegistry",
    "Method",
    "MethodMeta",
    "OperatorRegistry",
    "Program",
    "Runtime",
    "TensorInfo",
    "Verification",
]

# ExecuTorch ScalarType names by code, as the official TensorInfo prints them.
_SCALAR_TYPE_NAMES = {
    0: "Byte",
    1: "Char",
    2: "Short",
    3: "Int",
    4: "Long",
    5: "Half",
    6: "Float",
    7: "Double",
    11: "Bool",
    15: "BFloat16",
    27: "UInt16",
    28: "UInt32",
    29: "UInt64",
}


class Verification(enum.IntEnum):
    """Accepted for compatibility; etch always validates the whole program."""

    Minimal = 0
    InternalConsistency = 1


class TensorInfo:
    """A tensor input's or output's description (``sizes()``, ``dtype()``, ...)."""

    def __init__(self, meta: _etch.ValueMeta) -> None:
        self._meta = meta

    def sizes(self) -> Tuple[int, ...]:
        """The sizes in the program (upper bounds for dynamic shapes)."""
        return tuple(self._meta.shape or ())

    def dtype(self) -> int:
        """The ExecuTorch ``ScalarType`` code (6 is float32, 4 is int64)."""
        code = self._meta.scalar_type
        return -1 if code is None else code

    def is_memory_planned(self) -> bool:
        return bool(self._meta.memory_planned)

    def nbytes(self) -> int:
        return self._meta.nbytes or 0

    def __repr__(self) -> str:
        name = _SCALAR_TYPE_NAMES.get(self.dtype(), str(self.dtype()))
        return (
            f"TensorInfo(sizes={list(self.sizes())}, dtype={name}, "
            f"is_memory_planned={self.is_memory_planned()}, nbytes={self.nbytes()})"
        )


class MethodMeta:
    """A method's inputs and outputs, as ``executorch.runtime``'s ``MethodMeta``."""

    def __init__(self, meta: _etch.MethodMeta) -> None:
        self._meta = meta
        self._inputs = meta.inputs
        self._outputs = meta.outputs

    def name(self) -> str:
        return self._meta.name

    def num_inputs(self) -> int:
        return len(self._inputs)

    def num_outputs(self) -> int:
        return len(self._outputs)

    def num_attributes(self) -> int:
        return 0

    def input_tensor_meta(self, index: int) -> TensorInfo:
        return self._tensor_meta(self._inputs, index, "input")

    def output_tensor_meta(self, index: int) -> TensorInfo:
        return self._tensor_meta(self._outputs, index, "output")

    def attribute_tensor_meta(self, index: int) -> TensorInfo:
        raise IndexError(f"method {self.name()!r} has no attribute tensors")

    def _tensor_meta(
        self, values: Tuple[_etch.ValueMeta, ...], index: int, what: str
    ) -> TensorInfo:
        if not 0 <= index < len(values):
            raise IndexError(
                f"{what} index {index} out of range ({len(values)} {what}s)"
            )
        value = values[index]
        if value.kind != "tensor":
            raise ValueError(f"{what} {index} is a {value.kind}, not a tensor")
        return TensorInfo(value)

    @property
    def native(self) -> _etch.MethodMeta:
        """etch's own description (dynamism, planned buffers, operators)."""
        return self._meta

    def __repr__(self) -> str:
        def tensors(values: Tuple[_etch.ValueMeta, ...]) -> List[str]:
            return [repr(TensorInfo(v)) for v in values if v.kind == "tensor"]

        return (
            f"MethodMeta(name={self.name()!r}, num_inputs={self.num_inputs()}, "
            f"input_tensor_meta={tensors(self._inputs)}, "
            f"num_outputs={self.num_outputs()}, "
            f"output_tensor_meta={tensors(self._outputs)})"
        )


class Method:
    """A loaded method; its state (a KV cache) persists between ``execute`` calls."""

    def __init__(self, method: _etch.Method) -> None:
        self._method = method

    def execute(self, inputs: Sequence[Any]) -> List[Any]:
        """Runs the method; returns a list of numpy arrays and Python scalars."""
        return self._method.execute(inputs)

    @property
    def metadata(self) -> MethodMeta:
        return MethodMeta(self._method.meta)

    @property
    def native(self) -> _etch.Method:
        """The underlying ``etch.Method`` session."""
        return self._method


class Program:
    """A loaded program; ``load_method`` loads each method once and caches it."""

    def __init__(self, program: _etch.Program, data: Optional[bytes]) -> None:
        self._data = data
        self._program = program
        self._methods: Dict[str, Optional[Method]] = {
            name: None for name in program.method_names
        }

    @property
    def method_names(self) -> Set[str]:
        return set(self._methods.keys())

    def load_method(self, name: str) -> Optional[Method]:
        """The method of this name, loaded on first use (KeyError if unknown)."""
        method = self._methods[name]
        if method is None:
            method = Method(self._program.method(name))
            self._methods[name] = method
        return method

    def metadata(self, method_name: str) -> MethodMeta:
        """A method's metadata without loading it."""
        return MethodMeta(self._program.method_meta(method_name))

    def write_etdump_result_to_file(
        self, etdump_path: str, debug_buffer_path: str
    ) -> None:
        raise NotImplementedError("etch does not write ETDump traces")

    @property
    def native(self) -> _etch.Program:
        """The underlying ``etch.Program``."""
        return self._program


class BackendRegistry:
    """The delegate backends etch runs."""

    @property
    def registered_backend_names(self) -> List[str]:
        return list(_etch.backend_names())

    def is_available(self, backend_name: str) -> bool:
        return backend_name in _etch.backend_names()


class OperatorRegistry:
    """The operators etch implements."""

    @property
    def operator_names(self) -> Set[str]:
        return set(_etch.operator_names())


class Runtime:
    """The runtime singleton: ``Runtime.get()``."""

    @staticmethod
    @functools.lru_cache(maxsize=1)
    def get() -> "Runtime":
        return Runtime()

    def __init__(self) -> None:
        self.backend_registry = BackendRegistry()
        self.operator_registry = OperatorRegistry()

    def load_program(
        self,
        data: Union[bytes, bytearray, BinaryIO, Path, str],
        *,
        verification: Verification = Verification.InternalConsistency,
        enable_etdump: bool = False,
        debug_buffer_size: int = 0,
        data_path: Optional[Union[Path, str]] = None,
    ) -> Program:
        """Loads a program from a path, bytes or a binary file object.

        ``verification`` is accepted and ignored (etch validates everything);
        ``enable_etdump=True`` raises ``NotImplementedError``.
        """
        if enable_etdump:
            raise NotImplementedError("etch does not write ETDump traces")
        if isinstance(data, (str, os.PathLike)):
            program = _etch.load(data, data_path=data_path)
            return Program(program, data=None)
        if isinstance(data, bytearray):
            data_bytes: bytes = bytes(data)
        elif isinstance(data, bytes):
            data_bytes = data
        elif hasattr(data, "read"):
            data_bytes = data.read()
        else:
            raise TypeError(
                "Expected data to be bytes, bytearray, a path to a .pte file, or a "
                f"file-like object, but got {type(data).__name__}."
            )
        program = _etch.load(data_bytes, data_path=data_path)
        return Program(program, data=data_bytes)
