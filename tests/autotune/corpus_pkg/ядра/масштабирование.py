"""A module and a kernel named in Cyrillic: any Python identifier is a kernel's name."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def удвоить_и_сдвинуть(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0 + 1.0, mask=m)


def run() -> dict[str, torch.Tensor]:
    x = inputs(4, 150)
    y = torch.empty_like(x)
    удвоить_и_сдвинуть[grid1d(150)](x, y, 150)
    return {"y": y}
