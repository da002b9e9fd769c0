"""mamba_ssm's and fla's stack: `@triton.autotune` over `@triton.heuristics` over `@triton.jit`,
the heuristics deriving constexprs from the arguments and the config's block."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})],
                 key=["n"])
@triton.heuristics({"EVEN_N": lambda args: args["n"] % args["BLOCK"] == 0,
                    "HAS_RESIDUAL": lambda args: args["res_ptr"] is not None})
@triton.jit
def _residual_silu_kernel(x_ptr, res_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN_N: tl.constexpr,
                          HAS_RESIDUAL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN_N:
        x = tl.load(x_ptr + offs)
    else:
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    if HAS_RESIDUAL:
        x += tl.load(res_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, x / (1.0 + tl.exp(-x)), mask=offs < n)


def run() -> dict[str, torch.Tensor]:
    x, r = inputs(8, 96), inputs(9, 96)
    y1, y2 = torch.empty(96), torch.empty(90)
    _residual_silu_kernel[grid1d(96)](x, r, y1, 96)
    _residual_silu_kernel[grid1d(90)](x[:90].contiguous(), None, y2, 90)
    return {"residual": y1, "plain": y2}
