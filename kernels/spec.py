"""The public kernel contract: the declaration a kernel's module (a user's, or a built-in) fills in.

The tuner, the CLI and the service only ever talk to a kernel through a `KernelDef`, so bringing a
kernel means writing one module and registering it (`kernelsearch.register`, an entry point in
the `kernelsearch.kernels` group, or `KS_KERNEL_MODULES`), never touching the layers above.
Configs are flat mappings in the shape of `triton.Config`: meta-parameters, plus the launch
options of `LAUNCH_OPTIONS`, which `split_config` keeps apart.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from .axes import Axes, AxisValue
from .configs import (LAUNCH_OPTIONS, config_key, from_triton_config, split_config,  # noqa: F401
                      to_triton_config)
from .errors import InvalidConfig
from .runtime import runtime_of


Tensors = tuple[torch.Tensor, ...]


def params_from_configs(configs: Sequence[Any], *, doc: str = "") -> tuple["Param", ...]:
    """Params accepting exactly the values a list of configs (triton.Config or mappings) uses;
    the first config's values are the defaults. Pair with `configs_rule` to accept only the
    listed combinations."""
    flat = [from_triton_config(c) if not isinstance(c, Mapping) else dict(c) for c in configs]
    if not flat:
        raise ValueError("configs: needs at least one config")
    names: list[str] = []
    for c in flat:
        names += [k for k in c if k not in names]
    out = []
    for n in names:
        vals: list[Any] = []
        for c in flat:
            v = c.get(n)
            if v is not None and not in_choices(v, tuple(vals)):
                vals.append(v)
        default = flat[0].get(n, vals[0])
        out.append(Param(n, tuple(vals), default, doc))
    return tuple(out)


def configs_rule(configs: Sequence[Any]) -> Callable[[Mapping[str, Any]], str | None]:
    """A `rules` hook accepting only the listed configs (a decorator's list is the whole space).
    A listed config lacking a parameter others set (a pruner's constexpr) is matched with that
    parameter at its default, as `KernelDef.validate_config` completes it."""
    flat = [from_triton_config(c) if not isinstance(c, Mapping) else dict(c) for c in configs]
    defaults = {p.name: p.default for p in params_from_configs(flat)} if flat else {}
    allowed = {config_key({**defaults, **c}) for c in flat}
    names = sorted({k for c in flat for k in c})

    def rule(cfg: Mapping[str, Any]) -> str | None:
        got = config_key({k: cfg.get(k, defaults[k]) for k in names})
        return None if got in allowed else "not one of the declared configs"

    return rule


# A key value Triton's autotuner keys on that is no integer, as typed text: exact (a float by its
# repr), JSON-able, and never read as a size. Integers (and bools, as 0/1) stay integers.
KEY_TOKEN_PREFIXES = ("float:", "str:", "tl:", "torch:", "int:")
KEY_TOKEN_NONE = "none"
KEY_TOKEN_CHARS = 200


def key_token(v: Any) -> str | None:
    """The token of a non-integer key value: a float, a string, a Triton or torch dtype, None, or
    an integer beyond an axis's range; None when the value has no stable text (a tensor, a tuple)."""
    if v is None:
        return KEY_TOKEN_NONE
    if isinstance(v, float):
        tok = f"float:{v!r}"
    elif isinstance(v, str):
        tok = f"str:{v}"
    elif isinstance(v, torch.dtype):
        tok = f"torch:{str(v).removeprefix('torch.')}"
    elif isinstance(v, int) and not isinstance(v, bool):
        tok = f"int:{v}"
    elif type(v).__module__.startswith("triton.language") and isinstance(getattr(v, "name", None), str):
        tok = f"tl:{v.name}"
    else:
        return None
    return tok if is_key_token(tok) else None


def is_key_token(s: str) -> bool:
    """Whether text is a key token (`key_token`): a known prefix, bounded, no control character."""
    return s == KEY_TOKEN_NONE or (
        s.startswith(KEY_TOKEN_PREFIXES) and len(s) <= KEY_TOKEN_CHARS
        and not any(ord(ch) < 32 for ch in s))


def work_distance(a: float, b: float) -> float:
    """The log ratio of two cases' bytes moved: a record at twice the size is as near as one at
    half. KernelDef.distance adds the categories; a caller without a KernelDef uses this alone."""
    return abs(math.log(max(1.0, float(a))) - math.log(max(1.0, float(b))))

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
    """One axis identifying a workload case: an integer size in [minimum, maximum] (e.g. seq_len),
    or, with `choices`, a category such as a dtype (a case's dtype is part of its identity, as
    `triton.autotune` keys on dtypes). A record is only ever served across equal categories."""

    name: str
    minimum: int = 1
    maximum: int = 2**31 - 1
    doc: str = ""
    choices: tuple[str, ...] = ()
    # Also takes a key token (`key_token`): an undeclared kernel's key value that is no integer,
    # a category of its own ("nearest" never crosses it).
    tokens: bool = False

    @property
    def categorical(self) -> bool:
        return bool(self.choices)

    def describe(self) -> dict[str, Any]:
        """What the axis takes: its categories, or integers in its bounds and, for a key that
        may be no integer (a float, a string), the key tokens too: its bounds alone would say
        an integer is asked for."""
        if self.categorical:
            return {"name": self.name, "choices": list(self.choices), "doc": self.doc}
        out: dict[str, Any] = {"name": self.name, "minimum": self.minimum,
                               "maximum": self.maximum, "doc": self.doc}
        if self.tokens:
            out["tokens"] = [*KEY_TOKEN_PREFIXES, KEY_TOKEN_NONE]
            out["accepts"] = (f"an integer in [{self.minimum}, {self.maximum}], or a key token "
                              f"for a value that is no integer: float:0.5, str:TEXT, "
                              f"torch:float16, tl:float16, none")
        return out

    def category_of(self, v: Any) -> str | None:
        """The category a value of this axis keys (None: a size, which "nearest" may cross)."""
        if self.categorical or (self.tokens and isinstance(v, str)):
            return str(v)
        return None

    def parse(self, v: Any, kernel: str = "", *, strict: bool = False) -> AxisValue:
        """Check one value of this axis: an int (no bool; text only without `strict`, and then
        ASCII digits alone, no `1_000`) in range, or one of the categories."""
        where = f"{kernel}: axis {self.name!r}" if kernel else f"axis {self.name!r}"
        if self.categorical:
            sv = v
            if isinstance(sv, torch.dtype):
                sv = str(sv).removeprefix("torch.")
            if not isinstance(sv, str) or sv not in self.choices:
                raise ValueError(f"{where} must be one of {list(self.choices)}, got {v!r}")
            return sv
        if self.tokens and isinstance(v, str) and is_key_token(v):
            return v
        if isinstance(v, bool) or not isinstance(v, (int, str)) or (strict and isinstance(v, str)):
            raise ValueError(f"{where} must be an integer, got {v!r}")
        if isinstance(v, str):
            t = v.strip()
            body = t[1:] if t[:1] in "+-" else t
            if not (body.isascii() and body.isdigit()):
                raise ValueError(f"{where} must be an integer, got {v!r}")
            v = int(t)
        if not self.minimum <= v <= self.maximum:
            raise ValueError(f"{where}={v} outside [{self.minimum}, {self.maximum}]")
        return int(v)


@dataclass(frozen=True)
class Case:
    """A suite case: its number in the benchmark, the axes that key it, and the rest of its row."""

    number: int
    axes: dict[str, AxisValue]
    info: dict[str, Any] = field(default_factory=dict)


def cases_from_rows(rows: Iterable[Mapping[str, Any]], axis_names: Sequence[str]) -> tuple[Case, ...]:
    """Cases from plain rows ({"case": n, axis: value, ...}; without "case" they are numbered
    from 1); keys other than the axes are kept as the case's info."""
    out = []
    for i, row in enumerate(rows, start=1):
        axes = {a: (row[a] if isinstance(row[a], str) else int(row[a])) for a in axis_names}
        info = {k: v for k, v in row.items() if k not in axes and k != "case"}
        out.append(Case(number=int(row.get("case", i)), axes=axes, info=info))
    return tuple(out)


def load_cases(filename: str | Path, axis_names: Sequence[str], *,
               package: str | None = None) -> tuple[Case, ...]:
    """Cases from a JSON file {"cases": [rows]}: a path, or a file in `package`'s `cases/` folder
    (the built-in kernels' copy of the benchmark's JSON, or a user package's)."""
    if package is None and not Path(filename).is_absolute():
        package = __package__
    if package is not None:
        text = resources.files(package).joinpath("cases", str(filename)).read_text()
    else:
        text = Path(filename).read_text()
    return cases_from_rows(json.loads(text)["cases"], axis_names)


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


@dataclass(frozen=True, kw_only=True, eq=False)
class KernelDef:
    """What a kernel's author declares: everything the layers above need to tune, check, time and
    call one kernel. Immutable, and compared by identity; what a process learns while running it
    (source hash, latest launch) is its `runtime.runtime_of(kernel)`, never kept here."""

    # -- identity and shapes: what the kernel is and what keys a case ---------------------------
    name: str
    description: str = ""
    benchmark_problem: str = ""
    axes: tuple[Axis, ...]
    # Extra axes a user may give that do not key the case (e.g. num_images for workload A).
    extra_axes: tuple[str, ...] = ()
    input_names: tuple[str, ...]
    output_names: tuple[str, ...] = ("out",)
    # The suite: cases tuned by `kernelsearch tune KERNEL --all` and shown on the dashboard.
    cases: tuple[Case, ...] = ()
    # The module whose import registers this kernel (child processes import it); default: the
    # launcher's module.
    module: str | None = None

    # -- the kernel and what it accepts: launch, configs, call-time checks ----------------------
    # launch(*inputs, config=<validated full config>, out=<tuple of output tensors>|None).
    launch: Callable[..., Tensors]
    params: tuple[Param, ...]
    # Cross-parameter rules: returns a message when the combination is not accepted.
    rules: Callable[[Mapping[str, Any]], str | None] = lambda cfg: None
    # The search space: a TOML file (path), a list of configs (triton.Config or mappings), or
    # None for the packaged spaces/<name>.toml.
    space: Any = None
    # The @triton.jit functions launched: the record's source identity is Triton's JIT cache key
    # over them and the jit functions they call. Empty: the launcher's module source.
    triton_kernels: tuple[Any, ...] = ()
    # The case axes of a call's inputs (the user's entry point, `__call__`).
    axes_of: Callable[..., dict[str, AxisValue]]
    # Raises a ValueError naming the first bad argument.
    check_inputs: Callable[..., None] = lambda *inputs: None

    # -- test hooks: the correctness gate ------------------------------------------------------
    # make_inputs(axes, *, seed, distribution, device) -> input tensors in the launcher's order.
    make_inputs: Callable[..., Tensors]
    # The maths in float64 (the correctness gate's truth).
    reference: Callable[..., Tensors]
    # Relative error (norm of difference over norm of the float64 reference) every output must
    # stay under; `tolerance` overrides it per case (e.g. fp16/bf16 outputs at their own rtol).
    rtol: float
    # Per-case rtol (e.g. by the case's dtype axis); None: `rtol` everywhere.
    tolerance: Callable[[Axes], float] | None = None
    # Dtypes of the outputs for a case (the gate poisons outputs of these dtypes); None: float32.
    output_dtypes: Callable[[Axes], Sequence[torch.dtype]] | None = None
    # The inputs a served config must be right on: the draws the correctness gate runs.
    domain: InputDomain = field(default_factory=InputDomain)

    # -- measurement hooks: rooflines and the eager baseline -----------------------------------
    # Bytes the kernel must move at least: the memory roofline.
    bytes_moved: Callable[[Axes], int]
    # Floating-point operations at least (compute roofline); None: memory-bound only.
    flops: Callable[[Axes], int] | None = None
    # The benchmark's eager PyTorch path (eager and torch.compile speedups); None: not compared.
    torch_reference: Callable[..., Tensors] | None = None

    def __post_init__(self) -> None:
        if self.module is None:
            # A default derived once, while the declaration is made.
            object.__setattr__(self, "module", getattr(self.launch, "__module__", None))

    @property
    def source_hash(self) -> str:
        """Which code a record was tuned on: Triton's JIT cache key over the launched kernels (it
        covers the jit functions they call, so an edit to a shared helper changes it), else the
        launcher's module source."""
        if self.triton_kernels:
            # Computed once per process: it parses the kernels' sources, and lookups ask for it.
            return runtime_of(self).once("source_hash", lambda: source_hash_of(self.triton_kernels))
        mod = sys.modules[self.launch.__module__]
        return hashlib.sha256(inspect.getsource(mod).encode()).hexdigest()[:16]

    def rtol_for(self, axes: Axes) -> float:
        return float(self.tolerance(axes)) if self.tolerance is not None else float(self.rtol)

    def output_names_for(self, axes: Axes) -> tuple[str, ...]:
        """The outputs a launch of this case writes (a captured kernel learns them at run time)."""
        return tuple(self.output_names)

    def output_dtypes_for(self, axes: Axes) -> tuple[torch.dtype, ...]:
        if self.output_dtypes is None:
            return (torch.float32,) * len(self.output_names_for(axes))
        return tuple(self.output_dtypes(axes))

    def launch_options(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config's launch options (num_warps, ...), apart from its meta-parameters."""
        return split_config(config)[1]

    def meta_parameters(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return split_config(config)[0]

    # -- the user's entry point -------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor, config: Mapping[str, Any] | None = None):
        """Run on the benchmark's inputs; without `config`, the store's best config or the default
        (`which_config` says which). Returns the outputs as torch functions do: one tensor for a
        kernel of one output, else a tuple (`launch` always gives a tuple)."""
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

    def resolve_config(self, axes: Axes, device: torch.device) -> dict[str, Any]:
        """The provider's config for this shape and device when it is valid here, else the default."""
        return self.which_config(axes, device)[0]

    def which_config(self, axes: Axes, device: torch.device | str) -> tuple[dict[str, Any], str]:
        """The config a call of this shape on this device runs without `config=`, and where it
        came from: "record" (the provider's: the store or the service, exact or nearest) or
        "default" (no record, or one this version of the kernel does not accept)."""
        from . import provider
        from .device import device_name

        got = provider.lookup(self, axes, device_name(torch.device(device)))
        if got:
            try:
                return self.validate_config(got), "record"
            except InvalidConfig:
                pass  # a record from another version of the kernel: fall back
        return self.default_config, "default"

    def empty_inputs(self, axes: Axes, device: torch.device | str) -> Tensors:
        """Uninitialised inputs with the case's shapes and dtypes: a compile needs no more
        (launchers derive their constexprs from shapes), and a warmup launch never reads them."""
        probe = self.make_inputs(axes, seed=0, distribution="benchmark", device="cpu")
        return tuple(torch.empty(t.shape, dtype=t.dtype, device=device) for t in probe)

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
        names = {p.name for p in self.params}
        for k in config:
            if k not in names:
                self.param(k)  # raises, naming the accepted parameters
        full = {p.name: config.get(p.name, p.default) for p in self.params}
        out: dict[str, Any] = {}
        for p in self.params:
            v = full[p.name]
            if not p.active(full):
                if p.name in config and config[p.name] != p.default:
                    conds = ", ".join(f"{k} in {list(v)}" for k, v in p.requires.items())
                    raise InvalidConfig(f"{self.name}: parameter {p.name!r} only applies when {conds}")
                continue
            if not in_choices(v, p.choices):
                raise InvalidConfig(f"{self.name}: parameter {p.name!r} does not accept {v!r}; "
                                    f"accepted: {list(p.choices)}")
            out[p.name] = _canonical(v, p.choices)
        msg = self.rules(out)
        if msg:
            raise InvalidConfig(f"{self.name}: {msg}")
        return out

    # -- shapes ----------------------------------------------------------------------------
    def validate_axes(self, axes: Mapping[str, Any], *, strict: bool = False) -> dict[str, AxisValue]:
        """Check a user's case axes; extra informational axes are dropped, unknown ones rejected.
        `strict` (typed input such as JSON) refuses text for an integer axis."""
        if not isinstance(axes, Mapping):
            raise ValueError(f"{self.name}: case axes must be a mapping")
        names = {a.name for a in self.axes}
        for k in axes:
            if k not in names and k not in self.extra_axes:
                raise ValueError(f"{self.name}: unknown axis {k!r}; axes: {sorted(names)}")
        out: dict[str, AxisValue] = {}
        for a in self.axes:
            if a.name not in axes:
                raise ValueError(f"{self.name}: missing axis {a.name!r}")
            out[a.name] = a.parse(axes[a.name], self.name, strict=strict)
        return out

    def distance(self, a: Axes, b: Axes) -> float:
        """How far one case's record is from serving another: the one definition of "nearest"
        (store lookups, the offline provider, warm start). Cases of other categories (a dtype)
        never serve each other (inf); otherwise the log ratio of the bytes they move, so a record
        at twice the size is as near as one at half."""
        if self.categories(a) != self.categories(b):
            return math.inf
        return work_distance(self.work(a), self.work(b))

    def work(self, axes: Axes) -> float:
        """A case's size for "nearest": the bytes it moves (a kernel that cannot know its bytes
        says another size)."""
        return float(self.bytes_moved(axes))

    def categories(self, axes: Mapping[str, Any]) -> dict[str, str]:
        """The categorical axes of a case: a record is served only to cases that share them."""
        out = {a.name: a.category_of(axes[a.name]) for a in self.axes if a.name in axes}
        return {k: v for k, v in out.items() if v is not None}

    def case(self, number: int) -> Case:
        for c in self.cases:
            if c.number == number:
                return c
        raise ValueError(f"{self.name}: no suite case {number}; cases are 1..{len(self.cases)}")

    def suite_case_of(self, axes: Axes) -> Case | None:
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
            "axes": [a.describe() for a in self.axes],
            "inputs": list(self.input_names),
            "outputs": list(self.output_names),
            "params": [{"name": p.name, "choices": list(p.choices), "default": p.default,
                        "doc": p.doc, "requires": {k: list(v) for k, v in p.requires.items()},
                        "launch_option": p.name in LAUNCH_OPTIONS}
                       for p in self.params],
            "default_config": self.default_config,
            "rtol": self.rtol,
            "n_cases": len(self.cases),
        }


def source_hash_of(triton_kernels: Sequence[Any]) -> str:
    """A record's source identity: Triton's JIT cache keys of the launched kernels, hashed."""
    keys = [_jit_cache_key(fn) for fn in triton_kernels]
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def _jit_cache_key(fn: Any) -> str:
    """Triton's JIT cache key of a kernel: its source, line, constexpr globals and, recursively,
    the keys of the jit functions it calls. Under the interpreter `triton.jit` gives wrappers
    without a key, so the same key is computed from JITFunctions rebuilt over the raw functions:
    a record tuned on a GPU and the CPU then agree on the code's identity."""
    from triton.runtime.jit import JITCallable

    if isinstance(fn, JITCallable):
        return fn.cache_key
    raw = getattr(fn, "fn", None)
    if not inspect.isfunction(raw):
        raise TypeError(f"triton_kernels: {fn!r} is not a @triton.jit function")
    return _rebuilt_jit(raw, {}).cache_key


def _rebuilt_jit(raw: Callable[..., Any], memo: dict[Any, Any]) -> Any:
    import types

    from triton.runtime.jit import JITFunction

    if raw in memo:
        return memo[raw]
    g = dict(raw.__globals__)
    clone = types.FunctionType(raw.__code__, g, raw.__name__, raw.__defaults__, raw.__closure__)
    clone.__qualname__, clone.__module__ = raw.__qualname__, raw.__module__
    clone.__annotations__ = dict(getattr(raw, "__annotations__", {}))
    jf = JITFunction(clone)
    memo[raw] = jf
    for name, val in list(g.items()):
        inner = getattr(val, "fn", None)
        if type(val).__name__ == "InterpretedFunction" and inspect.isfunction(inner):
            g[name] = _rebuilt_jit(inner, memo)
    return jf


def same_choice(a: Any, b: Any) -> bool:
    """Equal as parameter values: bool is an int in Python, so True never matches 1 (nor False 0)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


_PLAIN = (int, str, bool)
_MISSING = object()


# Per choices tuple, by identity (the tuple is held, so its id stays its own): an equality-keyed
# cache would give (1.0, 2) the table of (1, 2), and (True, False) that of (1, 0).
_INDEXES: dict[int, tuple[tuple[Any, ...], dict[tuple[type, Any], Any] | None]] = {}


def _plain_index(choices: tuple[Any, ...]) -> dict[tuple[type, Any], Any] | None:
    """The choices as a lookup by (exact type, value), first one kept; None unless every choice
    is a plain int, str or bool (where that lookup is exactly same_choice's scan)."""
    hit = _INDEXES.get(id(choices))
    if hit is not None and hit[0] is choices:
        return hit[1]
    out: dict[tuple[type, Any], Any] | None = None
    if all(type(c) in _PLAIN for c in choices):
        out = {}
        for c in choices:
            out.setdefault((type(c), c), c)
    if len(_INDEXES) > 4096:
        _INDEXES.clear()
    _INDEXES[id(choices)] = (choices, out)
    return out


def _match(v: Any, choices: Sequence[Any]) -> Any:
    """The first choice same_choice accepts for `v`, else _MISSING. Plain values of a tuple of
    plain choices are looked up (a search space's grid asks this ~10^6 times); others scanned."""
    if type(v) in _PLAIN and type(choices) is tuple:
        index = _plain_index(choices)
        if index is not None:
            return index.get((type(v), v), _MISSING)
    return next((c for c in choices if same_choice(v, c)), _MISSING)


def in_choices(v: Any, choices: Sequence[Any]) -> bool:
    """`v in choices`, with bools and ints kept apart (same_choice)."""
    return _match(v, choices) is not _MISSING


def _canonical(v: Any, choices: tuple[Any, ...]) -> Any:
    c = _match(v, choices)
    return v if c is _MISSING else c


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
