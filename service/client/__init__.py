"""kernelsearch: tuned Triton configs kept in a database and served, instead of re-tuned per process.

This folder is the installed `kernelsearch` package itself, and the client: everything that runs
in a user's program (the decorator, the torch.compile decision, the Triton cache manager, the
Helion backend, `get_kernel`'s provider, the service's REST client) is a module of it.
pyproject.toml maps it, and maps `kernels/`, `search_space/`, `db/` and `service/` (the server)
beneath it: the repository's top level is fixed, so the root of the import namespace lives here.
Names resolve lazily, so `import kernelsearch` stays cheap and pulls in torch or the service only
when one of them is used.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "autotune": ("kernelsearch.decorator", "autotune"),
    "Autotuner": ("kernelsearch.tuner", "Autotuner"),
    "register": ("kernelsearch.kernels.registry", "register"),
    "get_kernel": ("kernelsearch.kernels.registry", "get_kernel"),
    "kernel_names": ("kernelsearch.kernels.registry", "kernel_names"),
    "KernelDef": ("kernelsearch.kernels.spec", "KernelDef"),
    "runtime_of": ("kernelsearch.kernels.runtime", "runtime_of"),
    "Param": ("kernelsearch.kernels.spec", "Param"),
    "Axis": ("kernelsearch.kernels.spec", "Axis"),
    "Case": ("kernelsearch.kernels.spec", "Case"),
    "LAUNCH_OPTIONS": ("kernelsearch.kernels.configs", "LAUNCH_OPTIONS"),
    "split_config": ("kernelsearch.kernels.configs", "split_config"),
    "config_key": ("kernelsearch.kernels.configs", "config_key"),
    "params_from_configs": ("kernelsearch.kernels.spec", "params_from_configs"),
    "configs_rule": ("kernelsearch.kernels.spec", "configs_rule"),
    "cases_from_rows": ("kernelsearch.kernels.spec", "cases_from_rows"),
    "load_cases": ("kernelsearch.kernels.spec", "load_cases"),
    "check_tensor": ("kernelsearch.kernels.spec", "check_tensor"),
    "from_triton_config": ("kernelsearch.kernels.configs", "from_triton_config"),
    "to_triton_config": ("kernelsearch.kernels.configs", "to_triton_config"),
    "prefetch": ("kernelsearch.artifacts", "prefetch"),
}

__all__ = sorted(_LAZY)
# Subpackages and the hook modules a program may name (`kernelsearch.triton_cache`, ...).
_SUBMODULES = ("kernels", "search_space", "db", "service", "triton_cache", "helion", "artifacts")


def __getattr__(name: str) -> Any:
    if name == "__version__":  # written once, in pyproject.toml; read when asked for
        from importlib import metadata

        try:
            return metadata.version("kernelsearch")
        except metadata.PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    try:
        module, attr = _LAZY[name]
    except KeyError:
        if name in _SUBMODULES:
            return importlib.import_module(f"kernelsearch.{name}")
        raise AttributeError(f"module 'kernelsearch' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), attr)


def __dir__() -> list[str]:
    return sorted([*__all__, *_SUBMODULES, "__version__"])
