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


class _Draw:
    """One draw of a case's inputs, an untouched copy of it and (once asked) its float64 outputs."""

    def __init__(self, inputs: Sequence[torch.Tensor]):
        self.inputs = tuple(inputs)
        self.pristine = tuple(t.clone() for t in self.inputs)
        self.refs: tuple[torch.Tensor, ...] | None = None

    def modified(self) -> list[int]:
        return [i for i, (a, b) in enumerate(zip(self.inputs, self.pristine)) if not torch.equal(a, b)]


class InputCache:
    """Input draws (and their float64 references) kept between the trials of one case.

    A trial process checks and times many configs of the same case: drawing the inputs on the
    CPU, copying them to the device and computing the float64 reference again for every config
    costs more than the kernel. Draws are keyed by (seed, distribution) within one case
    (kernel, axes, device); asking for another case forgets the previous one, so device memory
    stays at one case's worth over a run. Each draw keeps an untouched copy: `verify()` forgets
    the case when a launch modified any input, so a modified input is never reused.
    """

    def __init__(self) -> None:
        self._case: tuple | None = None
        self._draws: dict[tuple[int, str], _Draw] = {}

    def __len__(self) -> int:
        return len(self._draws)

    def get(self, kernel: KernelDef, axes: Mapping[str, int], seed: int, distribution: str,
            device: torch.device) -> _Draw:
        case = (kernel.name, tuple(sorted(axes.items())), str(device))
        if case != self._case:
            self.clear()
            self._case = case
        draw = self._draws.get((seed, distribution))
        if draw is None:
            draw = _Draw(kernel.make_inputs(axes, seed=seed, distribution=distribution, device=device))
            self._draws[(seed, distribution)] = draw
        return draw

    def reference(self, kernel: KernelDef, draw: _Draw) -> tuple[torch.Tensor, ...]:
        """The float64 outputs of a draw, computed once from its untouched copy."""
        if draw.refs is None:
            draw.refs = tuple(kernel.reference(*draw.pristine))
        return draw.refs

    def verify(self) -> bool:
        """False (and the case forgotten) when any kept input differs from its untouched copy."""
        if any(d.modified() for d in self._draws.values()):
            self.clear()
            return False
        return True

    def clear(self) -> None:
        self._draws.clear()
        self._case = None


def check_config(kernel: KernelDef, axes: Mapping[str, int], config: Mapping[str, Any], *,
                 device: torch.device | None = None, seed: int | None = None,
                 distributions: Sequence[str] = DISTRIBUTIONS,
                 cache: InputCache | None = None) -> CheckResult:
    """Run once per distribution into NaN-poisoned outputs and compare with float64. The
    inputs are fresh, or with `cache` (and a seed) the cached draw of that seed, untouched so
    far; a config that modifies its inputs fails, and the cache forgets them."""
    device = device or default_device()
    cfg = kernel.validate_config(config)
    rtol = kernel.rtol_for(axes)
    errors: dict[str, float] = {}
    problems: list[str] = []
    for i, dist in enumerate(distributions):
        s = (seed + i) if seed is not None else int.from_bytes(os.urandom(4), "little")
        if cache is not None and seed is not None:
            draw = cache.get(kernel, axes, s, dist, device)
            inputs, before = draw.inputs, draw.pristine
            refs = cache.reference(kernel, draw)
        else:
            inputs = kernel.make_inputs(axes, seed=s, distribution=dist, device=device)
            before = tuple(t.clone() for t in inputs)
            refs = kernel.reference(*inputs)
        outs = tuple(torch.full(r.shape, math.nan, dtype=dt, device=device)
                     for r, dt in zip(refs, kernel.output_dtypes_for(axes)))
        kernel.launch(*inputs, config=cfg, out=outs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        worst = 0.0
        for name, o, r in zip(kernel.output_names, outs, refs):
            e = rel_error(o, r)
            if math.isnan(e):
                problems.append(f"{dist}: {name} has NaN/Inf (unwritten or overflow)")
                worst = math.nan
            elif e > rtol:
                problems.append(f"{dist}: {name} relative error {e:.3g} > {rtol:g}")
            if not math.isnan(worst):
                worst = max(worst, e) if not math.isnan(e) else math.nan
        modified = [name for name, a, b in zip(kernel.input_names, inputs, before)
                    if not torch.equal(a, b)]
        for name in modified:
            problems.append(f"{dist}: input {name} was modified")
        if modified and cache is not None:
            cache.clear()
        errors[dist] = worst
    return CheckResult(ok=not problems, errors=errors, detail="; ".join(problems))


def assert_correct(kernel: KernelDef, axes: Mapping[str, int], config: Mapping[str, Any],
                   **kw: Any) -> CheckResult:
    """check_config that raises WrongResult, for the tuner's trial pipeline."""
    res = check_config(kernel, axes, config, **kw)
    if not res.ok:
        raise WrongResult(res.detail)
    return res
