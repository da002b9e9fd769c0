"""Where a kernel called without `config` gets its tuned config from.

`kernels` knows no database and no HTTP: an upper layer plugs a `Resolver` in with
`set_resolver` (`kernelsearch.provider`: the client's one resolver, the local store then the service). A lookup
that fails or answers nothing never fails the user's call: the kernel falls back to its default
config. This module's own policy is a per-process memory of answers, misses included, but never
an outage (`SourceUnavailable`), so a store that comes back is asked again.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping, Protocol

from .axes import Axes
from .resolve import Found, Key, Match, Resolver, SourceUnavailable


class KernelDef(Protocol):
    """What a lookup needs of a kernel (`spec.KernelDef` has it): its name and its "nearest"."""

    @property
    def name(self) -> str: ...

    def distance(self, a: Axes, b: Mapping[str, Any]) -> float: ...

log = logging.getLogger(__name__)

_lock = threading.Lock()
_resolver: Resolver | None = None
_cache: dict[Key, dict[str, Any] | None] = {}
# Called with (kernel name, answer) for an exact answer, once per key and process, before the
# kernel's first launch (the client installs the record's compiled kernel there).
_on_exact: Callable[[str, Found], None] | None = None


def set_resolver(resolver: Resolver | None,
                 on_exact: Callable[[str, Found], None] | None = None) -> None:
    """Plug in (or, with None, remove) what answers default-config lookups, and what is told of
    each exact answer (`on_exact`; its failure is logged, never the call's)."""
    global _resolver, _on_exact
    with _lock:
        _resolver = resolver
        _on_exact = on_exact if resolver is not None else None
        _cache.clear()


def current_resolver() -> Resolver | None:
    with _lock:
        return _resolver


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def lookup(kernel: KernelDef, axes: Axes, device: str) -> dict[str, Any] | None:
    """The resolver's config for this kernel, case and device (exact, else the nearest by the
    kernel's own `distance`), asked once per process; never raises."""
    key = Key.of(kernel.name, axes, device)
    with _lock:
        if key in _cache:
            return _cache[key]
        resolver, on_exact = _resolver, _on_exact
    if resolver is None:
        return None
    try:
        found = resolver.resolve(key, near=lambda other: kernel.distance(dict(axes), other))
        cfg = _servable(kernel, found)
    except SourceUnavailable as exc:
        log.warning("no config for %s %s on %s now: %s", kernel.name, dict(axes), device, exc)
        return None  # not remembered: the store may come back
    except Exception as exc:  # a broken source must not break a user's call
        log.warning("config lookup failed for %s %s on %s: %s", kernel.name, dict(axes), device, exc)
        return None
    if found is not None and found.match is Match.EXACT and on_exact is not None:
        try:
            on_exact(kernel.name, found)
        except Exception as exc:
            log.warning("%s: after the lookup: %s", kernel.name, exc)
    with _lock:
        _cache[key] = cfg
    return cfg


def _servable(kernel: KernelDef, found: Found | None) -> dict[str, Any] | None:
    return None if found is None else dict(found.config)
