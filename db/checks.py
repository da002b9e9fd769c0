"""Argument checks shared by the repositories, raising ValueError naming the argument.

Python's `bool` is an `int` (`True == 1`), so every count and number check refuses it first.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from .statuses import JOB_STATUSES


def check_int(v: Any, arg: str, *, minimum: int | None = None, optional: bool = False) -> None:
    """An int (not a bool), at least `minimum` when given; None passes when `optional`."""
    if optional and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or (minimum is not None and v < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{arg}: expected an int{bound}{' or None' if optional else ''}, got {v!r}")


def check_number(v: Any, arg: str, *, positive: bool = False, finite: bool = False,
                 optional: bool = False) -> None:
    """An int or float (not a bool), > 0 when `positive`, finite when `finite`."""
    if optional and v is None:
        return
    ok = (not isinstance(v, bool) and isinstance(v, (int, float))
          and (not positive or v > 0) and (not finite or math.isfinite(v)))
    if not ok:
        what = f"{'finite ' if finite else ''}number{' > 0' if positive else ''}"
        raise ValueError(f"{arg}: expected a {what}{' or None' if optional else ''}, got {v!r}")


def check_name(v: Any, arg: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{arg}: expected a non-empty string, got {v!r}")
    return v


# A kernel's name is its module path and qualified name (`pkg.mod.Class.kernel`): any length a
# Python program gives it, within this bound (kernels.undeclared.MAX_NAME_CHARS is the same).
# The store keys a kernel by `kernel_key(name)`, so no index holds the name itself.
KERNEL_NAME_CHARS = 1000


def kernel_key(name: str) -> str:
    """The fixed-width key the store finds a kernel by: the SHA-256 of its full name (UTF-8),
    so a name of any length or script is unique under a bounded index (PostgreSQL's btree
    refuses entries past ~2.7 kB)."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()


def check_kernel_name(v: Any, arg: str = "kernel") -> str:
    """A kernel's name: non-empty text of at most KERNEL_NAME_CHARS characters, no control
    character (PostgreSQL refuses NUL), any script."""
    if (not isinstance(v, str) or not v.strip() or len(v) > KERNEL_NAME_CHARS
            or any(ord(ch) < 32 for ch in v)):
        raise ValueError(f"{arg}: expected a kernel name of 1..{KERNEL_NAME_CHARS} printable "
                         f"characters, got {v[:80] if isinstance(v, str) else v!r}")
    return v


def bounded_name(text: str, width: int) -> str:
    """`text` when it fits `width` characters, else a readable prefix and a hash of the whole
    (stable, and distinct for distinct texts): for names derived from a kernel's name (a
    study's) that must fit a bounded column of their own."""
    if len(text) <= width:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{text[:width - len(digest) - 1]}~{digest}"


def check_status(status: str | None, arg: str, allowed: tuple[str, ...] = JOB_STATUSES) -> None:
    if status is not None and status not in allowed:
        raise ValueError(f"{arg}: {status!r} is not one of {', '.join(allowed)}")


def axes_key(axes: dict[str, Any], *, arg: str = "axes") -> str:
    """Canonical text of a case's axes (sorted keys), the way cases are matched. Values are ints
    (sizes) or non-empty strings (categories such as a dtype)."""
    if not isinstance(axes, dict) or not axes:
        raise ValueError(f"{arg}: expected a non-empty dict of axis name -> int or str, got {axes!r}")
    for k, v in axes.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{arg}: axis names must be non-empty strings, got {k!r}")
        if isinstance(v, str):
            if not v or "\x00" in v:
                raise ValueError(f"{arg}[{k!r}]: expected a non-empty category, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{arg}[{k!r}]: expected an int or a category string, got {v!r}")
    return json.dumps(axes, sort_keys=True, separators=(",", ":"))
