"""Triton's interpreter on a machine without a GPU, whatever the program imported first.

Triton 3.6 decides at decoration time: `@triton.jit` builds an `InterpretedFunction` only when
`TRITON_INTERPRET` is set then (`triton.knobs.runtime.interpret`, read from the environment on
every access). A program that imported `triton.language` (whose own `tl.max`, `tl.cdiv` ... are
`@triton.jit` functions) or decorated its helpers before kernelsearch set the variable holds
compiled-mode `JITFunction`s, which cannot launch without a GPU and refuse to be called from an
interpreted kernel. Here such a `JITFunction` is launched and called through an interpreted twin
of the same Python function, while the interpreter is on. Triton's interpreter patches
`triton.language` for the time of each launch, so two threads launching at once would undo each
other's patch: launches are serialized.
"""
from __future__ import annotations

import functools

import os
import threading
from typing import Any

_LOCK = threading.RLock()
_installed = False


def use_interpreter_without_gpu() -> None:
    """Without a visible GPU, turn the interpreter on (unless `TRITON_INTERPRET` says otherwise)
    and make kernels decorated before that run under it."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from triton import knobs

    if knobs.runtime.interpret:
        _install()


def _install() -> None:
    global _installed
    with _LOCK:
        if _installed:
            return
        _installed = True
    from triton import knobs
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def twin(fn: Any) -> InterpretedFunction:
        got = fn.__dict__.get("_kernelsearch_interpreted")
        if got is None:
            got = fn.__dict__["_kernelsearch_interpreted"] = InterpretedFunction(fn.fn)
        return got

    compiled_call, compiled_run, interpreted_run = (JITFunction.__call__, JITFunction.run,
                                                    InterpretedFunction.run)

    @functools.wraps(compiled_call)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if knobs.runtime.interpret:
            return twin(self)(*args, **kwargs)
        return compiled_call(self, *args, **kwargs)

    @functools.wraps(compiled_run)  # Triton's signature stays visible (inspect follows it)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if knobs.runtime.interpret:
            return twin(self).run(*args, **kwargs)
        return compiled_run(self, *args, **kwargs)

    @functools.wraps(interpreted_run)
    def run_alone(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return interpreted_run(self, *args, **kwargs)

    JITFunction.__call__ = call  # type: ignore[method-assign]
    JITFunction.run = run  # type: ignore[method-assign]
    InterpretedFunction.run = run_alone  # type: ignore[method-assign]
