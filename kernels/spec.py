"""The declaration every kernel module fills in: its axes, cases, accepted parameters and hooks.

The tuner, the CLI and the service only ever talk to a kernel through a `KernelDef`, so adding a
kernel means writing one module, never touching the layers above.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Mapping, Sequence

import torch

from ._trig import OFF_CASE
from .errors import InvalidConfig

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Param:
    """One tunable parameter: the finite set of values the kernel accepts."""

    name: str
    choices: tuple[Any, ...]
    default: Any
    doc: str = ""
    # Only meaningful when every named parameter has one of the listed values.
    requires: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def active(self, config: Mapping[str, Any]) -> bool:
        return all(config.get(k) in v for k, v in self.requires.items())


@dataclass(frozen=True)
class Axis:
    """One shape axis identifying a workload case (e.g. seq_len)."""

    name: str
    minimum: int
    maximum: int
    doc: str = ""


@dataclass(frozen=True)
class Case:
    """A suite case: its number in the benchmark, the axes that key it, and the rest of its row."""

    number: int
    axes: dict[str, int]
    info: dict[str, Any] = field(default_factory=dict)


def load_cases(filename: str, axis_names: Sequence[str]) -> tuple[Case, ...]:
    """Read the suite's cases from the package's own copy of the benchmark's JSON."""
    text = resources.files(__package__).joinpath("cases", filename).read_text()
    doc = json.loads(text)
    out = []
    for row in doc["cases"]:
        axes = {a: int(row[a]) for a in axis_names}
        info = {k: v for k, v in row.items() if k not in axes and k != "case"}
        out.append(Case(number=int(row["case"]), axes=axes, info=info))
    return tuple(out)


# Factors on the gradients that the gate's magnitude draws apply (1e-30 .. 1e30, every ten decades).
MAGNITUDES = (1e-30, 1e-20, 1e-10, 1e10, 1e20, 1e30)


@dataclass(frozen=True)
class Draw:
    """One input draw of a kernel's domain: a `make_inputs` distribution, optionally with some
    inputs multiplied by `scale` (the draw then reuses that distribution's inputs for the rest)."""

    name: str
    distribution: str
    scale: float = 1.0
    scaled: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputDomain:
    """Every kind of input a caller may pass, as the draws the correctness gate checks.

    A config is served for every input of its shape, so it is certified on each draw: the
    plain `distributions`, each group of `scale_groups` multiplied by each of `scales` (on the
    first distribution's inputs; an output whose float64 result leaves the normal float32 range
    is not compared there), and the `edge` distributions (e.g. the largest angles a RoPE table
    holds). `notes` says in words what the draws stand for.
    """

    distributions: tuple[str, ...] = ("benchmark", "realistic")
    scale_groups: tuple[tuple[str, ...], ...] = ()
    scales: tuple[float, ...] = MAGNITUDES
    edge: tuple[str, ...] = ()
    notes: str = ""

    def draws(self) -> tuple[Draw, ...]:
        out = [Draw(d, d) for d in self.distributions]
        base = self.distributions[0] if self.distributions else "benchmark"
        for group in self.scale_groups:
            for f in self.scales:
                out.append(Draw(f"{base}*{f:g}[{','.join(group)}]", base, float(f), tuple(group)))
        out.extend(Draw(d, d) for d in self.edge)
        return tuple(out)


