"""A kernel's search space as data: parameters, conditions, constraints (spaces/<kernel>.toml).

The space is a subset of what the kernel accepts, so the kernel's own `validate_config` stays the
last word: `violation()` asks the space's constraints first and the kernel second, and `grid()`
keeps only configs both accept. Samplers therefore never spend a compile on a config the kernel
would reject.
"""
from __future__ import annotations

import copy
import hashlib
import inspect
import json
import sys
import tomllib
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import optuna

from kernelsearch.kernels import get_kernel
from kernelsearch.kernels.errors import InvalidConfig
from kernelsearch.kernels.spec import KernelDef, config_key, from_triton_config, in_choices, same_choice

from .safe_expr import ExprError, SafeExpr

# Studies made before each parameter was its own categorical over its real values stored an
# ordinal parameter as its index into the choices, under this suffix; `config_of` still reads them.
IDX_SUFFIX = "__idx"


class SpaceError(ValueError):
    """A space file that does not fit its kernel (unknown name, value the kernel rejects, ...)."""


@dataclass(frozen=True)
class SpaceParam:
    """One searched parameter: its choices (a subset of the kernel's) and when it is active."""

    name: str
    choices: tuple[Any, ...]
    ordinal: bool = False
    requires: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # The Optuna parameter's name when not `name`: set by `SearchSpace.for_study` where the study
    # already holds `name` with other choices (Optuna refuses to change them within a study).
    alias: str | None = None

    def active(self, config: Mapping[str, Any]) -> bool:
        return all(k in config and in_choices(config[k], v) for k, v in self.requires.items())

    @property
    def optuna_name(self) -> str:
        """The Optuna parameter: the config field itself, so optuna-dashboard's importance and
        parallel coordinates show real names and values."""
        return self.alias or self.name

    def distribution(self) -> optuna.distributions.CategoricalDistribution:
        return optuna.distributions.CategoricalDistribution(list(self.choices))

    def to_optuna(self, value: Any) -> Any:
        """The choice equal to `value`, as the study stores it (a categorical's own value)."""
        return self.choices[self.index(value)]

    def index(self, value: Any) -> int:
        for i, c in enumerate(self.choices):
            if same_choice(c, value):
                return i
        raise InvalidConfig(f"parameter {self.name!r}: {value!r} is outside the search space "
                            f"{list(self.choices)}")


@dataclass(frozen=True)
class Constraint:
    """A rule over parameter values that must hold; `message` says why a config is rejected."""

    expr: SafeExpr
    message: str

    def check(self, env: Mapping[str, Any]) -> str | None:
        # A constraint over a parameter that is inactive in this config does not apply.
        if not self.expr.names <= set(env):
            return None
        return None if self.expr.evaluate(env) else f"{self.message} ({self.expr.text})"


def _memo_key(i: int, c: Constraint, env: Mapping[str, Any]) -> tuple | None:
    """Constraint `i`'s verdict depends only on which of its names `env` holds and their values;
    a key of those (with each value's exact type: True and 1 differ), or None where a value is
    not a plain int, bool or str (then the constraint is evaluated every time)."""
    key: list[Any] = [i]
    for name in sorted(c.expr.names):
        if name not in env:
            key.append((name,))
            continue
        v = env[name]
        if type(v) not in (int, bool, str):
            return None
        key.append((name, type(v), v))
    return tuple(key)


