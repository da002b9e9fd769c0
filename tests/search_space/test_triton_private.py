"""The Triton API that search_space/_triton_private.py relies on beyond Triton's documented one:
when a Triton upgrade changes it, this fails and says what changed, before the compile-ahead
pool silently launches (or breaks) on a GPU."""
from __future__ import annotations

import inspect

import triton
from triton.runtime.jit import JITFunction, KernelInterface

from kernelsearch.search_space import _triton_private


def test_jitfunction_run_takes_grid_and_warmup_keywords():
    assert _triton_private.PATCHED == "triton.runtime.jit.JITFunction.run"
    run = getattr(JITFunction, "run", None)
    assert callable(run), f"Triton {triton.__version__}: {_triton_private.PATCHED} is gone"
    params = inspect.signature(run).parameters
    for name in _triton_private.KEYWORDS:
        assert name in params and params[name].kind is inspect.Parameter.KEYWORD_ONLY, (
            f"Triton {triton.__version__}: {_triton_private.PATCHED} no longer takes keyword-only "
            f"{name!r} (parameters: {list(params)}); the compile-ahead pool's warmup patch needs it")
    assert any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()), (
        f"Triton {triton.__version__}: {_triton_private.PATCHED} no longer takes the kernel's "
        f"arguments positionally (parameters: {list(params)})")


def test_a_launch_goes_through_run_with_warmup_false():
    """`kernel[grid](...)` is what the launchers call; the patch works only if that reaches
    `run(..., grid=grid, warmup=False)`, as KernelInterface.__getitem__ does in Triton 3.6."""
    src = inspect.getsource(KernelInterface.__getitem__)
    assert "self.run(grid=grid, warmup=False" in src, (
        f"Triton {triton.__version__}: KernelInterface.__getitem__ no longer launches through "
        f"{_triton_private.PATCHED}(grid=..., warmup=False):\n{src}")


def test_the_patch_turns_launches_into_warmups():
    """The replacement forwards everything and forces warmup=True; restored after the test."""
    original = JITFunction.run
    seen = {}
    try:
        JITFunction.run = lambda self, *a, grid, warmup, **kw: seen.update(args=a, grid=grid, warmup=warmup, kw=kw)
        _triton_private.launches_become_warmups()
        JITFunction.run(object(), 1, 2, grid=(3,), warmup=False, num_warps=4)
    finally:
        JITFunction.run = original
    assert seen == {"args": (1, 2), "grid": (3,), "warmup": True, "kw": {"num_warps": 4}}
