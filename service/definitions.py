"""Undeclared kernels on the service's side: a decorator's definition registered in this
process (so /v1/kernels, /v1/best, the dashboard and the acceptance gate know the kernel) and
kept in the store (so every other service process and a restart know it too)."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from kernelsearch.kernels import registry
from kernelsearch.kernels.undeclared import Definition, UndeclaredKernel, kernel_def

log = logging.getLogger(__name__)


class DefinitionConflict(ValueError):
    """The name is a declared kernel's, or an undeclared kernel's with records from another
    module: a definition never replaces a declaration, nor the code records were measured on."""


def _keep_measured(store: Any, defn: Definition) -> None:
    """DefinitionConflict when the store holds `defn.name`'s definition from another module or
    function and records of it: those records were measured on that code, and every process
    that imports the kernel by the definition would run another's."""
    stored = store.kernel_definitions().get(defn.name)
    if stored is None:
        return
    was = (stored.get("module"), stored.get("qualname"))
    if was != (defn.module, defn.qualname) and store.has_records(kernel=defn.name):
        raise DefinitionConflict(f"name: {defn.name!r} is {was[0]}.{was[1]}, which has records; a "
                                 f"definition of {defn.module}.{defn.qualname} does not replace it "
                                 f"(withdraw its records first)")


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
