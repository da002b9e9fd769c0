"""gemlite's and vLLM fused_moe's pruning: `prune_configs_by` with an early prune over the call's
arguments, a performance model and `top_k`, and `use_cuda_graph` as gemlite passes it."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


def _early_prune(configs, named_args, **kwargs):
    n = named_args["n"]
    return [c for c in configs if c.kwargs["BLOCK"] <= max(16, triton.next_power_of_2(n))]


def _perf_model(**kw):
    return kw["BLOCK"] * (1 + kw.get("num_warps", 4))


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w)
                          for b in (16, 32, 256) for w in (1, 2)],
                 key=["n"],
                 prune_configs_by={"early_config_prune": _early_prune, "perf_model": _perf_model,
                                   "top_k": 3},
                 use_cuda_graph=False)
@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m),
             mask=m)


def run() -> dict[str, torch.Tensor]:
    x, y = inputs(10, 120), inputs(11, 120)
    out = torch.empty(120)
    _axpy_kernel[grid1d(120)](x, y, out, 3.0, 120)
    return {"out": out}
