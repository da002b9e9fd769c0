"""Kernels with no declaration: a plain `@triton.autotune` kernel under `@kernelsearch.autotune`.

Such a kernel is known by what the decorator alone tells: its identity (module and qualified
name, plus Triton's JIT cache key over it and the jit functions it calls), its key (Triton's own:
the `key` arguments' values, then every tensor argument's dtype) and its configs. `Definition`
holds exactly that, as JSON, so the service can list, gate and serve the kernel without importing
the user's module; `kernel_def` turns it into the `KernelDef` the layers above speak.

Correctness of an undeclared kernel has no float64 reference: a config is right when every
tensor it writes matches what the first config writes on the same call, within a tolerance set
by the tensor's dtype (`written_mismatches`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Collection, Mapping, Sequence

import torch

from .spec import Axis, KernelDef, config_key, configs_rule, key_token, params_from_configs

KIND = "undeclared"
DTYPE_AXIS_SUFFIX = ".dtype"
# Integer key values an undeclared kernel's record may hold (JSON-safe, wider than any size).
KEY_MIN, KEY_MAX = -(2**53), 2**53
# Relative error (norm of difference over norm of the first config's output) a config may show
# against the first config, by the written tensor's dtype: reordered sums round differently, and
# split-K kernels adding partial sums atomically in a half-precision output round at every add
# (gemlite's 4-bit GEMV on the H200: 2.9e-3 in float16); a wrong config errs by far more.
DTYPE_RTOL: dict[torch.dtype, float] = {
    torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2,
}
LOW_PRECISION_RTOL = 0.1  # float8 and other narrow floats


NO_TENSOR = "none"  # a tensor argument passed as None (an optional input or output)
# A kernel's name is its module path and qualified name, of any script: as long as a Python
# program makes it, within this bound (the store's, db.checks.KERNEL_NAME_CHARS, is the same).
MAX_NAME_CHARS = 1000


def check_name_text(v: object, what: str) -> str:
    """A kernel's name, module or qualified name: 1..MAX_NAME_CHARS characters, none of them a
    control character; ValueError naming `what` otherwise."""
    if (not isinstance(v, str) or not v.strip() or len(v) > MAX_NAME_CHARS
            or any(ord(ch) < 32 for ch in v)):
        shown = v[:80] + "..." if isinstance(v, str) and len(v) > 80 else v
        raise ValueError(f"{what}: expected 1..{MAX_NAME_CHARS} printable characters "
                         f"(a Python module path and qualified name), got {shown!r}")
    return v


def dtype_names() -> tuple[str, ...]:
    """Every torch dtype by its short name, and `none`: the categories of a dtype axis."""
    names = {str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)}
    return tuple(sorted(names)) + (NO_TENSOR,)


def tensor_args(named: Mapping[str, Any], key: Sequence[str]) -> tuple[str, ...]:
    """The arguments a first call shows to be tensors: those with a dtype, and those passed as
    None (optional tensors: Triton's key then lacks their dtype, and so must the record's)."""
    return tuple(n for n, v in named.items() if n not in key and (hasattr(v, "dtype") or v is None))


def dtype_axis(arg: str) -> str:
    """The axis that keys a tensor argument's dtype (e.g. `x_ptr.dtype`)."""
    return f"{arg}{DTYPE_AXIS_SUFFIX}"


class Route(str, Enum):
    """How a kernel reached kernelsearch in the user's process: what a worker must redo to hold
    the same autotuner, when the module as shipped holds a plain `triton.autotune` one."""

    DECORATOR = "decorator"  # `@kernelsearch.autotune` written in the kernel's own module
    SWAP = "swap"  # `triton.autotune = kernelsearch.autotune` before a library was imported
    TRITON_CACHE = "triton_cache"  # a plain `@triton.autotune` met by Triton's cache manager


class NotDeclared(NotImplementedError):
    """What an undeclared kernel cannot do without a declaration (draw inputs, a reference)."""


