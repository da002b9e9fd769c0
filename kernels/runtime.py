"""What a process keeps of each kernel while it runs, apart from its declaration.

A `KernelDef` is what its author wrote and never changes; everything learnt at run time (the
source hash, computed once; the Triton handle of the latest launch, per thread; what a captured
kernel learns from its first launch) lives in one `KernelRuntime` per declaration, reached with
`runtime_of(kernel)`. Several threads use one kernel (the service's worker thread, the user's
threads calling it), so what is written here is per thread or under a lock.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class _Launches(threading.local):
    """The latest launch's handle, one per thread: two threads launching a kernel never read
    each other's."""

    handle: Any = None


class KernelRuntime:
    """The per-process state of one kernel declaration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._once: dict[str, Any] = {}
        self._launches = _Launches()

    def once(self, what: str, compute: Callable[[], T]) -> T:
        """`compute()`'s value, computed once per process and kept under `what` (two threads
        asking at once may both compute; the first value kept is the one every caller gets)."""
        with self._lock:
            if what in self._once:
                return self._once[what]
        got = compute()
        with self._lock:
            return self._once.setdefault(what, got)

    def known(self, what: str) -> Any:
        """What `once` keeps under `what`, or None before it was computed."""
        with self._lock:
            return self._once.get(what)

    @property
    def last_compiled(self) -> Any:
        """The Triton handle of the kernel's latest launch in this thread (its registers, spills
        and shared memory); a launcher sets it: `runtime_of(KERNEL).last_compiled = kernel[grid](...)`."""
        return self._launches.handle

    @last_compiled.setter
    def last_compiled(self, handle: Any) -> None:
        self._launches.handle = handle

    def compiled_stats(self) -> dict[str, Any]:
        """Registers, spills and shared memory of the latest launch in this thread (empty under
        the interpreter)."""
        h = self.last_compiled
        if h is None or not hasattr(h, "n_regs"):
            return {}
        md = getattr(h, "metadata", None)
        return {"n_regs": int(h.n_regs), "n_spills": int(h.n_spills),
                "shared_bytes": int(getattr(md, "shared", 0) or 0)}


_lock = threading.Lock()
# Keyed by the declaration itself (KernelDef compares by identity): a copy made with
# dataclasses.replace, or a kernel re-registered under its name, starts with nothing learnt.
_runtimes: "weakref.WeakKeyDictionary[Any, KernelRuntime]" = weakref.WeakKeyDictionary()


def runtime_of(kernel: Any) -> KernelRuntime:
    """The runtime state of `kernel` in this process (made on first use)."""
    with _lock:
        rt = _runtimes.get(kernel)
        if rt is None:
            rt = _runtimes[kernel] = KernelRuntime()
        return rt


__all__ = ["KernelRuntime", "runtime_of"]
