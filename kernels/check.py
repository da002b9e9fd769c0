"""Correctness: a config is right only if it matches float64 on fresh inputs from both draws."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from .device import default_device
from .errors import WrongResult
from .spec import KernelDef

DISTRIBUTIONS = ("benchmark", "realistic")


@dataclass
class CheckResult:
    ok: bool
    # Worst relative error over the outputs, per input distribution (nan when an output was NaN).
    errors: dict[str, float] = field(default_factory=dict)
    detail: str = ""

    @property
    def max_error(self) -> float:
        vals = list(self.errors.values())
        if any(math.isnan(v) for v in vals):
            return math.nan
        return max(vals) if vals else math.nan


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN when the output holds a NaN or an Inf."""
    o = out.detach().double().to(ref.device)
    if not torch.isfinite(o).all():
        return math.nan
    denom = ref.norm().item()
    diff = (o - ref).norm().item()
    return diff / denom if denom > 0 else diff


def check_config(kernel: KernelDef, axes: Mapping[str, int], config: Mapping[str, Any], *,
                 device: torch.device | None = None, seed: int | None = None,
                 distributions: Sequence[str] = DISTRIBUTIONS) -> CheckResult:
    """Run once per distribution on fresh inputs into NaN-poisoned outputs and compare."""
    device = device or default_device()
    cfg = kernel.validate_config(config)
    errors: dict[str, float] = {}
    problems: list[str] = []
    for i, dist in enumerate(distributions):
        s = (seed + i) if seed is not None else int.from_bytes(os.urandom(4), "little")
        inputs = kernel.make_inputs(axes, seed=s, distribution=dist, device=device)
        before = [t.clone() for t in inputs]
        refs = kernel.reference(*inputs)
        outs = tuple(torch.full(r.shape, math.nan, dtype=torch.float32, device=device) for r in refs)
        kernel.launch(*inputs, config=cfg, out=outs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        worst = 0.0
        for name, o, r in zip(kernel.output_names, outs, refs):
            e = rel_error(o, r)
            if math.isnan(e):
                problems.append(f"{dist}: {name} has NaN/Inf (unwritten or overflow)")
                worst = math.nan
            elif e > kernel.rtol:
                problems.append(f"{dist}: {name} relative error {e:.3g} > {kernel.rtol:g}")
            if not math.isnan(worst):
                worst = max(worst, e) if not math.isnan(e) else math.nan
        for name, a, b in zip(kernel.input_names, inputs, before):
            if not torch.equal(a, b):
                problems.append(f"{dist}: input {name} was modified")
        errors[dist] = worst
    return CheckResult(ok=not problems, errors=errors, detail="; ".join(problems))


def assert_correct(kernel: KernelDef, axes: Mapping[str, int], config: Mapping[str, Any],
                   **kw: Any) -> CheckResult:
    """check_config that raises WrongResult, for the tuner's trial pipeline."""
    res = check_config(kernel, axes, config, **kw)
    if not res.ok:
        raise WrongResult(res.detail)
    return res
