"""The one registry of kernels, fed the same way in every process (API, worker, trial child,
compile pool, CLI): installed packages through the `kernelsearch.kernels` entry-point group,
modules on the path through `KS_KERNEL_MODULES`, and `register()` in process.

Nothing above this module names a kernel: it asks the registry.
"""
from __future__ import annotations

import importlib
import inspect
import os
import threading
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, Iterable

from .errors import KernelSearchError
from .spec import KernelDef

ENTRY_POINT_GROUP = "kernelsearch.kernels"
MODULES_ENV = "KS_KERNEL_MODULES"

_lock = threading.RLock()
_kernels: dict[str, KernelDef] = {}
_module_of: dict[str, str] = {}
_errors: dict[str, str] = {}  # plugin source (entry point or module) -> why it failed to load
_loaded_sources: set[str] = set()
_entry_points_done = False


class UnknownKernel(KernelSearchError, KeyError):
    """No kernel of that name; the message lists the known ones and the plugins that failed."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class PluginLoadError(KernelSearchError, ImportError):
    """A plugin module or entry point could not be imported or gave no kernel."""


def register(kernel: KernelDef, *, replace: bool = False) -> KernelDef:
    """Make `kernel` known in this process; returns it, so it can decorate a module-level value."""
    if not isinstance(kernel, KernelDef):
        raise TypeError(f"register() takes a KernelDef, got {type(kernel).__name__}")
    with _lock:
        old = _kernels.get(kernel.name)
        if old is not None and old is not kernel and not replace:
            if _module_of.get(kernel.name) != _module_name(kernel):
                raise ValueError(f"kernel {kernel.name!r} is already registered from "
                                 f"{_module_of.get(kernel.name)!r}; pass replace=True to override")
        _kernels[kernel.name] = kernel
        _module_of[kernel.name] = _module_name(kernel)
    return kernel


def unregister(name: str) -> None:
    with _lock:
        _kernels.pop(name, None)
        _module_of.pop(name, None)


def _module_name(kernel: KernelDef) -> str:
    return getattr(kernel, "module", None) or getattr(kernel.launch, "__module__", "") or ""


def _register_from(obj: Any, source: str) -> int:
    """Register what a plugin exposes: a KernelDef, an iterable of them, a module holding
    `KERNEL`/`KERNELS`, or a callable returning any of those."""
    if isinstance(obj, KernelDef):
        register(obj, replace=True)
        return 1
    if isinstance(obj, ModuleType):
        found = getattr(obj, "KERNELS", None) or getattr(obj, "KERNEL", None)
        if found is None:
            # The module may have called register() itself on import.
            return sum(1 for m in _module_of.values() if m == obj.__name__)
        return _register_from(found, source)
    if isinstance(obj, dict):
        return _register_from(list(obj.values()), source)
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        return sum(_register_from(o, source) for o in obj)
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return _register_from(obj(), source)
    raise PluginLoadError(f"{source}: gives {type(obj).__name__}, not a kernelsearch KernelDef")


def load_module(name: str) -> int:
    """Import a module that declares kernels and register them; a PluginLoadError naming the module
    otherwise."""
    name = name.strip()
    try:
        mod = importlib.import_module(name)
        n = _register_from(mod, f"module {name!r}")
    except PluginLoadError as e:
        with _lock:
            _errors[name] = str(e)
        raise
    except Exception as e:  # noqa: BLE001 - a user's module may raise anything on import
        msg = f"kernel module {name!r} failed to import: {type(e).__name__}: {e}"
        with _lock:
            _errors[name] = msg
        raise PluginLoadError(msg) from e
    with _lock:
        _errors.pop(name, None)
        _loaded_sources.add(name)
    return n


def env_modules() -> list[str]:
    raw = os.environ.get(MODULES_ENV, "")
    return [m.strip() for m in raw.replace(";", ",").replace(":", ",").split(",") if m.strip()]


def load_plugins(modules: Iterable[str] = ()) -> None:
    """Load entry points once, then every module named in `KS_KERNEL_MODULES` and `modules` not
    loaded yet. A plugin that fails is remembered (see `plugin_errors`) and does not stop the rest."""
    global _entry_points_done
    with _lock:
        if not _entry_points_done:
            _entry_points_done = True
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                source = f"entry point {ep.name!r} ({ep.value})"
                try:
                    _register_from(ep.load(), source)
                except Exception as e:  # noqa: BLE001
                    _errors[ep.value] = f"{source} failed to load: {type(e).__name__}: {e}"
        for name in [*env_modules(), *modules]:
            if name in _loaded_sources or name in _errors:
                continue  # a failed module is retried only by an explicit load_module()
            try:
                load_module(name)
            except PluginLoadError:
                pass


def plugin_errors() -> dict[str, str]:
    with _lock:
        return dict(_errors)


def all_kernels() -> dict[str, KernelDef]:
    load_plugins()
    with _lock:
        return {n: _kernels[n] for n in sorted(_kernels)}


def kernel_names() -> list[str]:
    return sorted(all_kernels())


def get_kernel(name: str) -> KernelDef:
    """The kernel of that name; an UnknownKernel listing the known ones (and any plugin that failed
    to load, which is the usual reason a kernel is missing)."""
    load_plugins()
    with _lock:
        k = _kernels.get(name)
        if k is not None:
            return k
        known = ", ".join(sorted(_kernels)) or "none"
        errs = "; ".join(_errors.values())
    msg = f"unknown kernel {name!r}; known: {known}"
    if errs:
        msg += f"; plugins that failed to load: {errs}"
    raise UnknownKernel(msg)


def resolve(name: str, module: str | None = None) -> KernelDef:
    """`get_kernel`, importing `module` first when the name is not known yet: a process started
    before a kernel was registered elsewhere (a trial child, a worker) learns it from the module
    its declaration lives in. A module that fails raises PluginLoadError naming it."""
    try:
        return get_kernel(name)
    except UnknownKernel:
        if not module or module == "__main__":
            raise
    load_module(module)
    return get_kernel(name)


def plugin_modules() -> list[str]:
    """Modules whose import registers the kernels known here: a child process imports these to see
    the same kernels (in-process registrations from `__main__` cannot travel)."""
    with _lock:
        return sorted({m for m in _module_of.values() if m and m != "__main__"})
