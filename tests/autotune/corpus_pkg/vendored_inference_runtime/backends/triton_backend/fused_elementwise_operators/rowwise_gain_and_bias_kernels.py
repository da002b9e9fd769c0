"""A kernel deep in a vendor tree (FlagGems' runtime/backend/_vendor/ops layout): its module plus
qualified name is longer than 100 characters."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import inputs


@triton.autotune(configs=[triton.Config({"BLOCK_COLS": 16}, num_warps=1),
                          triton.Config({"BLOCK_COLS": 32}, num_warps=2)],
                 key=["n_cols"])
@triton.jit
def _apply_rowwise_learned_gain_and_bias_forward_kernel_for_vendor_backend(
        x_ptr, gain_ptr, bias_ptr, y_ptr, n_cols, BLOCK_COLS: tl.constexpr):
    row = tl.program_id(0)
    col = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    m = col < n_cols
    x = tl.load(x_ptr + row * n_cols + col, mask=m)
    g = tl.load(gain_ptr + col, mask=m)
    b = tl.load(bias_ptr + col, mask=m)
    tl.store(y_ptr + row * n_cols + col, x * g + b, mask=m)


def run() -> dict[str, torch.Tensor]:
    x, gain, bias = inputs(1, 4, 40), inputs(2, 40), inputs(3, 40)
    y = torch.empty_like(x)
    k = _apply_rowwise_learned_gain_and_bias_forward_kernel_for_vendor_backend
    k[lambda meta: (4, triton.cdiv(40, meta["BLOCK_COLS"]))](x, gain, bias, y, 40)
    return {"y": y}
