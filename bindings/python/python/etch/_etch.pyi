"""Type stubs of etch's native module (``etch._etch``), re-exported by ``etch``."""

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union, final

__all__ = [
    "EtchError",
    "InputError",
    "Method",
    "MethodMeta",
    "Program",
    "TextGenerator",
    "TextStream",
    "ValueMeta",
    "__version__",
    "backend_names",
    "load",
    "operator_names",
]

__version__: str

_PathLike = Union[str, "os.PathLike[str]"]

class InputError(ValueError, RuntimeError):
    """A method input etch cannot take: wrong count, kind, dtype, shape or value.

    The message names the method and the input (``method "forward" input 1: ...``).
    """

class EtchError(RuntimeError):
    """etch could not load or run a program (the message says what and where)."""

def load(
    source: Union[_PathLike, bytes, bytearray, memoryview],
    load_mode: str = "mmap",
    threads: int = 0,
    data_path: Optional[_PathLike] = None,
    max_memory: Optional[int] = None,
    fold_constants: bool = True,
) -> Program:
    """Loads a ``.pte`` program from a path or from its bytes.

    ``load_mode``: ``"mmap"`` (weights used in place from the page cache), ``"read"``,
    ``"mmap-locked"``, ``"huge-pages"`` or ``"auto"`` (huge pages for a program without
    delegates, a map for a delegated one). ``threads``: kernel threads, 0 for one per
    core. ``data_path``: a ``.ptd`` file with data kept outside the program.
    ``max_memory``: the most bytes the program and its sessions may hold (None: what
    the system has available); past it, loading raises ``EtchError`` naming the need.
    ``fold_constants``: do the work that depends only on constants once at load (a
    permute of a weight, batch norms folded into their convolutions), or run every
    instruction as the file has it.
    Raises ``FileNotFoundError`` for a missing file, ``EtchError`` for an invalid one.
    """

def backend_names() -> List[str]:
    """The delegate backends etch runs (``"XnnpackBackend"``)."""

def operator_names() -> List[str]:
    """The operators etch implements, ``namespace::name.overload``."""

@final
class ValueMeta:
    """One input or output: a tensor (dtype, shape, dynamism) or a scalar fixed at export."""

    @property
    def kind(self) -> str:
        """``"tensor"``, ``"int"``, ``"float"``, ``"bool"``, ``"str"`` or ``"none"``."""
    @property
    def dtype(self) -> Optional[str]:
        """numpy dtype name (``"float32"``, ``"int64"``; ``"bfloat16"`` travels as uint16)."""
    @property
    def scalar_type(self) -> Optional[int]:
        """ExecuTorch ``ScalarType`` code of the dtype (6 is float32, 4 is int64)."""
    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        """Sizes in the program: upper bounds when ``dynamism`` is ``"bound"``."""
    @property
    def dynamism(self) -> Optional[str]:
        """``"static"``, ``"bound"`` or ``"unbound"``."""
    @property
    def memory_planned(self) -> Optional[bool]:
        """True when the tensor lives in the method's planned memory."""
    @property
    def nbytes(self) -> Optional[int]:
        """Bytes of the tensor at ``shape``."""
    @property
    def value(self) -> Union[int, float, bool, str, None]:
        """The value a scalar was traced with (None for tensors)."""

@final
class MethodMeta:
    """What a method takes, returns and needs."""

    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> Tuple[ValueMeta, ...]: ...
    @property
    def outputs(self) -> Tuple[ValueMeta, ...]: ...
    @property
    def planned_buffer_sizes(self) -> List[int]:
        """Bytes of each planned memory buffer a session allocates."""
    @property
    def operators(self) -> List[str]: ...
    @property
    def instructions(self) -> int: ...
    @property
    def uses_backend(self) -> bool:
        """True when the method calls a delegate (XNNPACK)."""

@final
class Method:
    """A session of one method; its state (a KV cache) persists between calls.

    One thread runs a session at a time; ``Program.method`` makes another.
    """

    def execute(self, inputs: Sequence[Any]) -> List[Any]:
        """Runs the method (GIL released) on numpy arrays, Python scalars or anything
        ``numpy.asarray`` converts; returns numpy arrays (copied once out of the
        method's memory) and Python scalars. Bad inputs raise ``InputError``."""
    def __call__(self, *inputs: Any) -> List[Any]:
        """``method(*inputs)`` is ``method.execute(inputs)``."""
    @property
    def name(self) -> str: ...
    @property
    def meta(self) -> MethodMeta: ...
    @property
    def stats(self) -> Dict[str, int]:
        """Executions, instructions, kernel scratch counters, planned bytes, and
        ``run_ns``: nanoseconds spent running the method itself, without the inputs'
        conversion and the outputs' copies (the binding's own cost)."""

@final
class Program:
    """A loaded program: immutable, shared by its sessions."""

    @property
    def method_names(self) -> List[str]:
        """Method names, in file order."""
    def method_meta(self, name: str) -> MethodMeta:
        """A method's inputs and outputs, without loading it (KeyError if unknown)."""
    def method(self, name: str) -> Method:
        """A new session of a method (KeyError if unknown)."""
    @property
    def threads(self) -> int: ...
    @property
    def load_ms(self) -> float: ...
    def __contains__(self, name: str, /) -> bool: ...

@final
class TextStream(Iterator[str]):
    """Text pieces as they are generated; ``result`` holds the ``generate`` dict after."""

    def __iter__(self) -> "TextStream": ...
    def __next__(self) -> str: ...
    @property
    def result(self) -> Optional[Dict[str, Any]]: ...

@final
class TextGenerator:
    """An exported LLM and its tokenizer; each call starts from an empty context."""

    def __new__(
        cls,
        model: _PathLike,
        tokenizer: _PathLike,
        threads: int = 0,
        load_mode: str = "auto",
        method: str = "forward",
        temp_cache_mib: int = 16,
        max_memory: Optional[int] = None,
    ) -> "TextGenerator": ...
    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int = 42,
        chat: bool = False,
        chat_template: Optional[str] = None,
        system: Optional[str] = None,
        ignore_eos: bool = False,
    ) -> Dict[str, Any]:
        """Generates text (GIL released). Returns ``text``, ``prompt_token_ids``,
        ``generated_token_ids``, ``stop_reason`` and ``stats``, as
        ``etch generate --json`` prints them."""
    def stream(
        self,
        prompt: Union[str, Sequence[int]],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int = 42,
        chat: bool = False,
        chat_template: Optional[str] = None,
        system: Optional[str] = None,
        ignore_eos: bool = False,
    ) -> TextStream:
        """Like ``generate``, yielding text pieces as they are complete UTF-8.

        The model runs on a background thread; a stream left early still generates to
        its end (at most ``max_new_tokens``), and the next call waits for it."""
    def encode(self, text: str) -> List[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    @property
    def metadata(self) -> Dict[str, Any]: ...
    @property
    def eos_ids(self) -> List[int]: ...
