"""An undeclared kernel's definition registered in this process and saved in a store: what the
service does for POST /v1/kernels and what a user's program does with its local store, one
rule for both (a definition never replaces a declaration, nor the code records were measured
on)."""
from __future__ import annotations

from typing import Any, Mapping

from . import registry
from .undeclared import Definition, UndeclaredKernel, kernel_def


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
