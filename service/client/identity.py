"""An undeclared kernel's identity (its definition from a call: module, name, Triton's JIT cache
key), its record key, and whether a served record stands for this decorator's config list."""
from __future__ import annotations

import builtins
import logging
import math
import os
import time
from typing import Any, Mapping, Sequence

from triton.runtime.autotuner import Autotuner as TritonAutotuner
from triton.runtime.autotuner import Config

from kernelsearch.kernels.capture import jit_function_of
from kernelsearch.kernels.configs import canonical, canonical_key, covers
from kernelsearch.kernels.resolve import Found, Key
from kernelsearch.kernels.spec import source_hash_of
from kernelsearch.kernels.undeclared import (Definition, Route, UndeclaredKernel, kernel_def,
                                             tensor_args)

from . import guard
from .timing import quantiles

from .resolution import Resolution
from .options import Source
from .search_policy import searched_allowed, serve_searched

log = logging.getLogger(__name__)


def serves_list(found: Found, und: UndeclaredKernel, configs: Sequence[Config]) -> bool:
    """Whether a record may stand for this undeclared kernel's list with nothing measured here:
    tuned on this code, with a timing for every listed config."""
    if found.source_hash not in (None, und.definition.source_hash):
        return False
    return covers(found.timings, found.config, configs)


class SourceIdentityError(Exception):
    """A kernel whose source cannot be read has no identity to share a record under."""


def undeclared_kernel(tuner: TritonAutotuner, named: Mapping[str, Any],
                      name: str | None = None) -> UndeclaredKernel:
    """The definition of any Triton autotuned kernel, from a call's named arguments: identity
    (module, qualified name, Triton's JIT cache key), key and dtype arguments; registered, so that
    the store and the service can gate its records (a declared kernel of that name stays)."""
    base = tuner.base_fn
    try:
        source_hash = source_hash_of([jit_function_of(tuner)])
    except Exception as exc:
        raise SourceIdentityError(str(exc)) from exc
    module, qualname = base.__module__, base.__qualname__
    if module == "__main__":  # a script: named by its file, as `python -m` would import it
        module = os.path.splitext(os.path.basename(base.__code__.co_filename))[0]
    defn = Definition(
        name=name or f"{module}.{qualname}", module=module, qualname=qualname,
        arg_names=tuple(tuner.arg_names), key=tuple(k for k in tuner.keys if k in named),
        dtype_args=tensor_args(named, tuple(tuner.keys)),
        configs=tuple(canonical(c) for c in tuner.configs), source_hash=source_hash,
        search_space=tuple(canonical(c) for c in getattr(tuner, "search_space", ())),
        # A plain `triton.autotune` kernel (no `reached_by` of ours) is met by the cache manager.
        reached_by=getattr(tuner, "reached_by", Route.TRITON_CACHE),
        description=(base.__doc__ or "").strip().split("\n")[0][:200])
    und = kernel_def(defn)
    from kernelsearch.kernels import registry

    try:
        current = registry.get_kernel(und.name)
    except KeyError:
        current = None
    if current is None or isinstance(current, UndeclaredKernel):
        registry.register(und, replace=True)
    return und


def undeclared_key(und: UndeclaredKernel, named: Mapping[str, Any]) -> Key | None:
    """A call's key: Triton's tuning key as axes, on the device of its tensors."""
    axes = und.definition.case_axes(named)
    if axes is None:
        return None
    from kernelsearch.kernels.device import device_name

    device = next((t.device for t in named.values() if hasattr(t, "device")), None)
    return Key.of(und.name, axes, device_name(device))


def knowing_ran(tuner: TritonAutotuner, und: UndeclaredKernel,
                 timings: Mapping[Config, Any]) -> UndeclaredKernel:
    """The kernel's definition knowing every config this call ran (a pruner may make configs the
    list lacks), registered here and kept by the decorator, so its record passes the gate."""
    defn = und.definition.with_pruned([canonical(c) for c in timings])
    if defn is und.definition:
        return und
    from kernelsearch.kernels import registry

    grown = kernel_def(defn)
    current = registry.get_kernel(und.name) if und.name in registry.all_kernels() else None
    if current is None or isinstance(current, UndeclaredKernel):
        registry.register(grown, replace=True)
    if getattr(tuner, "undeclared", None) is und:
        tuner.undeclared = grown  # type: ignore[attr-defined]
    return grown


