"""The one boundary between kernelsearch's work in a user's process and the user's call.

Everything the decorator and the hooks (the Triton cache manager, the Helion backend) do in a
user's program runs inside this boundary: a failure of kernelsearch's own (a lookup, an
identity, a registration, a capture, a share, a job) is logged once per kind per kernel and the
caller falls back to what Triton (or Helion) would do without kernelsearch. Only the user's own
code (the kernel's launch, its hooks, its pruning, its `do_bench`) may raise through it, and it
does so unchanged: `users()` marks what it raises, and the boundary re-raises what is marked.

`Exception` is caught; other `BaseException`s (KeyboardInterrupt, SystemExit, GeneratorExit,
asyncio's CancelledError, a test framework's outcomes) always propagate.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, TypeVar

log = logging.getLogger("kernelsearch")
T = TypeVar("T")
_MARK = "_kernelsearch_users"
_told: set[tuple[str, str, str]] = set()
_told_lock = threading.Lock()
_local = threading.local()


def users(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call the user's own code: whatever it raises is the user's and passes every boundary."""
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        mark(exc)
        raise


def mark(exc: BaseException) -> None:
    """Mark `exc` as raised by the user's code."""
    try:
        setattr(exc, _MARK, True)
    except Exception:  # an exception type without attributes: remembered for this thread
        _local.last = exc


def is_users(exc: BaseException) -> bool:
    """Whether `exc` was raised by the user's own code (`users`)."""
    return bool(getattr(exc, _MARK, False)) or getattr(_local, "last", None) is exc


def failed(kernel: str, where: str, exc: Exception) -> None:
    """Log a failure of kernelsearch's own at `where`, once per (kernel, where, exception type);
    the caller then falls back (it re-raises, unchanged, what `is_users`)."""
    kind = (kernel, where, type(exc).__name__)
    with _told_lock:
        new = kind not in _told
        _told.add(kind)
    if new:
        log.warning("kernelsearch: %s failed for %s (%s: %s); falling back to what Triton does "
                    "without kernelsearch", where, kernel, type(exc).__name__, exc,
                    exc_info=log.isEnabledFor(logging.DEBUG))


def guarded(kernel: str, where: str, fn: Callable[[], T], default: T) -> T:
    """fn(), or `default` after `failed` when kernelsearch's work in it fails."""
    try:
        return fn()
    except Exception as exc:
        if is_users(exc):
            raise
        failed(kernel, where, exc)
        return default
