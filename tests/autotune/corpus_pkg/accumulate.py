"""Liger's DyT backward (`reset_to_zero` on a partial-sum buffer that autotuning trials would
otherwise leave dirty) and gemlite (`restore_value` on tensors the kernel updates in place)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32}),
                          triton.Config({"BLOCK": 64})],
                 key=["n"], reset_to_zero=["sum_ptr"], restore_value=["state_ptr"])
@triton.jit
def _ema_update_kernel(state_ptr, x_ptr, sum_ptr, n, decay, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    s = tl.load(state_ptr + offs, mask=m)
    new = decay * s + (1.0 - decay) * tl.load(x_ptr + offs, mask=m)
    tl.store(state_ptr + offs, new, mask=m)
    tl.atomic_add(sum_ptr, tl.sum(tl.where(m, new, 0.0), axis=0))


def run() -> dict[str, torch.Tensor]:
    state, x = inputs(12, 130), inputs(13, 130)
    total = torch.zeros(1)
    _ema_update_kernel[grid1d(130)](state, x, total, 130, 0.9)
    return {"state": state, "sum": total}
