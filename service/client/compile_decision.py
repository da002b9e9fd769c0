"""The torch.compile decision: Dynamo never calls a decorated kernel's `run()`, it calls its
`early_config_prune` while tracing, so that is where a compiled call resolves its key and leaves
Inductor the served config alone."""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from triton.runtime.autotuner import Config

from kernelsearch.kernels.configs import canonical, canonical_key

from . import guard
from .backends import BACKENDS
from .identity import load_declarations, serves_list
from .options import Options

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _TensorMeta:
    """A tensor argument as a traced call knows it (its dtype and device), for the key."""

    dtype: Any
    device: Any


# Decorated kernels by id, and what a trace decided for each (`_decide_for_compile`). Weak: a
# kernel dropped by its program is collected, not kept for the life of the process.
TUNERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_DECIDED: dict[int, int] = {}


def _decide_for_compile(ctx: Any) -> None:
    """Run by Dynamo at trace time (`comptime`) inside `prune_for_compile`'s traced code: where
    the call's key is made of constants (Dynamo has not made an integer dynamic), look it up
    (`Autotuner.served_for_compile`) and leave the answer for `_decided`; -1 otherwise."""
    names = ("tid", "ints", "tensors", "nones")
    got = [ctx.get_local(n) for n in names]
    tid = got[0].as_python_constant()
    answer = -1
    if all(v.is_python_constant() for v in got):
        ints, tensors, nones = (v.as_python_constant() for v in got[1:])
        try:
            answer = TUNERS[tid].served_for_compile(ints, tensors, nones)
        except Exception as exc:  # compiling never fails for a lookup: Inductor tunes every config
            guard.failed(TUNERS[tid]._name() if tid in TUNERS else "a kernel",
                         "the torch.compile decision", exc)
    _DECIDED[tid] = answer


def _decided(tid: int) -> int:
    """The trace's decision (`_decide_for_compile`), a constant of the graph."""
    return _DECIDED.pop(tid, -1)


# What torch._dynamo.assume_constant_result sets (without importing Dynamo in every program).
_decided._dynamo_marked_constant = True  # type: ignore[attr-defined]


def prune_for_compile(tuner_id: int, keys: tuple[str, ...],
                       user_prune: Callable[..., Any] | None) -> Callable[..., list[Config]]:
    """A decorated kernel's early_config_prune: the user's own, and under torch.compile (Dynamo
    calls it while tracing, in place of run()) the served config alone, so Inductor compiles it
    and benchmarks nothing. Dynamo traces this function: it reads only its closure's constants
    (never the autotuner) and decides at trace time (`comptime`) from the key's constants."""
    import torch

    is_compiling, tensor = torch.compiler.is_compiling, torch.Tensor

    def prune(configs: list[Config], named_args: dict[str, Any], **kwargs: Any) -> list[Config]:
        if is_compiling():
            named = {**named_args, **kwargs}
            tid = tuner_id  # noqa: F841 - read at trace time by _decide_for_compile
            ints = tuple((k, named[k]) for k in keys  # noqa: F841
                         if k in named and isinstance(named[k], (int, bool)))
            tensors = tuple((k, str(v.dtype), str(v.device))  # noqa: F841
                            for k, v in named.items() if isinstance(v, tensor))
            nones = tuple(k for k, v in named.items() if v is None)  # noqa: F841
            torch._dynamo.comptime.comptime(_decide_for_compile)
            i = _decided(tuner_id)
            if i >= 0:
                return [configs[i]]
        if user_prune is not None:
            return user_prune(configs, named_args, **kwargs)
        return configs

    return prune



def served_for_compile(tuner: Any, ints: tuple, tensors: tuple, nones: tuple) -> int:
    """The index in `configs` of this key's served config (exact, of this code and this
    config list), else -1: torch.compile then tunes every config, as triton.autotune would."""
    import torch

    named: dict[str, Any] = {k: v for k, v in ints}
    named.update({k: None for k in nones})
    for k, dtype, device in tensors:
        named[k] = _TensorMeta(getattr(torch, dtype.removeprefix("torch.")), torch.device(device))
    opts = Options.from_env()
    if tuner.kernel_def is None:
        load_declarations()
    case = tuner.case_key(named)
    if case is None:
        return -1
    found = BACKENDS.lookup_bounded(case, opts.timeout_s)
    res = tuner._resolution_of(found, opts)
    if res is None or res.provisional or found is None:
        return -1
    und = tuner.undeclared
    if tuner.kernel_def is None and und is not None and not serves_list(found, und, tuner.configs):
        return -1
    key = tuple(v for _, v in ints) + tuple(d for _, d, _ in tensors)
    with tuner._lock:
        tuner.sources[key] = res.source
    log.info("%s: torch.compile runs the %s config %s for key %s", tuner._name(),
             res.source.value, canonical(res.config), key)
    return next(i for i, c in enumerate(tuner.configs)
                if canonical_key(c) == canonical_key(res.config))

