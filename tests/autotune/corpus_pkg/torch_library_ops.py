"""torchao's and vLLM's pattern: the op is a `torch.library.triton_op` whose body launches the
autotuned kernel through `wrap_triton` (what lets torch.compile trace it)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from corpus_pkg.common import grid1d, inputs


@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=2),
                          triton.Config({"BLOCK": 64}, num_warps=4)], key=["n"])
@triton.jit
def _gelu_tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    inner = 0.7978845608 * (x + 0.044715 * x * x * x)
    t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + t), mask=m)


@triton_op("ks_corpus::gelu_tanh", mutates_args={})
def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    wrap_triton(_gelu_tanh_kernel)[grid1d(x.numel())](x, y, x.numel())
    return y


def run() -> dict[str, torch.Tensor]:
    x = inputs(5, 3, 50)
    return {"direct": gelu_tanh(x), "dispatcher": torch.ops.ks_corpus.gelu_tanh(inputs(6, 70))}
