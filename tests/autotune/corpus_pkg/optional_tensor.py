"""fla's optional gate and Liger's optional bias: one kernel called with a tensor and with None,
a constexpr flag saying which."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
@triton.jit
def _gated_tanh_kernel(x_ptr, gate_ptr, y_ptr, n, HAS_GATE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0
    if HAS_GATE:
        y = y * tl.load(gate_ptr + offs, mask=m)
    tl.store(y_ptr + offs, y, mask=m)


def run() -> dict[str, torch.Tensor]:
    x, g = inputs(30, 80), inputs(31, 80)
    y1, y2 = torch.empty(80), torch.empty(80)
    _gated_tanh_kernel[grid1d(80)](x, g, y1, 80, HAS_GATE=True)
    _gated_tanh_kernel[grid1d(80)](x, None, y2, 80, HAS_GATE=False)
    return {"gated": y1, "plain": y2}
