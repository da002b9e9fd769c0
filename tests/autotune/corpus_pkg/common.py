"""Inputs and grids shared by the corpus entries."""
from __future__ import annotations

import torch
import triton


def inputs(seed: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Seeded normal values: every mode's process draws the same."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def grid1d(n: int):
    """One program per BLOCK elements."""
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
