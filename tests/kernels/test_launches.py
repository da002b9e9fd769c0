"""A kernel's declaration is immutable; what a process learns while running it (its latest
launch, per thread; its source hash) is its runtime, apart from the declaration."""
from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest

from kernelsearch import kernels
from kernelsearch.kernels.runtime import KernelRuntime, runtime_of


def _handle(n_regs: int) -> SimpleNamespace:
    """What a Triton launch returns, as far as `compiled_stats` reads it."""
    return SimpleNamespace(n_regs=n_regs, n_spills=0, metadata=SimpleNamespace(shared=1024))


def test_the_declaration_cannot_be_changed() -> None:
    kdef = kernels.get_kernel("vision_rope3d_spatial_merge_bwd")
    with pytest.raises(dataclasses.FrozenInstanceError):
        kdef.rtol = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        kdef.last_compiled = _handle(32)  # type: ignore[attr-defined]
    assert "last_compiled" not in {f.name for f in dataclasses.fields(kdef)}


def test_the_source_hash_is_kept_in_the_runtime_not_the_declaration() -> None:
    kdef = kernels.get_kernel("vision_rope3d_spatial_merge_bwd")
    got = kdef.source_hash
    assert runtime_of(kdef).known("source_hash") == got
    assert got not in vars(kdef).values()
    copy = dataclasses.replace(kdef, triton_kernels=kdef.triton_kernels[:1])
    assert runtime_of(copy) is not runtime_of(kdef)
    assert runtime_of(copy).known("source_hash") is None


def test_a_launch_in_another_thread_is_not_this_threads_latest() -> None:
    rt = runtime_of(kernels.get_kernel("vision_rope3d_spatial_merge_bwd"))
    rt.last_compiled = _handle(32)
    seen: dict[str, object] = {}

    def other() -> None:
        seen["before"] = rt.compiled_stats()
        rt.last_compiled = _handle(255)
        seen["after"] = rt.compiled_stats()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["before"] == {}
    assert seen["after"] == {"n_regs": 255, "n_spills": 0, "shared_bytes": 1024}
    assert rt.compiled_stats() == {"n_regs": 32, "n_spills": 0, "shared_bytes": 1024}
    rt.last_compiled = None
    assert rt.compiled_stats() == {}


def test_once_computes_once_and_keeps_no_failure() -> None:
    rt = KernelRuntime()
    calls: list[int] = []

    def boom() -> int:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        rt.once("probe", boom)
    assert rt.known("probe") is None
    assert rt.once("probe", lambda: calls.append(1) or 7) == 7
    assert rt.once("probe", lambda: calls.append(1) or 8) == 7
    assert calls == [1]