@dataclass
class KernelDef:
    """Everything the layers above need to tune, check, time and call one kernel."""

    name: str
    description: str
    benchmark_problem: str
    axes: tuple[Axis, ...]
    params: tuple[Param, ...]
    cases: tuple[Case, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    # Relative error (norm of difference over norm of reference) a float32 result must stay under.
    rtol: float
    make_inputs: Callable[..., Tensors]
    reference: Callable[..., Tensors]
    torch_reference: Callable[..., Tensors]
    launch: Callable[..., Tensors]
    axes_of: Callable[..., dict[str, int]]
    bytes_moved: Callable[[Mapping[str, int]], int]
    # Raises a ValueError naming the first bad argument.
    check_inputs: Callable[..., None]
    # Cross-parameter rules: returns a message when the combination is not accepted.
    rules: Callable[[Mapping[str, Any]], str | None] = lambda cfg: None
    # Extra axes a user may give that do not key the case (e.g. num_images for workload A).
    extra_axes: tuple[str, ...] = ()
    # Choices whose correctness was checked only on the case a record was tuned for (a fast
    # sin/cos accurate over that case's angles), with what replaces them on any other shape.
    off_case: Mapping[str, Mapping[Any, Any]] = field(default_factory=lambda: dict(OFF_CASE))
    # The Triton handle of the latest launch in this process (registers, spills, shared memory).
    last_compiled: Any = field(default=None, repr=False)
    # The inputs a served config must be right on: the draws the correctness gate runs.
    domain: InputDomain = field(default_factory=InputDomain)

    @property
    def source_hash(self) -> str:
        """Hash of the module that holds the kernel: records say which code they were tuned on."""
        import hashlib
        import inspect
        import sys

        mod = sys.modules[self.launch.__module__]
        return hashlib.sha256(inspect.getsource(mod).encode()).hexdigest()[:16]

    def compiled_stats(self) -> dict[str, Any]:
        """Registers, spills and shared memory of the latest launch (empty under the interpreter)."""
        h = self.last_compiled
        if h is None or not hasattr(h, "n_regs"):
            return {}
        md = getattr(h, "metadata", None)
        return {"n_regs": int(h.n_regs), "n_spills": int(h.n_spills),
                "shared_bytes": int(getattr(md, "shared", 0) or 0)}

    # -- the user's entry point -------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor, config: Mapping[str, Any] | None = None):
        """Run on the benchmark's inputs; without `config`, the store's best config or the default."""
        if len(inputs) != len(self.input_names):
            raise TypeError(f"{self.name}() takes {len(self.input_names)} tensors "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        self.check_inputs(*inputs)
        if config is None:
            full = self.resolve_config(self.axes_of(*inputs), inputs[0].device)
        else:
            full = self.validate_config(config)
        outs = self.launch(*inputs, config=full)
        return outs[0] if len(outs) == 1 else outs

    def resolve_config(self, axes: Mapping[str, int], device: torch.device) -> dict[str, Any]:
        """The provider's config for this shape and device when it is valid here, else the default."""
        from . import provider
        from .device import device_name

        got = provider.lookup(self.name, axes, device_name(device))
        if got:
            try:
                return self.validate_config(got)
            except InvalidConfig:
                pass  # a record from another version of the kernel: fall back
        return self.default_config

    def empty_inputs(self, axes: Mapping[str, int], device: torch.device | str) -> Tensors:
        """Uninitialised inputs with the case's shapes and dtypes: a compile needs no more
        (launchers derive their constexprs from shapes), and a warmup launch never reads them."""
        probe = self.make_inputs(axes, seed=0, distribution="benchmark", device="cpu")
        return tuple(torch.empty(t.shape, dtype=t.dtype, device=device) for t in probe)

    def for_other_shape(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """A record's config made safe for a shape it was not checked on (`off_case`)."""
        out = dict(config)
        for name, swap in self.off_case.items():
            if name in out and out[name] in swap:
                out[name] = swap[out[name]]
        return out

    # -- configs ---------------------------------------------------------------------------
    @property
    def default_config(self) -> dict[str, Any]:
        cfg = {p.name: p.default for p in self.params}
        return {k: v for k, v in cfg.items() if self.param(k).active(cfg)}

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise InvalidConfig(f"{self.name}: unknown parameter {name!r}; accepted: "
                            f"{', '.join(p.name for p in self.params)}")

    def validate_config(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """Complete a config with defaults and reject unknown names or values, naming them."""
        if config is None:
            return self.default_config
        if not isinstance(config, Mapping):
            raise InvalidConfig(f"{self.name}: config must be a mapping, got {type(config).__name__}")
        for k in config:
            self.param(k)  # raises on an unknown name
        full = {p.name: config.get(p.name, p.default) for p in self.params}
        for p in self.params:
            v = full[p.name]
            if not p.active(full):
                if p.name in config and config[p.name] != p.default:
                    conds = ", ".join(f"{k} in {list(v)}" for k, v in p.requires.items())
                    raise InvalidConfig(f"{self.name}: parameter {p.name!r} only applies when {conds}")
                continue
            if not _member(v, p.choices):
                raise InvalidConfig(f"{self.name}: parameter {p.name!r} does not accept {v!r}; "
                                    f"accepted: {list(p.choices)}")
        out = {k: _canonical(v, self.param(k).choices) for k, v in full.items()
               if self.param(k).active(full)}
        msg = self.rules(out)
        if msg:
            raise InvalidConfig(f"{self.name}: {msg}")
        return out

    # -- shapes ----------------------------------------------------------------------------
    def validate_axes(self, axes: Mapping[str, Any]) -> dict[str, int]:
        """Check a user's case axes; extra informational axes are dropped, unknown ones rejected."""
        if not isinstance(axes, Mapping):
            raise ValueError(f"{self.name}: case axes must be a mapping")
        names = {a.name for a in self.axes}
        for k in axes:
            if k not in names and k not in self.extra_axes:
                raise ValueError(f"{self.name}: unknown axis {k!r}; axes: {sorted(names)}")
        out: dict[str, int] = {}
        for a in self.axes:
            if a.name not in axes:
                raise ValueError(f"{self.name}: missing axis {a.name!r}")
            v = axes[a.name]
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise ValueError(f"{self.name}: axis {a.name!r} must be an integer, got {v!r}")
            try:
                iv = int(v)
            except ValueError:
                raise ValueError(f"{self.name}: axis {a.name!r} must be an integer, got {v!r}") from None
            if not a.minimum <= iv <= a.maximum:
                raise ValueError(f"{self.name}: axis {a.name!r}={iv} outside [{a.minimum}, {a.maximum}]")
            out[a.name] = iv
        return out

    def case(self, number: int) -> Case:
        for c in self.cases:
            if c.number == number:
                return c
        raise ValueError(f"{self.name}: no suite case {number}; cases are 1..{len(self.cases)}")

    def suite_case_of(self, axes: Mapping[str, int]) -> Case | None:
        for c in self.cases:
            if c.axes == dict(axes):
                return c
        return None

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary, used by the REST API and the CLI."""
        return {
            "name": self.name,
            "description": self.description,
            "benchmark_problem": self.benchmark_problem,
            "axes": [{"name": a.name, "minimum": a.minimum, "maximum": a.maximum, "doc": a.doc}
                     for a in self.axes],
            "inputs": list(self.input_names),
            "outputs": list(self.output_names),
            "params": [{"name": p.name, "choices": list(p.choices), "default": p.default,
                        "doc": p.doc, "requires": {k: list(v) for k, v in p.requires.items()}}
                       for p in self.params],
            "default_config": self.default_config,
            "rtol": self.rtol,
            "n_cases": len(self.cases),
        }


def _member(v: Any, choices: tuple[Any, ...]) -> bool:
    # bool is an int in Python: keep True from matching 1 unless the choices are bools.
    for c in choices:
        if isinstance(c, bool) != isinstance(v, bool):
            continue
        if v == c:
            return True
    return False


def _canonical(v: Any, choices: tuple[Any, ...]) -> Any:
    for c in choices:
        if isinstance(c, bool) == isinstance(v, bool) and v == c:
            return c
    return v


def check_tensor(name: str, t: Any, *, shape: Sequence[int | None], dtype: torch.dtype,
                 device: torch.device | None = None) -> None:
    """Reject a bad input with a ValueError that names the argument."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
