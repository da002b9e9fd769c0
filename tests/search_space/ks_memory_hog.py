"""A test-only kernel whose launch first allocates HOG_BYTES of host memory (never touched:
without a bound the allocation succeeds, overcommitted, and the trial goes on as
ks_fake_kernels' y = 2x). Importing this module registers it."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ks_fake_kernels
import torch

from kernelsearch import kernels

NAME = "ks_test_memory_hog"
HOG_BYTES = 8 << 30


def launch(x: torch.Tensor, *, config: Mapping[str, Any], out: Any = None) -> Any:
    hog = torch.empty(HOG_BYTES, dtype=torch.uint8)
    del hog
    return ks_fake_kernels.launch(x, config=config, out=out)


KERNEL = dataclasses.replace(ks_fake_kernels.KERNEL, name=NAME, launch=launch,
                             description="test-only: allocates 8 GiB of host memory, then y = 2x")
kernels.register(KERNEL, replace=True)
