"""Where a kernel called without `config` gets its tuned config from.

`kernels` knows no database and no HTTP: an upper layer plugs a provider in with
`set_provider`. A provider that fails or answers nothing never fails the user's call: the
kernel falls back to its default config.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Mapping, Protocol

from .axes import Axes

log = logging.getLogger(__name__)


class ProviderUnavailable(Exception):
    """A provider could not answer now (its store or service is down): never cached as a miss."""


class ConfigProvider(Protocol):
    def best_config(self, kernel: str, axes: Axes, device: str) -> Mapping[str, Any] | None:
        """The best known config for this shape on this device (exact or nearest), or None."""


_lock = threading.Lock()
_provider: ConfigProvider | None = None
_cache: dict[tuple, dict[str, Any] | None] = {}


def set_provider(provider: ConfigProvider | None) -> None:
    """Plug in (or, with None, remove) the store that answers default-config lookups."""
    global _provider
    with _lock:
        _provider = provider
        _cache.clear()


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def lookup(kernel: str, axes: Axes, device: str) -> dict[str, Any] | None:
    """Ask the provider once per (kernel, axes, device) per process; never raises."""
    key = (kernel, tuple(sorted(axes.items())), device)
    with _lock:
        if key in _cache:
            return _cache[key]
        provider = _provider
    if provider is None:
        return None
    try:
        got = provider.best_config(kernel, dict(axes), device)
        cfg = dict(got) if got else None
    except Exception as exc:  # a store that is down must not break a user's call
        log.warning("config provider failed for %s %s on %s: %s", kernel, dict(axes), device, exc)
        return None  # not cached: the store may come back
    with _lock:
        _cache[key] = cfg
    return cfg
