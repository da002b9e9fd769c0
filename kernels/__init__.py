"""Tunable Triton kernels with their references, cases and measurement.

Without a visible GPU the kernels run under the Triton interpreter: it is turned on here, before
the kernel modules load, and kernels a program decorated earlier run under it too (`interpreter`).
"""
from __future__ import annotations

from .interpreter import use_interpreter_without_gpu

use_interpreter_without_gpu()

from .errors import FailureKind, KernelSearchError  # noqa: E402
from .provider import set_resolver  # noqa: E402
from .resolve import ConfigSource, Found, Key, Resolver  # noqa: E402
from .spec import Case, KernelDef, Param  # noqa: E402
from .registry import (  # noqa: E402
    UnknownKernel, all_kernels, get_kernel, kernel_names, load_plugins, register,
)

__all__ = [
    "get_kernel", "kernel_names", "all_kernels", "load_plugins", "register", "UnknownKernel",
    "KernelDef", "Param", "Case", "ConfigSource", "Found", "Key", "Resolver", "set_resolver",
    "FailureKind",
    "KernelSearchError",
]