class SearchSpace:
    """The searched subset of a kernel's configs; built by `load_space` or `from_dict`."""

    def __init__(self, kernel: KernelDef, params: tuple[SpaceParam, ...],
                 constraints: tuple[Constraint, ...] = (), reduced: Mapping[str, list] | None = None,
                 description: str = "", seeds: Sequence[Mapping[str, Any]] = ()):
        self.kernel = kernel
        self.params = params
        self.constraints = constraints
        self.reduced_choices = dict(reduced or {})
        self.description = description
        self._validate()
        self.seeds = self._seeds(seeds)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], kernel: KernelDef | None = None) -> "SearchSpace":
        """Build from the parsed TOML document (keys: kernel, param[], constraint[], reduced)."""
        if kernel is None:
            if "kernel" not in doc:
                raise SpaceError("space: missing 'kernel'")
            try:
                kernel = get_kernel(doc["kernel"])
            except KeyError as exc:
                raise SpaceError(str(exc)) from None
        elif doc.get("kernel", kernel.name) != kernel.name:
            raise SpaceError(f"space: written for {doc['kernel']!r}, not {kernel.name!r}")
        params = []
        for i, p in enumerate(doc.get("param", [])):
            if "name" not in p:
                raise SpaceError(f"space {kernel.name}: param #{i} has no 'name'")
            params.append(SpaceParam(name=p["name"], choices=_choices(kernel.name, p),
                                     ordinal=bool(p.get("ordinal", False)),
                                     requires={k: tuple(v) for k, v in p.get("requires", {}).items()}))
        constraints = []
        for i, c in enumerate(doc.get("constraint", [])):
            if "expr" not in c or "message" not in c:
                raise SpaceError(f"space {kernel.name}: constraint #{i} needs 'expr' and 'message'")
            try:
                constraints.append(Constraint(SafeExpr(c["expr"]), str(c["message"])))
            except ExprError as exc:
                raise SpaceError(f"space {kernel.name}: constraint #{i}: {exc}") from None
        return cls(kernel, tuple(params), tuple(constraints), doc.get("reduced"),
                   str(doc.get("description", "")), doc.get("seed", ()))

    def _seeds(self, seeds: Sequence[Mapping[str, Any]]) -> tuple[tuple[dict[str, Any], str], ...]:
        """The file's [[seed]] configs (partial: the rest is the kernel's default) in the space's
        own form, each with its note. A seed the space cannot propose is an error at load."""
        out = []
        for i, raw in enumerate(seeds):
            vals = {k: v for k, v in raw.items() if k != "note"}
            try:
                cfg = self.config_of(self.to_params(self.kernel.validate_config(vals)))
            except InvalidConfig as exc:
                raise SpaceError(f"space {self.kernel.name}: seed #{i}: {exc}") from None
            why = self.violation(cfg)
            if why is not None:
                raise SpaceError(f"space {self.kernel.name}: seed #{i}: {why}")
            out.append((cfg, str(raw.get("note", f"seed #{i}"))))
        return tuple(out)

    def _validate(self) -> None:
        k = self.kernel
        seen: list[str] = []
        for p in self.params:
            try:
                kp = k.param(p.name)
            except InvalidConfig as exc:
                raise SpaceError(f"space {k.name}: {exc}") from None
            if p.name in seen:
                raise SpaceError(f"space {k.name}: parameter {p.name!r} listed twice")
            if not p.choices:
                raise SpaceError(f"space {k.name}: parameter {p.name!r} has no choices")
            for v in p.choices:
                if not in_choices(v, kp.choices):
                    raise SpaceError(f"space {k.name}: parameter {p.name!r} choice {v!r} is not "
                                     f"accepted by the kernel ({list(kp.choices)})")
            if p.ordinal and not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                     for v in p.choices):
                raise SpaceError(f"space {k.name}: ordinal parameter {p.name!r} needs numbers")
            for dep, vals in p.requires.items():
                if dep not in seen:
                    raise SpaceError(f"space {k.name}: {p.name!r} requires {dep!r}, which must be "
                                     "an earlier parameter of the space")
            # The space may switch a parameter off more often than the kernel, never less.
            for dep, vals in kp.requires.items():
                if dep not in p.requires or not set(p.requires[dep]) <= set(vals):
                    raise SpaceError(f"space {k.name}: {p.name!r} must require {dep} in "
                                     f"{list(vals)} as the kernel does")
            seen.append(p.name)
        known = {kp.name for kp in k.params}
        for c in self.constraints:
            unknown = c.expr.names - known
            if unknown:
                raise SpaceError(f"space {k.name}: constraint {c.expr.text!r} names unknown "
                                 f"parameter(s) {', '.join(sorted(unknown))}")
        for name, reduced in self.reduced_choices.items():
            p = self.param(name)
            for v in reduced:
                if not in_choices(v, p.choices):
                    raise SpaceError(f"space {k.name}: reduced {name!r} value {v!r} not in the space")

    # -- lookup ----------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> SpaceParam:
        for p in self.params:
            if p.name == name:
                return p
        raise SpaceError(f"space {self.kernel.name}: no parameter {name!r}; searched: "
                         f"{', '.join(self.names)}")

    @cached_property
    def fingerprint(self) -> str:
        """Short hash of the space's content: a changed space is a different experiment."""
        doc = self.describe()
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]

    def describe(self) -> dict[str, Any]:
        return {"kernel": self.kernel.name,
                "params": [{"name": p.name, "choices": list(p.choices), "ordinal": p.ordinal,
                            "requires": {k: list(v) for k, v in p.requires.items()}}
                           for p in self.params],
                "constraints": [{"expr": c.expr.text, "message": c.message} for c in self.constraints],
                "size": len(self.grid())}

    # -- configs ---------------------------------------------------------------------------
    @cached_property
    def _defaults(self) -> dict[str, Any]:
        return {kp.name: kp.default for kp in self.kernel.params}

    def _env(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Values the constraints see: the config, with the kernel's fixed defaults for the rest."""
        env = dict(config)
        defaults = self._defaults
        for kp in self.kernel.params:
            if kp.name not in env and kp.name not in self.names and kp.active({**defaults, **env}):
                env[kp.name] = kp.default
        return env

    def violation(self, config: Mapping[str, Any]) -> str | None:
        """Why this config is rejected before compiling (space, then kernel), or None."""
        for p in self.params:
            if p.name in config and p.active(config) and not in_choices(config[p.name], p.choices):
                return f"parameter {p.name!r}={config[p.name]!r} is outside the search space"
            if p.name in config and not p.active(config):
                conds = ", ".join(f"{k} in {list(v)}" for k, v in p.requires.items())
                return f"parameter {p.name!r} only applies when {conds}"
        return self._rejection(config)

    def _rejection(self, config: Mapping[str, Any],
                   memo: dict[tuple, str | None] | None = None) -> str | None:
        """`violation` past its parameter checks: the constraints', then the kernel's verdict.
        `memo` (grid()'s) keeps each constraint's verdict per value of the names it reads."""
        env = self._env(config)
        for i, c in enumerate(self.constraints):
            key = _memo_key(i, c, env) if memo is not None else None
            if key is not None and key in memo:  # type: ignore[operator]
                msg = memo[key]  # type: ignore[index]
            else:
                try:
                    msg = c.check(env)
                except (ExprError, ArithmeticError, TypeError) as exc:
                    msg = f"constraint {c.expr.text!r} cannot be evaluated: {exc}"
                if key is not None:
                    memo[key] = msg  # type: ignore[index]
            if msg:
                return msg
        try:
            self.kernel.validate_config(config)
        except InvalidConfig as exc:
            return str(exc)
        return None

    def canonical(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The kernel's full, canonical form of a config (defaults filled in)."""
        return self.kernel.validate_config(config)

    def key(self, config: Mapping[str, Any]) -> str:
        """A stable text key of a config, equal for configs the kernel treats as the same."""
        return config_key(self.canonical(config))

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Any]:
        """Define-by-run: each active parameter through the trial, a categorical over its real
        choices (fixed per parameter: Optuna refuses a study whose choices change)."""
        cfg: dict[str, Any] = {}
        for p in self.params:
            if not p.active(cfg):
                continue
            cfg[p.name] = trial.suggest_categorical(p.optuna_name, list(p.choices))
        return cfg

    def for_study(self, held: Mapping[str, Any]) -> "SearchSpace":
        """This space as a study holding Optuna distributions `held` (name -> distribution) can
        take it: a parameter whose name the study holds with other choices (the space changed
        since) becomes `NAME[<fingerprint>]`, so the study keeps one study per case."""
        renamed = tuple(
            replace(p, alias=f"{p.name}[{self.fingerprint}]")
            if p.name in held and held[p.name] != p.distribution() else p for p in self.params)
        if renamed == self.params:
            return self
        out = copy.copy(self)
        out.__dict__["params"] = renamed
        return out

    def to_params(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Optuna parameters that make `suggest` return this config (for enqueue_trial)."""
        full = self.canonical(config)
        out: dict[str, Any] = {}
        cfg: dict[str, Any] = {}
        for p in self.params:
            if not p.active(cfg):
                continue
            cfg[p.name] = full.get(p.name, self.kernel.param(p.name).default)
            out[p.optuna_name] = p.to_optuna(cfg[p.name])
        for kp in self.kernel.params:
            if kp.name not in cfg and kp.name in full and full[kp.name] != kp.default:
                raise InvalidConfig(f"parameter {kp.name!r}={full[kp.name]!r}: the space keeps it "
                                    f"at {kp.default!r} here")
        return out

    def config_of(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The config a trial's Optuna parameters stand for (inverse of `to_params`); also reads
        an older study's `NAME__idx` index of an ordinal parameter."""
        cfg: dict[str, Any] = {}
        for p in self.params:
            if not p.active(cfg):
                continue
            if p.optuna_name in params:
                cfg[p.name] = params[p.optuna_name]
            elif p.ordinal and p.name + IDX_SUFFIX in params:
                cfg[p.name] = p.choices[int(params[p.name + IDX_SUFFIX])]
        return cfg

    def _enumerate(self) -> Iterator[dict[str, Any]]:
        def rec(i: int, cfg: dict[str, Any]) -> Iterator[dict[str, Any]]:
            if i == len(self.params):
                yield dict(cfg)
                return
            p = self.params[i]
            if not p.active(cfg):
                yield from rec(i + 1, cfg)
                return
            for v in p.choices:
                cfg[p.name] = v
                yield from rec(i + 1, cfg)
            del cfg[p.name]
        yield from rec(0, {})

    def grid(self) -> list[dict[str, Any]]:
        """Every config of the space that the constraints and the kernel accept, in a fixed order."""
        if "_grid" not in self.__dict__:
            # An enumerated config passes violation()'s parameter checks by construction (each
            # active parameter takes one of its choices; a parameter requires only earlier ones),
            # so only the constraints and the kernel judge it: half the cost of a large grid.
            # A constraint reads a few names, so most configs repeat a verdict already taken.
            memo: dict[tuple, str | None] = {}
            if type(self).violation is SearchSpace.violation:
                keep = [c for c in self._enumerate() if self._rejection(c, memo) is None]
            else:
                keep = [c for c in self._enumerate() if self.violation(c) is None]
            self.__dict__["_grid"] = keep
        return [dict(c) for c in self.__dict__["_grid"]]

    def size(self) -> int:
        return len(self.grid())

    def restrict(self, choices: Mapping[str, list]) -> "SearchSpace":
        """A smaller space with the given parameters limited to the given values."""
        params = []
        for p in self.params:
            if p.name in choices:
                keep = tuple(v for v in p.choices if in_choices(v, tuple(choices[p.name])))
                if len(keep) != len(choices[p.name]):
                    raise SpaceError(f"restrict: {p.name!r} values {choices[p.name]} not all in "
                                     f"{list(p.choices)}")
                params.append(SpaceParam(p.name, keep, p.ordinal, p.requires))
            else:
                params.append(p)
        unknown = set(choices) - set(self.names)
        if unknown:
            raise SpaceError(f"restrict: unknown parameter(s) {', '.join(sorted(unknown))}")
        sub = SearchSpace(self.kernel, tuple(params), self.constraints, None, self.description)
        # Seeds the smaller space can still propose stay; the others fall away.
        sub.seeds = tuple((c, n) for c, n in self.seeds if sub._proposes(c))
        return sub

    def _proposes(self, config: Mapping[str, Any]) -> bool:
        try:
            return self.violation(self.config_of(self.to_params(config))) is None
        except (InvalidConfig, SpaceError, ValueError, KeyError):
            return False

    def reduced(self) -> "SearchSpace":
        """The space file's [reduced] subset, meant for the exhaustive-grid experiment."""
        if not self.reduced_choices:
            return self
        return self.restrict(self.reduced_choices)


def _choices(kernel: str, p: Mapping[str, Any]) -> tuple[Any, ...]:
    if "choices" in p and "range" in p:
        raise SpaceError(f"space {kernel}: {p['name']!r} has both 'choices' and 'range'")
    if "choices" in p:
        return tuple(p["choices"])
    if "range" in p:
        r = p["range"]
        try:
            low, high = int(r["low"]), int(r["high"])
        except (KeyError, TypeError, ValueError):
            raise SpaceError(f"space {kernel}: {p['name']!r} range needs integer 'low' and 'high'") from None
        if low > high or low < 0:
            raise SpaceError(f"space {kernel}: {p['name']!r} range low={low} high={high} is empty")
        if r.get("pow2"):
            vals = [v for v in (1 << e for e in range(0, 63)) if low <= v <= high]
        else:
            step = int(r.get("step", 1))
            if step < 1:
                raise SpaceError(f"space {kernel}: {p['name']!r} range step must be >= 1")
            vals = list(range(low, high + 1, step))
        return tuple(vals)
    raise SpaceError(f"space {kernel}: {p['name']!r} needs 'choices' or 'range'")


class ListedSpace(SearchSpace):
    """A space given as a list of configs (a `@kernelsearch.autotune` decorator's): its grid is
    that list, in its order, and the kernel's own rules reject every other combination."""

    def __init__(self, kernel: KernelDef, configs: Sequence[Mapping[str, Any]]):
        if not configs:
            raise SpaceError(f"space {kernel.name}: no configs listed")
        try:
            self.listed = [kernel.validate_config(c) for c in configs]
        except InvalidConfig as exc:
            raise SpaceError(f"space {kernel.name}: {exc}") from None
        super().__init__(kernel, tuple(SpaceParam(p.name, p.choices) for p in kernel.params),
                         description=f"{len(self.listed)} listed configs")

    def grid(self) -> list[dict[str, Any]]:
        return [dict(c) for c in self.listed]

    def violation(self, config: Mapping[str, Any]) -> str | None:
        why = super().violation(config)
        if why is None and self.kernel.validate_config(config) not in self.listed:
            return "not one of the listed configs"
        return why

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "configs": self.grid()}


def case_space(kernel: str, axes: Mapping[str, int],
               whole: Callable[[str], SearchSpace] | None = None) -> SearchSpace:
    """The space one case is tuned in: the kernel's (`whole`, default `get_space`), or for a
    kernel that lists its configs per case (a decorator's, after its pruning for the case's
    inputs) that list."""
    kdef = get_kernel(kernel)
    per_case = getattr(kdef, "configs_for_case", None)
    if per_case is None:
        return (whole or get_space)(kernel)
    return ListedSpace(kdef, per_case(axes))


def space_path(kernel: str) -> Path:
    return Path(__file__).resolve().parent / "spaces" / f"{kernel}.toml"


@lru_cache(maxsize=32)
def get_space(kernel: str) -> SearchSpace:
    """`load_space` once per process (the grid of a large space takes a second to enumerate)."""
    return load_space(kernel)


def from_configs(kdef: KernelDef, configs: Sequence[Any]) -> "ListedSpace":
    """The space of a kernel that declares a list of configs (triton.Config or mappings)."""
    return ListedSpace(kdef, [from_triton_config(c) if not isinstance(c, Mapping) else dict(c)
                              for c in configs])


def declared_space_file(kdef: KernelDef) -> Path:
    """The TOML file a kernel's `space=` names: a relative path is read next to the file of the
    module that declares the kernel, so the CLI, the API and a worker started in any directory
    read the same file."""
    p = Path(kdef.space).expanduser()
    if p.is_absolute():
        return p
    base = _module_dir(kdef)
    return (base / p) if base is not None else p.resolve()


def _module_dir(kdef: KernelDef) -> Path | None:
    mod = sys.modules.get(kdef.module or "")
    where = getattr(mod, "__file__", None)
    if where is None:
        try:
            where = inspect.getsourcefile(kdef.launch)
        except TypeError:
            where = None
    return Path(where).resolve().parent if where else None


def load_space(kernel: str, path: str | Path | None = None) -> SearchSpace:
    """The search space of a kernel: `path`, else the kernel's declared `space` (a TOML file or a
    list of configs), else the packaged spaces/<kernel>.toml."""
    try:
        kdef = get_kernel(kernel)
    except KeyError as exc:
        raise SpaceError(str(exc)) from None
    declared = kdef.space
    if path is None and declared is not None and not isinstance(declared, (str, Path)):
        return from_configs(kdef, list(declared))
    if path is None and declared is not None:
        p = declared_space_file(kdef)
        if not p.is_file():
            raise SpaceError(f"kernel {kernel!r} declares space={str(declared)!r}: no such file "
                             f"{p} (a relative path is read next to the module "
                             f"{kdef.module or '?'!s} that declares the kernel)")
    else:
        p = Path(path) if path is not None else space_path(kernel)
    if not p.is_file():
        raise SpaceError(f"no search space for kernel {kernel!r} (looked for {p})")
    with p.open("rb") as f:
        try:
            doc = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise SpaceError(f"{p}: {exc}") from None
    return SearchSpace.from_dict(doc, kdef)


__all__ = ["get_space", "case_space", "from_configs", "ListedSpace", "SearchSpace", "SpaceParam",
           "Constraint", "SpaceError", "load_space", "space_path", "IDX_SUFFIX"]
