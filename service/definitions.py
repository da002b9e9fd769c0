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
from kernelsearch.kernels.undeclared import Definition, UndeclaredKernel, kernel_def

log = logging.getLogger(__name__)

# How often a service process reads the store's definitions again when asked for a kernel it
# does not know (one another process registered, or an import added): at most once per store
# in this many seconds, so a name no one defined costs no read per request.
RELOAD_S = 10.0
_reloaded: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
_reload_lock = threading.Lock()


class DefinitionConflict(ValueError):
    """The name is a declared kernel's, or an undeclared kernel's with records from another
    module: a definition never replaces a declaration, nor the code records were measured on."""


def _keep_measured(store: Any, defn: Definition) -> None:
    """DefinitionConflict when the store holds `defn.name`'s definition from another module or
    function and records or captured calls of it: those records were measured on that code, a
    captured call's jobs make a worker import its module, and every process that imports the
    kernel by the definition would run another's."""
    stored = store.kernel_definitions().get(defn.name)
    if stored is None:
        return
    was = (stored.get("module"), stored.get("qualname"))
    if was == (defn.module, defn.qualname):
        return
    if store.has_records(kernel=defn.name):
        held = "records"
    elif store.kernel_captures(defn.name):
        held = "captured calls (its search and tuning jobs run them)"
    else:
        return
    tail = " (withdraw its records first)" if held == "records" else ""
    raise DefinitionConflict(f"name: {defn.name!r} is {was[0]}.{was[1]}, which has {held}; a "
                             f"definition of {defn.module}.{defn.qualname} does not replace "
                             f"it{tail}")


def register_definition(doc: Mapping[str, Any], store: Any | None = None) -> UndeclaredKernel:
    """Parse and register one definition (a ValueError names the bad field); with the `store`
    it is to be saved in, never over a stored one from another module that has records."""
    defn = Definition.from_json(doc)
    try:
        current = registry.get_kernel(defn.name)
    except KeyError:
        current = None
    if current is not None and not isinstance(current, UndeclaredKernel):
        raise DefinitionConflict(f"name: {defn.name!r} is a declared kernel; an undeclared "
                                 f"kernel's definition cannot replace it")
    if store is not None:
        _keep_measured(store, defn)
    kdef = kernel_def(defn)
    registry.register(kdef, replace=True)
    return kdef


def define(store: Any, doc: Mapping[str, Any]) -> UndeclaredKernel:
    """Register `doc` in this process and save it in `store`: what POST /v1/kernels does, and
    what a user's process does with its local store, so the acceptance that follows checks the
    call against this definition, never an older one of the same name this process knew."""
    kdef = register_definition(doc, store=store)
    store.save_definition(kdef.name, kdef.definition.as_json())
    return kdef


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
