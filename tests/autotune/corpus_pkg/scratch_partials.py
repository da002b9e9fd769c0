"""Liger's DyT backward: each program writes its partial sum into a scratch buffer slot indexed
by its program id (`reset_to_zero` on it: trials with another BLOCK fill other slots), and the
op sums the buffer afterwards; which slots hold what depends on the config."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


# The first config runs the most programs (the interpreter's cost): another one wins.
@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64}),
                          triton.Config({"BLOCK": 128})],
                 key=["n"], reset_to_zero=["partial_ptr"])
@triton.jit
def _partial_sumsq_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(x * x, axis=0))


def run() -> dict[str, torch.Tensor]:
    x = inputs(60, 512)
    partial = torch.zeros(triton.cdiv(512, 16))  # room for the smallest block's programs
    _partial_sumsq_kernel[grid1d(512)](x, partial, 512)
    return {"sumsq": partial.sum().reshape(1)}
