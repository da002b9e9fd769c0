"""The one place kernelsearch relies on Triton beyond its documented API: the compile-ahead pool
turns every launch in its processes into a warmup (compile and cache, never launch).

Why not the public `JITFunction.warmup`: the pool compiles through the kernel's own launcher
(`KernelDef.launch`, any user's plugin code), which calls `kernel[grid](...)`; only a launch made
by Triton's `JITFunction.run(*args, grid=..., warmup=...)` can be redirected without changing
every launcher, and Triton has no public hook that skips a launch (its launch hooks run before
one, they cannot cancel it). tests/search_space/test_triton_private.py fails, naming the Triton
version and the attribute, when Triton changes this.
"""
from __future__ import annotations

from typing import Any

# The method patched and the keyword-only parameters its replacement relies on.
PATCHED = "triton.runtime.jit.JITFunction.run"
KEYWORDS = ("grid", "warmup")


def launches_become_warmups() -> None:
    """In this process (a pool worker), every JIT kernel launch compiles and caches instead."""
    from triton.runtime.jit import JITFunction

    original = JITFunction.run

    def warmup_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return original(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = warmup_only  # type: ignore[method-assign]
