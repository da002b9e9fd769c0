"""Triton's own autotune cache, served by kernelsearch: code that keeps `@triton.autotune` with
`cache_results=True` (or runs with `TRITON_CACHE_AUTOTUNING=1`) needs one environment variable,

    TRITON_CACHE_MANAGER=kernelsearch.triton_cache:AutotuneCacheManager

and a host that has never seen a kernel runs no benchmark for a key another host has tuned.

Compiled kernels stay in Triton's file cache; a compile group the local cache misses is asked
of kernelsearch (`kernelsearch.artifacts`: served beside the records, verified by sha256, only
under this host's compile fingerprint), and the winner's group is shared with its record. The
autotune entries (`<fn>.autotune.json`) go through kernelsearch: a local miss asks the one resolver (the local
store, then the service: `KS_DATABASE_URL`, `KS_SERVICE_URL`, with the decorator's time bound
and back-off), and an entry Triton writes after benchmarking is shared as a record (the kernel's
identity, Triton's tuning key as axes, the device, versions and every config's timings), after
the same correctness check as the decorator's: the winner must write what the first config
writes on the same call (in the background, after the call). Nothing here fails or delays a
launch beyond `KS_AUTOTUNE_TIMEOUT_S`: any fault of kernelsearch's is a miss (Triton benchmarks)
or an entry not shared (`kernelsearch.guard`).

Triton names neither the kernel nor the call to its cache manager, only a hash and a file name;
the manager reads them from the autotuner's own `check_disk_cache` frame, which is on the stack
whenever Triton asks for or writes an autotune entry.
"""
from __future__ import annotations

import base64
import json
import logging
import math
import sys
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from triton.runtime.autotuner import Autotuner as TritonAutotuner
from triton.runtime.autotuner import Config
from triton.runtime.cache import FileCacheManager

from . import artifacts, guard

log = logging.getLogger(__name__)

SUFFIX = ".autotune.json"


@dataclass
class Stats:
    """What the manager did in this process (the benchmarks read it)."""

    served: int = 0
    shared: int = 0
    missed: int = 0
    groups: int = 0  # compile groups served (kernelsearch.artifacts)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


STATS = Stats()


@dataclass
class _Call:
    tuner: Any
    tuning_key: tuple
    configs: list[Config]
    args: tuple
    kwargs: dict

    @property
    def named(self) -> dict[str, Any]:
        all_args = {**(self.tuner.nargs or {}), **self.kwargs}
        return {k: v for k, v in all_args.items() if k in self.tuner.arg_names}


def _resolves_itself(tuner: Any) -> bool:
    """A kernelsearch decorator's autotuner (it resolves and shares its keys itself); read from
    the loaded modules, so the hook never imports the decorator."""
    mod = sys.modules.get("kernelsearch.tuner")
    return mod is not None and isinstance(tuner, mod.Autotuner)


def _autotune_call() -> _Call | None:
    """The autotuner call asking for (or writing) an entry: the frame of Triton's
    `check_disk_cache` and, above it, the call's arguments. None for a kernelsearch decorator
    (it resolves and shares its keys itself) or when Triton's frames are not what they were."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        tuner = f.f_locals.get("self")
        if f.f_code.co_name == "check_disk_cache" and isinstance(tuner, TritonAutotuner):
            if _resolves_itself(tuner):
                return None
            caller = f.f_back
            loc = caller.f_locals if caller is not None else {}
            return _Call(tuner, tuple(f.f_locals.get("tuning_key") or ()),
                         list(f.f_locals.get("configs") or ()), tuple(loc.get("args", ())),
                         dict(loc.get("kwargs", {})))
        f = f.f_back
    return None


def _kernel(call: _Call) -> Any:
    """The call's undeclared kernel definition, made once per autotuner."""
    from .identity import undeclared_kernel

    und = getattr(call.tuner, "_ks_undeclared", None)
    if und is None:
        from .search_policy import default_search_space, search_space_configs

        # What workers may search beyond the list (KS_AUTOTUNE_SEARCH_SPACE), as the decorator
        # keeps it: its definition and its captures carry it. Triton never reads the attribute.
        call.tuner.search_space = search_space_configs(call.tuner.configs, default_search_space())
        und = undeclared_kernel(call.tuner, call.named)
        call.tuner._ks_undeclared = und
    return und


def served_entry(call: _Call) -> str | None:
    """The autotune entry of this call from the resolver, as Triton writes one; None when no
    record of this code measured every config of this list."""
    from kernelsearch.kernels.configs import canonical_key
    from .backends import BACKENDS
    from .identity import serves_list, undeclared_key
    from .options import Options

    und = _kernel(call)
    key = undeclared_key(und, call.named)
    if key is None:
        return None
    found = BACKENDS.lookup_bounded(key, Options.from_env().timeout_s)
    if found is None or not found.timings:
        return None
    if not serves_list(found, und, call.configs):
        log.info("%s: no served record of this code and config list; Triton benchmarks here",
                 und.name)
        return None
    pairs = []
    winner = canonical_key(found.config)
    # The record's winner first: Triton takes the first of equal timings, so a tie (medians of a
    # coarse timer often are) still picks what the first host ran.
    for c in sorted(call.configs, key=lambda c: canonical_key(c) != winner):
        t = found.timings[canonical_key(c)]
        ms = math.inf if t is None else float(t) / 1e3
        pairs.append((c.__dict__, [ms, ms, ms]))
    artifacts.before_first_launch(und.name, found)
    log.info("%s: autotune entry for key %s served by kernelsearch (%s)", und.name,
             call.tuning_key, found.source)
    return json.dumps({"key": list(call.tuning_key), "configs_timings": pairs})


