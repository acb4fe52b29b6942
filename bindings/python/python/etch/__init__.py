"""etch: a torch-free runtime for ExecuTorch ``.pte`` programs, written in Rust.

Native API::

    import etch
    program = etch.load("model.pte")            # path or bytes
    forward = program.method("forward")         # a session: its own state (KV cache)
    outputs = forward(x, y)                     # numpy in, numpy out

    gen = etch.TextGenerator("llm.pte", "tokenizer.json")
    print(gen.generate("Hello", max_new_tokens=32)["text"])

``etch.runtime`` mirrors ``executorch.runtime`` (``Runtime.get().load_program(...)``).
"""

from ._etch import (
    EtchError,
    InputError,
    Method,
    MethodMeta,
    Program,
    TextGenerator,
    TextStream,
    ValueMeta,
    __version__,
    backend_names,
    load,
    operator_names,
)

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