@dataclass(frozen=True)
class Definition:
    """What identifies an undeclared kernel and keys its records, as the decorator sees it."""

    name: str
    module: str
    qualname: str
    arg_names: tuple[str, ...]
    key: tuple[str, ...]
    dtype_args: tuple[str, ...]
    configs: tuple[dict[str, Any], ...]
    source_hash: str
    description: str = ""
    kind: str = field(default=KIND)
    # Configs a worker may search besides `configs` (the decorator's `search_space=`).
    search_space: tuple[dict[str, Any], ...] = ()
    # Configs the user's pruner made on calls (`early_config_prune` may yield new ones): a record
    # may hold one, and a host serves it only where its own pruner made it too; never searched.
    pruned: tuple[dict[str, Any], ...] = ()
    reached_by: Route = Route.DECORATOR

    def __post_init__(self) -> None:
        for what in ("name", "module", "qualname"):
            check_name_text(getattr(self, what), what)
        if not self.configs:
            raise ValueError("configs: an undeclared kernel needs at least one config")
        for k in self.key:
            if k not in self.arg_names:
                raise ValueError(f"key: {k!r} is not an argument ({', '.join(self.arg_names)})")
        for a in self.dtype_args:
            if a not in self.arg_names:
                raise ValueError(f"dtype_args: {a!r} is not an argument ({', '.join(self.arg_names)})")

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "module": self.module,
                "qualname": self.qualname, "arg_names": list(self.arg_names),
                "key": list(self.key), "dtype_args": list(self.dtype_args),
                "configs": [dict(c) for c in self.configs], "source_hash": self.source_hash,
                "description": self.description,
                **({"search_space": [dict(c) for c in self.search_space]}
                   if self.search_space else {}),
                **({"pruned": [dict(c) for c in self.pruned]} if self.pruned else {}),
                # Only where a worker must redo it: a service that predates the field takes
                # a decorated kernel's definition as before.
                **({"reached_by": self.reached_by.value}
                   if self.reached_by is not Route.DECORATOR else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Definition":
        """Parse a definition document; a ValueError names the first bad field."""
        if not isinstance(doc, Mapping):
            raise ValueError("definition: expected an object")
        if doc.get("kind", KIND) != KIND:
            raise ValueError(f"kind: expected {KIND!r}, got {doc.get('kind')!r}")

        def strs(name: str) -> tuple[str, ...]:
            v = doc.get(name)
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise ValueError(f"{name}: expected a list of names")
            return tuple(v)

        configs = doc.get("configs")
        beyond = doc.get("search_space") or []
        made = doc.get("pruned") or []
        for name, given in (("configs", configs), ("search_space", beyond), ("pruned", made)):
            if not isinstance(given, list) or not all(isinstance(c, dict) and c for c in given):
                raise ValueError(f"{name}: expected a list of non-empty objects")
            for i, c in enumerate(given):
                for k, v in c.items():
                    if not isinstance(v, (bool, int, float, str)):
                        raise ValueError(f"{name}[{i}].{k}: expected a number, a flag or a "
                                         f"string, got {v!r}")
        if not configs:
            raise ValueError("configs: expected a non-empty list of non-empty objects")
        route = doc.get("reached_by", Route.DECORATOR.value)
        if route not in {r.value for r in Route}:
            raise ValueError(f"reached_by: expected one of {[r.value for r in Route]}, got {route!r}")
        texts = {n: doc.get(n) for n in ("name", "module", "qualname", "source_hash")}
        for n, v in texts.items():
            if n == "source_hash":
                if not isinstance(v, str) or not v or len(v) > 128:
                    raise ValueError(f"{n}: expected a non-empty string of at most 128 characters")
            else:
                check_name_text(v, n)
        return cls(name=str(texts["name"]), module=str(texts["module"]),
                   qualname=str(texts["qualname"]), arg_names=strs("arg_names"), key=strs("key"),
                   dtype_args=tuple(doc.get("dtype_args") or ()),
                   configs=tuple(dict(c) for c in configs), source_hash=str(texts["source_hash"]),
                   search_space=tuple(dict(c) for c in beyond),
                   pruned=tuple(dict(c) for c in made), reached_by=Route(route),
                   description=str(doc.get("description") or "")[:500])

    def with_pruned(self, ran: Sequence[Mapping[str, Any]]) -> "Definition":
        """This definition knowing the configs a call ran (its pruned list, canonical) that it
        lists nowhere yet; itself when it knows them all."""
        known = {config_key(c) for c in (*self.configs, *self.search_space, *self.pruned)}
        new: list[dict[str, Any]] = []
        for c in ran:
            if config_key(c) not in known:
                known.add(config_key(c))
                new.append(dict(c))
        return replace(self, pruned=self.pruned + tuple(new)) if new else self

    def axis_names(self) -> tuple[str, ...]:
        return self.key + tuple(dtype_axis(a) for a in self.dtype_args)

    def case_axes(self, named: Mapping[str, Any]) -> dict[str, Any] | None:
        """A call's record axes (its key values, then its tensors' dtypes): an integer key value
        as itself (a bool as 0 or 1, as it specializes the kernel alike), any other as its typed
        token (`key_token`: a float, a string, a dtype, None). None when a key value has no
        stable text, or a tensor argument is one the first call passed neither as a tensor nor as
        None (such a key is tuned here as Triton would, not shared)."""
        out: dict[str, Any] = {}
        for k in self.key:
            v = named.get(k)
            if isinstance(v, int) and KEY_MIN <= v <= KEY_MAX:
                out[k] = int(v)
                continue
            tok = key_token(v)
            if tok is None:
                return None
            out[k] = tok
        if any(hasattr(v, "dtype") for n, v in named.items() if n not in self.dtype_args):
            return None  # a tensor where the first call had none: Triton's key has other parts
        for a in self.dtype_args:
            v = named.get(a)
            dt = getattr(v, "dtype", None)
            if v is None:
                out[dtype_axis(a)] = NO_TENSOR
            elif isinstance(dt, torch.dtype):
                out[dtype_axis(a)] = str(dt).removeprefix("torch.")
            else:
                return None
        return out


def work_of(axes: Mapping[str, Any]) -> int:
    """A size for "nearest" among an undeclared kernel's cases: the product of its integer key
    values (it declares no bytes moved; cases of other dtypes never serve each other anyway)."""
    return math.prod(max(1, abs(int(v))) for v in axes.values()
                     if isinstance(v, int) and not isinstance(v, bool))


@dataclass(frozen=True, kw_only=True, eq=False)
class UndeclaredKernel(KernelDef):
    """The KernelDef of an undeclared kernel, with the definition it was built from."""

    definition: Definition

    @property
    def source_hash(self) -> str:  # type: ignore[override]
        """The code's identity as the decorator computed it (Triton's JIT cache key, hashed):
        what its records carry, and what a service compares them with."""
        return self.definition.source_hash

    def work(self, axes: Mapping[str, Any]) -> float:
        """The product of the integer key values: an undeclared kernel declares no bytes."""
        return float(work_of(axes))


def kernel_def(defn: Definition) -> UndeclaredKernel:
    """The KernelDef of an undeclared kernel: its axes, its configs as the whole space, and no
    inputs, reference or launcher of its own (those come with a call's capture)."""

    def not_declared(*_a: Any, **_k: Any) -> Any:
        raise NotDeclared(f"{defn.name} has no declaration: its inputs, reference and launch "
                          f"come from a call (tune it by calling it under @kernelsearch.autotune)")

    choices = dtype_names()
    every = [dict(c) for c in (*defn.configs, *defn.search_space)]
    valid = every + [dict(c) for c in defn.pruned]
    axes = tuple(Axis(k, KEY_MIN, KEY_MAX, doc="a key argument of the kernel", tokens=True)
                 for k in defn.key) \
        + tuple(Axis(dtype_axis(a), doc=f"dtype of {a}", choices=choices) for a in defn.dtype_args)
    return UndeclaredKernel(
        definition=defn, name=defn.name, axes=axes, params=params_from_configs(valid),
        input_names=defn.arg_names, output_names=(), rtol=DTYPE_RTOL[torch.float32],
        description=defn.description or f"{defn.module}.{defn.qualname} (undeclared)",
        make_inputs=not_declared, reference=not_declared, launch=not_declared,
        axes_of=not_declared, bytes_moved=not_declared, rules=configs_rule(valid),
        tolerance=lambda axes: max([dtype_rtol(getattr(torch, str(axes[dtype_axis(a)]), torch.float32))
                                    for a in defn.dtype_args
                                    if axes.get(dtype_axis(a), NO_TENSOR) != NO_TENSOR]
                                   or [DTYPE_RTOL[torch.float32]]),
        # Not the user's module: importing it registers nothing (the decorator defines a kernel at
        # its first call), and a trial child or worker need not be able to import it.
        space=every, module=__name__)


def dtype_rtol(dtype: torch.dtype) -> float:
    """The tolerance a written tensor of this dtype is compared at (0: integers and bools, exact)."""
    if not dtype.is_floating_point and not dtype.is_complex:
        return 0.0
    return DTYPE_RTOL.get(dtype, LOW_PRECISION_RTOL)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Norm of the difference over the norm of `want`, in float64; NaN where `want` has none
    and `got` has one is an infinite error."""
    g, w = got.detach().double(), want.detach().double()
    if g.shape != w.shape:
        return math.inf
    nan_g, nan_w = torch.isnan(g), torch.isnan(w)
    if not torch.equal(nan_g, nan_w):
        return math.inf
    g, w = torch.where(nan_g, 0.0, g), torch.where(nan_w, 0.0, w)
    diff = float(torch.linalg.vector_norm(g - w))
    base = float(torch.linalg.vector_norm(w))
    if diff == 0.0:
        return 0.0
    return diff / base if base > 0 else math.inf


def written_mismatches(before: Sequence[Any], first: Sequence[Any], other: Sequence[Any],
                       scratch: Collection[int] = frozenset()) -> tuple[float, list[str]]:
    """Compare what two configs wrote: every tensor that either run changed from `before` must
    match the first config's at its dtype's tolerance. Returns the largest relative error seen
    among floating outputs and a message per mismatching argument (by position).

    `scratch` are the positions of the kernel's reset_to_zero tensors: one whose written slots
    differ between the two configs (per-program partials: the config decides how many programs
    write) is compared by its total, what the op reads of it; elementwise otherwise."""
    worst = 0.0
    bad: list[str] = []
    for i, (b, f, o) in enumerate(zip(before, first, other)):
        if not isinstance(b, torch.Tensor):
            continue
        if torch.equal(b, f) and torch.equal(b, o):
            continue
        tol, what = dtype_rtol(f.dtype), str(f.dtype)
        if i in scratch and f.shape == o.shape and not torch.equal(f != 0, o != 0):
            f, o = f.detach().double().sum().reshape(1), o.detach().double().sum().reshape(1)
            what = f"total of a reset_to_zero buffer, {what}"
        if tol == 0.0:
            if not torch.equal(f, o):
                bad.append(f"argument {i}: differs from the first config's ({what}, exact)")
            continue
        err = relative_error(o, f)
        worst = max(worst, err)
        if not err <= tol:
            bad.append(f"argument {i}: relative error {err:.3g} > {tol:g} ({what})")
    return worst, bad
