"""Keys over what libraries pass besides sizes: a float (a scale), a bool (Liger's `w_is_None`),
a string (gemlite's evict and atomic modes), a Triton dtype (gemlite's `output_dtype`) and an
argument passed as None; the tensors' dtypes (float32 and float16) are Triton's key too."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32}),
                          triton.Config({"BLOCK": 64})],
                 key=["n", "scale", "SQUARE", "ACT", "OUT_DTYPE", "unused_ptr"])
@triton.jit
def _scaled_act_kernel(x_ptr, y_ptr, unused_ptr, n, scale, SQUARE: tl.constexpr,
                       ACT: tl.constexpr, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m).to(tl.float32) * scale
    if SQUARE:
        x = x * x
    if ACT == "relu":
        x = tl.maximum(x, 0.0)
    tl.store(y_ptr + offs, x.to(OUT_DTYPE), mask=m)


def _call(x: torch.Tensor, scale: float, square: bool, act: str, out: torch.dtype) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=out)
    tl_out = tl.float16 if out == torch.float16 else tl.float32
    _scaled_act_kernel[grid1d(x.numel())](x, y, None, x.numel(), scale, SQUARE=square, ACT=act,
                                          OUT_DTYPE=tl_out)
    return y


def run() -> dict[str, torch.Tensor]:
    x = inputs(7, 100)
    return {"a": _call(x, 0.5, False, "relu", torch.float32),
            "b": _call(x, 2.0, True, "none", torch.float32),
            "c": _call(x.half(), 0.5, False, "relu", torch.float16)}
