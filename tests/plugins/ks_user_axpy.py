"""A user's kernel, written only against the public contract (`import kernelsearch`), the way a
kernel engineer brings one: out = alpha * x + y over n elements, in float16 or float32 (the dtype
is a case axis), with its space as a list of triton.Config. Found through KS_KERNEL_MODULES.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import triton
import triton.language as tl

import kernelsearch

NAME = "ks_user_axpy"
CONFIGS = [
    triton.Config({"BLOCK": 32}, num_warps=1),
    triton.Config({"BLOCK": 64}, num_warps=2),
    triton.Config({"BLOCK": 128}, num_warps=4, num_stages=2),
]
DTYPES = {"float16": torch.float16, "float32": torch.float32}


@triton.jit
def _fma(a, x, y):
    return a * x + y


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, _fma(alpha, x, y).to(out_ptr.dtype.element_ty), mask=m)


def launch(x: torch.Tensor, y: torch.Tensor, alpha: torch.Tensor, *, config: Mapping[str, Any],
           out: tuple[torch.Tensor] | None = None) -> tuple[torch.Tensor]:
    meta, opts = kernelsearch.split_config(config)
    res = out[0] if out is not None else torch.empty_like(x)
    n = x.numel()
    # Kept for the trial's registers and spills (optional; KERNEL is this module's declaration).
    kernelsearch.runtime_of(KERNEL).last_compiled = _axpy_kernel[(triton.cdiv(n, meta["BLOCK"]),)](
        x, y, res, float(alpha.item()), n, **meta, **opts)
    return (res,)


def make_inputs(axes: Mapping[str, Any], *, seed: int, distribution: str = "benchmark",
                device: Any = None) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    n, dt = int(axes["n"]), DTYPES[axes["dtype"]]
    x = torch.randn(n, generator=gen)
    y = torch.randn(n, generator=gen) if distribution == "benchmark" else torch.zeros(n)
    alpha = torch.tensor([1.5])
    dev = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    return x.to(dt).to(dev), y.to(dt).to(dev), alpha.to(dev)


def reference(x: torch.Tensor, y: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor]:
    return (alpha.double() * x.double() + y.double(),)


def check_inputs(x: torch.Tensor, y: torch.Tensor, alpha: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in DTYPES.values():
        raise ValueError(f"x: expected a float16 or float32 tensor, got {getattr(x, 'dtype', type(x))}")
    kernelsearch.check_tensor("x", x, shape=(None,), dtype=x.dtype)
    kernelsearch.check_tensor("y", y, shape=tuple(x.shape), dtype=x.dtype, device=x.device)
    kernelsearch.check_tensor("alpha", alpha, shape=(1,), dtype=torch.float32, device=x.device)


KERNEL = kernelsearch.register(kernelsearch.KernelDef(
    name=NAME, description="a user's axpy: out = alpha * x + y", benchmark_problem="",
    axes=(kernelsearch.Axis("n", 1, 1 << 24, "elements"),
          kernelsearch.Axis("dtype", choices=tuple(DTYPES), doc="element type of x, y and out")),
    params=kernelsearch.params_from_configs(CONFIGS),
    rules=kernelsearch.configs_rule(CONFIGS),
    space=CONFIGS,
    cases=kernelsearch.cases_from_rows([{"n": 96, "dtype": "float16"}, {"n": 96, "dtype": "float32"},
                                        {"n": 400, "dtype": "float16"}], ("n", "dtype")),
    input_names=("x", "y", "alpha"), output_names=("out",),
    rtol=1e-6, tolerance=lambda axes: 1e-3 if axes["dtype"] == "float16" else 1e-6,
    output_dtypes=lambda axes: (DTYPES[axes["dtype"]],),
    make_inputs=make_inputs, reference=reference, torch_reference=None, launch=launch,
    axes_of=lambda x, y, alpha: {"n": int(x.numel()), "dtype": str(x.dtype).removeprefix("torch.")},
    bytes_moved=lambda axes: 3 * int(axes["n"]) * DTYPES[axes["dtype"]].itemsize,
    flops=lambda axes: 2 * int(axes["n"]),
    check_inputs=check_inputs,
    triton_kernels=(_axpy_kernel,),
))
