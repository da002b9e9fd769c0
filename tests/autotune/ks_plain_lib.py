"""A library as shipped: plain `@triton.autotune`, kernelsearch never named. A user's program
reaches it through the swap (`ks_swap_user.py`); a worker imports it as it is here.

`one_block_kernel` runs one program that must cover the whole tensor: its pruner keeps the
configs whose BLOCK does, so the unpruned first config (BLOCK 16) writes only part of a larger
call's output."""
from __future__ import annotations

import triton
import triton.language as tl

from at_env import counting_bench


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1),
                          triton.Config({"BLOCK": 32}, num_warps=2)],
                 key=["n"], do_bench=counting_bench)
@triton.jit
def triple_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 3 x."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 3.0, mask=m)


def _covering(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] >= named_args["n"]]


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 64, 256, 512)],
                 key=["n"], prune_configs_by={"early_config_prune": _covering},
                 do_bench=counting_bench)
@triton.jit
def one_block_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = x + 1, by one program of BLOCK elements."""
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)


@triton.heuristics({"EVEN": lambda args: args["n"] % 16 == 0})
@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1),
                          triton.Config({"BLOCK": 32}, num_warps=1)], key=["n"])
@triton.jit
def halve_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """y = x / 2, heuristics above the autotuner (the call reaches it with EVEN set)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(y_ptr + offs, tl.load(x_ptr + offs) * 0.5)
    else:
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 0.5, mask=m)


def triple(x):
    import torch

    y = torch.empty_like(x)
    triple_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y


def plus_one(x):
    import torch

    y = torch.empty_like(x)
    one_block_kernel[(1,)](x, y, x.numel())
    return y


class LaunchCache(triton.runtime.KernelInterface):
    """A library's wrapper over its autotuner (FlagGems' `@libentry()`: a launch cache holding
    the autotuner as `.fn`); the module's kernel object is the wrapper."""

    def __init__(self, fn):
        self.fn = fn
        self.arg_names = fn.arg_names

    def run(self, *args, **kwargs):
        return self.fn.run(*args, **kwargs)


@LaunchCache
@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1),
                          triton.Config({"BLOCK": 32}, num_warps=1)], key=["n"])
@triton.jit
def quarter_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = x / 4, under a launch-cache wrapper."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 0.25, mask=m)


def quarter(x):
    import torch

    y = torch.empty_like(x)
    quarter_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y
