"""A user's gemlite-like kernel under `@kernelsearch.autotune`: its pruner (the corpus's
`rewriting_prune`) does not pick from the list, it makes configs fitted to the call, with a
constexpr (EVEN) that no listed or searched config sets."""
from __future__ import annotations

import triton
import triton.language as tl

import kernelsearch

from corpus_pkg.rewriting_prune import _fit_to_call

CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 512}, num_warps=1)]
# Beyond the list: one the pruner makes new (BLOCK 128, 2 warps on n=96), one it makes into a
# listed config's (BLOCK 128, 1 warp, as from BLOCK 512), one it drops (its bad warps).
BEYOND = [triton.Config({"BLOCK": 256}, num_warps=2), triton.Config({"BLOCK": 1024}, num_warps=1),
          triton.Config({"BLOCK": 64}, num_warps=8)]


def _prune(configs, nargs, **kwargs):
    return list(_fit_to_call([c for c in configs if c.num_warps < 8], nargs, **kwargs))


@kernelsearch.autotune(configs=CONFIGS, key=["n"], search_space=BEYOND,
                       prune_configs_by={"early_config_prune": _prune})
@triton.jit
def fitted_square_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """y = x * x."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        x = tl.load(x_ptr + offs)
        tl.store(y_ptr + offs, x * x)
    else:
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, x * x, mask=offs < n)


def square(x):
    import torch

    y = torch.empty_like(x)
    fitted_square_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y
