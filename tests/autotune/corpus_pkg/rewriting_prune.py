"""gemlite's pruner: `early_config_prune` does not pick from the list, it yields new configs,
block sizes fitted to the call and constexprs the listed configs never set (gemlite's
NUM_STAGES and EVEN_K), deduplicated."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from corpus_pkg.common import grid1d, inputs


def _fit_to_call(configs, nargs, **kwargs):
    n, seen = nargs["n"], set()
    for c in configs:
        block = min(c.kwargs["BLOCK"], triton.next_power_of_2(n))
        made = (block, c.num_warps)
        if made in seen:
            continue
        seen.add(made)
        yield triton.Config({"BLOCK": block, "EVEN": n % block == 0}, num_warps=c.num_warps)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 512)
                          for w in (1, 2)],
                 key=["n"],
                 prune_configs_by={"early_config_prune": lambda c, n, **kw: list(_fit_to_call(c, n, **kw))})
@triton.jit
def _fitted_square_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        x = tl.load(x_ptr + offs)
        tl.store(y_ptr + offs, x * x)
    else:
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, x * x, mask=offs < n)


def run() -> dict[str, torch.Tensor]:
    x = inputs(50, 96)
    y = torch.empty_like(x)
    _fitted_square_kernel[grid1d(96)](x, y, 96)
    return {"y": y}
