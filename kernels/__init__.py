"""Tunable Triton kernels with their references, cases and measurement.

Without a visible GPU the kernels run under the Triton interpreter: the variable has to be set
before any kernel is decorated, so it is decided here, before the kernel modules load.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

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
