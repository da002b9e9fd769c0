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
from .provider import ConfigProvider, set_provider  # noqa: E402
from .spec import Case, KernelDef, Param  # noqa: E402
from .vision_rope3d_spatial_merge_bwd import KERNEL as _B  # noqa: E402
from .vision_rope_generation_bwd import KERNEL as _A  # noqa: E402

KERNELS: dict[str, KernelDef] = {_A.name: _A, _B.name: _B}

vision_rope_generation_bwd = _A
vision_rope3d_spatial_merge_bwd = _B


def get_kernel(name: str) -> KernelDef:
    """The kernel of that name; a KeyError listing the known ones otherwise."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(sorted(KERNELS))}") from None


__all__ = [
    "KERNELS", "get_kernel", "vision_rope_generation_bwd", "vision_rope3d_spatial_merge_bwd",
    "KernelDef", "Param", "Case", "ConfigProvider", "set_provider", "FailureKind",
    "KernelSearchError",
]
