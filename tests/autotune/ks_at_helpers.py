"""Small decorated kernels for the autotune tests (a unique module name: test folders are not
packages). Built on import under the interpreter."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kernelsearch  # noqa: E402

N_MAX = 1 << 16


@kernelsearch.autotune(
    configs=[triton.Config({"BLOCK": 32, "WRONG": 0}, num_warps=4),
             triton.Config({"BLOCK": 64, "WRONG": 0}, num_warps=2),
             triton.Config({"BLOCK": 32, "WRONG": 1}, num_warps=2)],
    key=["n"], reset_to_zero=["out_ptr"], restore_value=["x_ptr"])
@triton.jit
def accumulate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, WRONG: tl.constexpr):
    """out += 2 * x, while x is doubled in place (restore_value puts it back); WRONG adds 1."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(x_ptr + offs, x * 2, mask=m)
    add = x * 2 + WRONG
    tl.atomic_add(out_ptr + offs, add, mask=m)


def accumulate(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    n = x.numel()
    accumulate_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


def make_inputs(axes, *, seed, distribution="benchmark", device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(int(axes["n"]), generator=gen).to(device),)


KERNEL = accumulate_kernel.declare(
    name="ks_test_accumulate", launch=accumulate, make_inputs=make_inputs, axes=("n",),
    input_names=("x",), output_names=("out",), bytes_moved=lambda a: 8 * int(a["n"]), rtol=1e-6,
    cases=[(100,)])


def _small_enough(configs, named_args, **kwargs):
    """Keep the configs whose block fits the problem (at least one: the smallest)."""
    keep = [c for c in configs if c.kwargs["BLOCK"] <= named_args["n"]]
    return keep or [min(configs, key=lambda c: c.kwargs["BLOCK"])]


@kernelsearch.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 64, 256) for w in (1, 2)],
    key=["n"], prune_configs_by={"early_config_prune": _small_enough})
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 3, mask=m)


def scale(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


SCALE = scale_kernel.declare(
    name="ks_test_pruned_scale", launch=scale, make_inputs=make_inputs, axes=("n",),
    input_names=("x",), output_names=("out",), bytes_moved=lambda a: 8 * int(a["n"]), rtol=1e-6)