def share_entry(call: _Call, data: str) -> bool:
    """Share an entry Triton wrote after benchmarking, as a record (through the acceptance gate;
    checked and uploaded in the background)."""
    from kernelsearch.kernels.configs import canonical_key
    from .identity import undeclared_key
    from .share import share_tuned

    und = _kernel(call)
    key = undeclared_key(und, call.named)
    if key is None:
        return False
    listed = {canonical_key(c): c for c in call.configs}
    timings: dict[Config, Any] = {}
    for cfg, t in json.loads(data)["configs_timings"]:
        c = listed.get(canonical_key(Config(**cfg)))
        if c is not None:
            timings[c] = t
    if not timings:
        return False
    # The config Triton chose and this host runs (its own min over whole timing lists).
    chosen = call.tuner.cache.get(call.tuning_key)
    winner = listed.get(canonical_key(chosen)) if chosen is not None else None
    if winner is None:
        winner = min(timings, key=lambda c: timings[c][0] if isinstance(timings[c], list) else timings[c])
    share_tuned(call.tuner, und, key, winner, timings, call.args, call.kwargs, call.configs[0],
                guard.guarded(und.name, "capturing the call", lambda: _capture(call), None))
    guard.guarded(und.name, "sharing the compiled kernel",
                  lambda: _note_compiled(call, und.name, key.axes_dict, winner), None)
    return True


def _capture(call: _Call) -> dict[str, Any] | None:
    """The call as data, kept with its record so that a search of its key has a call to run
    (kernels.capture: every config's grid, the list and the search space, and the configs
    Triton's pruning kept); None where the program sends no jobs (KS_AUTOTUNE_SUBMIT=0)."""
    from kernelsearch.kernels.capture import capture_call, jit_function_of
    from .options import Options

    if not Options.from_env().submit_jobs:
        return None
    tuner = call.tuner
    meta = {k for c in tuner.configs for k in c.kwargs}
    named = {k: v for k, v in call.named.items() if k not in meta}
    constexprs = [tuner.arg_names[i] for i in getattr(jit_function_of(tuner), "constexprs", ())]
    every = [*tuner.configs, *getattr(tuner, "search_space", ())]
    return capture_call(named, constexprs, [c.all_kwargs() for c in every],
                        call.kwargs.get("grid"), [c.all_kwargs() for c in call.configs]).as_json()


def _note_compiled(call: _Call, name: str, axes: Any, winner: Config) -> None:
    """Hand the winner's compiled kernel (compiled by Triton's benchmark; `warmup` gives its
    handle without a launch) to kernelsearch.artifacts, which uploads it beside the record."""
    from kernelsearch.kernels.configs import canonical

    kwargs = {**call.kwargs, "warmup": True, **winner.all_kwargs()}
    handle = call.tuner.fn.run(*call.args, **kwargs)
    artifacts.note_compiled(name, axes, canonical(winner), handle)


class AutotuneCacheManager(FileCacheManager):
    """Triton's file cache manager, with autotune entries read from and shared through
    kernelsearch (`TRITON_CACHE_MANAGER=kernelsearch.triton_cache:AutotuneCacheManager`)."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        self._plain = override or dump

    def get_file(self, filename: str) -> str | None:
        path = super().get_file(filename)
        if path is not None or self._plain or not filename.endswith(SUFFIX):
            return path
        call = guard.guarded(filename, "the autotune cache's lookup", _autotune_call, None)
        data = (guard.guarded(call.tuner.base_fn.__name__, "the autotune cache's lookup",
                              lambda: served_entry(call), None) if call is not None else None)
        if data is None:
            STATS.add("missed")
            return None
        STATS.add("served")
        return super().put(data, filename, binary=False)

    def get_group(self, filename: str) -> dict[str, str] | None:
        """Triton's compile group; a local miss asks kernelsearch.artifacts for the group under
        this cache key (prefetched, else the store or service, once per key), verified and
        installed under this host's compile fingerprint, else None: Triton compiles."""
        group = super().get_group(filename)
        if group is not None or self._plain or not filename.endswith(".json") \
                or filename.endswith(SUFFIX):
            return group
    
        cache_key = guard.guarded(filename, "the compile cache's lookup",
                                  lambda: base64.b32decode(self.key + "=" * (-len(self.key) % 8)).hex(),
                                  None)
        if cache_key and guard.guarded(filename, "the compile cache's lookup",
                                       lambda: artifacts.group_for_cache_key(cache_key), False):
            STATS.add("groups")
            return super().get_group(filename)
        return None

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path = super().put(data, filename, binary)
        if not self._plain and filename.endswith(SUFFIX):
            call = guard.guarded(filename, "sharing an autotune entry", _autotune_call, None)
            if call is not None and guard.guarded(call.tuner.base_fn.__name__,
                                                  "sharing an autotune entry",
                                                  lambda: share_entry(call, str(data)), False):
                STATS.add("shared")
        return path
