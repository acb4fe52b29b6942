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

# The native module's public names (its `__all__`, typed by `_etch.pyi`).
from ._etch import *  # noqa: F403
from ._etch import __all__, __version__  # noqa: F401
