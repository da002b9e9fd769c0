"""A test-only kernel, y = g * cos(a), whose configs each have one fault the gate must see.

`FAULT=range` is right on every draw but the magnitude ones: zeros where |g| < 1e-10, NaN where
|g| > 1e10 (a fixed binary point's band). `FAULT=angles` reduces the angle with one float32
constant for 2*pi, accurate near zero and off by 1e-3 at 1e5 rad (an unreduced fast cosine).
Both pass the benchmark's and the realistic draw; only the declared domain catches them.
Importing this module registers the kernel; the runner's child imports it by name.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from kernelsearch import kernels
from kernelsearch.kernels.device import default_device
from kernelsearch.kernels.spec import Axis, InputDomain, KernelDef, Param

NAME = "ks_test_domain"
MAX_ANGLE = 1e5
_TWO_PI_F32 = float(torch.tensor(2 * math.pi, dtype=torch.float32))


def launch(g: torch.Tensor, a: torch.Tensor, *, config: Mapping[str, Any], out=None):
    y = out[0] if out is not None else torch.empty_like(g)
    fault = config["FAULT"]
    if fault == "angles":
        k = torch.round(a / _TWO_PI_F32)
        c = torch.cos(a - k * _TWO_PI_F32)
    else:
        c = torch.cos(a)
    v = g * c
    if fault == "range":
        v = torch.where(g.abs() < 1e-10, torch.zeros_like(v), v)
        v = torch.where(g.abs() > 1e10, torch.full_like(v, math.nan), v)
    y.copy_(v)
    return (y,)


def make_inputs(axes, *, seed, distribution="benchmark", device=None):
    device = torch.device(device) if device is not None else default_device()
    n = int(axes["n"])
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen)
    if distribution == "benchmark":
        a = torch.randn(n, generator=gen)
    elif distribution == "realistic":
        a = torch.arange(n, dtype=torch.float32) * (10.0 / max(n, 1))
    elif distribution == "long":
        a = torch.rand(n, generator=gen) * MAX_ANGLE
    else:
        raise ValueError(f"distribution: unknown {distribution!r}")
    return g.to(device), a.to(device)


def reference(g, a):
    return (g.double() * torch.cos(a.double()),)


KERNEL = KernelDef(
    name=NAME, description="test-only: y = g cos(a), with configs that fail one domain draw each",
    benchmark_problem="none", axes=(Axis("n", 1, 4096),),
    params=(Param("FAULT", ("none", "range", "angles"), "none"),),
    cases=(), input_names=("g", "a"), output_names=("y",), rtol=2e-5,
    make_inputs=make_inputs, reference=reference,
    torch_reference=lambda g, a: (g * torch.cos(a),),
    launch=launch, axes_of=lambda g, a: {"n": int(g.numel())},
    bytes_moved=lambda axes: 12 * int(axes["n"]), check_inputs=lambda g, a: None,
    domain=InputDomain(scale_groups=(("g",),), edge=("long",),
                       notes=f"g scaled by 1e-30 .. 1e30; angles up to {MAX_ANGLE:g} rad"),
)

kernels.register(KERNEL, replace=True)
