"""A kernel's latest launch is runtime state, kept per thread, apart from its declaration."""
from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

from kernelsearch import kernels


def _handle(n_regs: int) -> SimpleNamespace:
    """What a Triton launch returns, as far as `compiled_stats` reads it."""
    return SimpleNamespace(n_regs=n_regs, n_spills=0, metadata=SimpleNamespace(shared=1024))


def test_the_latest_launch_is_not_a_declared_field() -> None:
    kdef = kernels.get_kernel("vision_rope3d_spatial_merge_bwd")
    assert "last_compiled" not in {f.name for f in dataclasses.fields(kdef)}


def test_a_launch_in_another_thread_is_not_this_threads_latest() -> None:
    kdef = kernels.get_kernel("vision_rope3d_spatial_merge_bwd")
    kdef.last_compiled = _handle(32)
    seen: dict[str, object] = {}

    def other() -> None:
        seen["before"] = kdef.compiled_stats()
        kdef.last_compiled = _handle(255)
        seen["after"] = kdef.compiled_stats()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["before"] == {}
    assert seen["after"] == {"n_regs": 255, "n_spills": 0, "shared_bytes": 1024}
    assert kdef.compiled_stats() == {"n_regs": 32, "n_spills": 0, "shared_bytes": 1024}
    kdef.last_compiled = None
    assert kdef.compiled_stats() == {}
