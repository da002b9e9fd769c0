"""Undeclared kernels on the service's side: a decorator's definition registered in this
process (so /v1/kernels, /v1/best, the dashboard and the acceptance gate know the kernel) and
kept in the store (so every other service process and a restart know it too)."""
from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from typing import Any, Mapping

from kernelsearch.db.errors import StoreError
from kernelsearch.kernels import registry
from kernelsearch.kernels.definitions import (DefinitionConflict, define, register_definition)

log = logging.getLogger(__name__)

__all__ = ["DefinitionConflict", "define", "known_or_reloaded", "load_definitions",
           "register_definition", "restore_definitions"]

# How often a service process reads the store's definitions again when asked for a kernel it
# does not know (one another process registered, or an import added): at most once per store
# in this many seconds, so a name no one defined costs no read per request.
RELOAD_S = 10.0
_reloaded: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
_reload_lock = threading.Lock()


def restore_definitions(store: Any, docs: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Register the store's definitions, then those of `docs` (a records document's `kernels`)
    that the store lacks: an import gates and keeps the records of kernels this store never
    saw. A stored definition wins over the document's (it is what this store's records were
    gated by). Returns (the document's definitions to save once its records are in, a message
    per definition that could not be registered, naming it)."""
    load_definitions(store)
    stored = set(store.kernel_definitions())
    new, problems = [], []
    for name, doc in docs.items():
        if name in stored:
            continue
        if doc.get("name") != name:
            problems.append(f"kernels[{name!r}]: the definition names another kernel, "
                            f"{doc.get('name')!r}")
            continue
        try:
            register_definition(doc)
        except ValueError as exc:  # DefinitionConflict too
            problems.append(f"kernels[{name!r}]: {exc}")
            continue
        new.append(name)
    return new, problems


def load_definitions(store: Any) -> int:
    """Register every definition the store keeps; returns how many. A bad one is skipped."""
    n = 0
    for name, doc in store.kernel_definitions().items():
        try:
            register_definition(doc)
            n += 1
        except ValueError as exc:
            log.warning("stored definition of %s not registered: %s", name, exc)
    return n


def known_or_reloaded(store: Any, name: str) -> bool:
    """Whether `name` is a registered kernel, once the store's definitions are registered again
    when it is not (throttled: RELOAD_S). A database that cannot be read leaves the kernels as
    they are (the route answers from what this process knows)."""
    if name in registry.all_kernels():
        return True
    now = time.monotonic()
    with _reload_lock:
        if now - _reloaded.get(store, -math.inf) < RELOAD_S:
            return False
        _reloaded[store] = now
    try:
        load_definitions(store)
    except StoreError as exc:
        log.info("stored definitions not read: %s", exc)
    return name in registry.all_kernels()
