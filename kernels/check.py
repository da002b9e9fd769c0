"""Correctness: a config is right only if it matches float64 on every draw of its kernel's domain.

The contract: relative error (norm of the difference over the norm of the float64 result) at
most `KernelDef.rtol` on each output, on every draw of `KernelDef.domain` (the benchmark's and
realistic inputs, the gradients scaled across the float32 range, the largest angles), into
outputs poisoned with NaN before the call, with the inputs left as they were.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from .device import default_device
from .errors import WrongResult
from .spec import Axes, Draw, KernelDef

_F32 = torch.finfo(torch.float32)
# Bytes of draws an InputCache keeps per case; past it further scaled draws are made per check.
CACHE_BYTES = 24 << 30


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


def in_normal_range(ref: torch.Tensor) -> bool:
    """Whether a float64 result is one a float32 kernel can hold: its largest magnitude is a
    normal float32 (a result of all zeros counts, it is exact)."""
    m = ref.abs().max().item() if ref.numel() else 0.0
    return m == 0.0 or _F32.tiny <= m <= _F32.max


class _Draw:
    """One draw of a case's inputs, an untouched copy of it and (once asked) its float64 outputs."""

    def __init__(self, inputs: Sequence[torch.Tensor],
                 pristine: Sequence[torch.Tensor | None] | None = None):
        self.inputs = tuple(inputs)
        given = tuple(pristine) if pristine is not None else (None,) * len(self.inputs)
        self.pristine = tuple(p if p is not None else t.clone() for t, p in zip(self.inputs, given))
        self.refs: tuple[torch.Tensor, ...] | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.inputs + self.pristine)

    def modified(self) -> list[int]:
        return [i for i, (a, b) in enumerate(zip(self.inputs, self.pristine)) if not torch.equal(a, b)]


class InputCache:
    """Input draws (and their float64 references) kept between the trials of one case.

    A trial process checks and times many configs of the same case: drawing the inputs on the
    CPU, copying them to the device and computing the float64 reference again for every config
    costs more than the kernel. Draws are keyed by (seed, draw name) within one case
    (kernel, axes, device); asking for another case forgets the previous one, so device memory
    stays at one case's worth over a run. Each draw keeps an untouched copy: `verify()` forgets
    the case when a launch modified any input, so a modified input is never reused.
    """

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self._case: tuple | None = None
        self._draws: dict[tuple[int, str], _Draw] = {}
        self.max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._draws)

    def get(self, kernel: KernelDef, axes: Axes, seed: int, distribution: str | Draw,
            device: torch.device) -> _Draw:
        """The draw of `seed` (a distribution's name, or a domain Draw: a scaled draw shares the
        unscaled inputs of its distribution's draw of the same seed)."""
        # The kernel object too: a captured call's kernel made again holds other inputs.
        case = (kernel.name, id(kernel), tuple(sorted(axes.items())), str(device))
        if case != self._case:
            self.clear()
            self._case = case
        spec = distribution if isinstance(distribution, Draw) else Draw(distribution, distribution)
        draw = self._draws.get((seed, spec.name))
        if draw is not None:
            return draw
        if spec.scaled:
            unknown = set(spec.scaled) - set(kernel.input_names)
            if unknown:
                raise ValueError(f"{kernel.name}: domain scales unknown inputs {sorted(unknown)}")
            base = self.get(kernel, axes, seed, spec.distribution, device)
            pick = [name in spec.scaled for name in kernel.input_names]
            inputs = [t * spec.scale if s else t for t, s in zip(base.inputs, pick)]
            draw = _Draw(inputs, [None if s else p for p, s in zip(base.pristine, pick)])
        else:
            draw = _Draw(kernel.make_inputs(axes, seed=seed, distribution=spec.distribution,
                                            device=device))
        # Scaled draws are a multiply away from their base: past the budget they are rebuilt.
        kept = sum(d.nbytes() for d in self._draws.values())
        if not spec.scaled or kept + draw.nbytes() <= self.max_bytes:
            self._draws[(seed, spec.name)] = draw
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


def check_config(kernel: KernelDef, axes: Axes, config: Mapping[str, Any], *,
                 device: torch.device | None = None, seed: int | None = None,
                 distributions: Sequence[str] | None = None,
                 draws: Sequence[Draw] | None = None,
                 cache: InputCache | None = None) -> CheckResult:
    """Run once per draw of the kernel's domain (or only the given `draws`, or the plain
    `distributions`) into NaN-poisoned outputs and compare with float64. The inputs are fresh,
    or with `cache` (and a seed) the cached draws of that seed, untouched so far; a config that
    modifies its inputs fails, and the cache forgets them. A draw's output whose float64 result
    is no normal float32 is not compared on that draw."""
    device = device or default_device()
    cfg = kernel.validate_config(config)
    rtol = kernel.rtol_for(axes)
    if draws is None:
        draws = ([Draw(d, d) for d in distributions] if distributions is not None
                 else kernel.domain.draws())
    base_seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    store = cache if (cache is not None and seed is not None) else InputCache()
    # Each distribution keeps its own seed; scaled draws reuse their distribution's inputs.
    seeds: dict[str, int] = {}
    for d in draws:
        seeds.setdefault(d.distribution, base_seed + len(seeds))
    errors: dict[str, float] = {}
    problems: list[str] = []
    for d in draws:
        draw = store.get(kernel, axes, seeds[d.distribution], d, device)
        inputs, before = draw.inputs, draw.pristine
        refs = store.reference(kernel, draw)
        outs = tuple(torch.full(r.shape, math.nan, dtype=dt, device=device)
                     for r, dt in zip(refs, kernel.output_dtypes_for(axes)))
        kernel.launch(*inputs, config=cfg, out=outs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        worst = 0.0
        compared = 0
        for name, o, r in zip(kernel.output_names_for(axes), outs, refs):
            if d.scaled and not in_normal_range(r):
                continue
            compared += 1
            e = rel_error(o, r)
            if math.isnan(e):
                problems.append(f"{d.name}: {name} has NaN/Inf (unwritten or overflow)")
            elif e > rtol:
                problems.append(f"{d.name}: {name} relative error {e:.3g} > {rtol:g}")
            worst = math.nan if (math.isnan(e) or math.isnan(worst)) else max(worst, e)
        modified = [name for name, a, b in zip(kernel.input_names, inputs, before)
                    if not torch.equal(a, b)]
        for name in modified:
            problems.append(f"{d.name}: input {name} was modified")
        if modified:
            store.clear()
        if compared:
            errors[d.name] = worst
    return CheckResult(ok=not problems, errors=errors, detail="; ".join(problems))


def assert_correct(kernel: KernelDef, axes: Axes, config: Mapping[str, Any],
                   **kw: Any) -> CheckResult:
    """check_config that raises WrongResult, for the tuner's trial pipeline."""
    res = check_config(kernel, axes, config, **kw)
    if not res.ok:
        raise WrongResult(res.detail)
    return res