def searched_as_run(tuner: Any, kwargs: dict) -> list[Config]:
    """The decorator's `search_space` as its own pruner makes it on this call, where
    KS_AUTOTUNE_SERVE_SEARCHED allows a searched winner: a worker's search keys its winner as
    the pruner ran it (a pruner may rewrite configs, gemlite's adds constexprs)."""
    if not tuner.search_space or not searched_allowed():
        return []
    if tuner.early_config_prune is None and tuner.perf_model is None:
        return list(tuner.search_space)
    from kernelsearch.search_space.through_pruner import through_pruner

    return [m for c in tuner.search_space
            for m in through_pruner(tuner, c, getattr(tuner, "nargs", None) or {}, kwargs)]


def check_served(tuner: Any, key: tuple, case: Key, res: Resolution, args: tuple,
                  kwargs: dict) -> Resolution | None:
    """An undeclared kernel's served record, held to this decorator: tuned on this code, and
    over this config list. Configs the record never measured are measured here (only those),
    and the faster of them and the record's wins; None when nothing of it can be used."""
    found, und = res.found, tuner.undeclared
    if found is None or und is None or res.provisional:
        return res
    if found.source_hash is not None and found.source_hash != und.definition.source_hash:
        tuner._tell("source", logging.INFO, "%s: the served record was tuned on other code "
                   "(source %s, this %s); tuning here", und.name, found.source_hash,
                   und.definition.source_hash)
        return None
    pruned = tuner.prune_configs(kwargs)
    by_key = {canonical_key(c): c for c in pruned}
    stored = {k: (math.inf if v is None else float(v))
              for k, v in (found.timings or {}).items() if k in by_key}
    # A winner from `search_space` (a worker searched beyond the list) is served too, once
    # the record measured the whole list, where KS_AUTOTUNE_SERVE_SEARCHED allows it.
    beyond = [*tuner.search_space, *searched_as_run(tuner, kwargs)] \
        if serve_searched(declared=False, record=found.record) else ()
    if covers(found.timings, found.config, pruned, beyond):
        return res
    if not stored:
        return None  # a record of another config list: not this one's
    missing = [c for k, c in by_key.items() if k not in stored]
    timings: dict[Config, list[float]] = {by_key[k]: [v / 1e3] * 3 for k, v in stored.items()}
    tuner.configs_timings = timings
    if not missing:
        # The record timed this whole list (its winner is outside it): the fastest listed
        # config by the record's own timings, measured and shared by nobody here.
        best = builtins.min(timings, key=lambda c: timings[c][0])
        return Resolution(best, res.source, provisional=False, found=found)
    t0 = time.time()
    measured = {c: tuner._bench(*args, config=c, **kwargs) for c in missing}
    tuner.bench_time = time.time() - t0
    timings.update({c: quantiles(t) for c, t in measured.items()})
    best = builtins.min(timings, key=lambda c: timings[c][0])
    guard.users(tuner.pre_hook, {**tuner.nargs, **kwargs, **best.all_kwargs()}, reset_only=True)
    log.info("%s: measured %d config(s) the served record had not, for key %s", und.name,
             len(missing), key)
    tuner._share_undeclared(case, best, timings, args, kwargs, pruned[0])
    source = Source.TUNED_HERE if best in measured else res.source
    return Resolution(best, source, provisional=False)


_declarations_loaded = False


def load_declarations() -> None:
    """Once per process: load the registry's plugins, whose import declares (and so binds) a
    kernel whose declaration lives in a module the program did not import itself."""
    global _declarations_loaded
    if _declarations_loaded:
        return
    _declarations_loaded = True
    try:
        from kernelsearch.kernels.registry import load_plugins

        load_plugins()
    except Exception as exc:  # a broken plugin must not fail the call
        log.warning("loading kernel plugins failed: %s", exc)
