"""The Autotuner under `@kernelsearch.autotune`: `triton.autotune`'s behaviour, with configs that
come from the shared store or the service instead of being benchmarked again in every process.

    @kernelsearch.autotune(configs=[triton.Config(...), ...], key=["M", "N", "K"])
    @triton.jit
    def matmul_kernel(...): ...

For a new key a call resolves its config: this process's memory, then the local store (the
configured database), then the service (`KS_SERVICE_URL`), then the nearest tuned record, then the
fallback (`KS_AUTOTUNE_FALLBACK=first`: the first config after pruning; `tune`: benchmark here
exactly as `triton.autotune` does, and store the result as a record). Lookups run in a background
thread that the call waits on for at most `KS_AUTOTUNE_TIMEOUT_S`; an unreachable service is not
asked again for `KS_AUTOTUNE_RETRY_S`. A key without a tuned record queues one tuning job (the
decorator's configs, after pruning, are its space) and is looked up again every
`KS_AUTOTUNE_RECHECK_S`, so a later call runs the tuned config. No lookup failure reaches the call.

A worker tunes the kernel by importing the module that declares it (`Autotuner.declare`), so the
declaration is what the registry holds: a `KernelDef` built from the decorator's configs and the
user's input makers, launcher and reference.
"""
from __future__ import annotations

import builtins
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Mapping, Sequence

from triton.compiler.errors import CompilationError
from triton.runtime.autotuner import Autotuner as TritonAutotuner
from triton.runtime.autotuner import Config
from triton.runtime.errors import InterpreterError, OutOfResources, PTXASError

from kernelsearch.kernels.capture import jit_function_of
from kernelsearch.kernels.configs import canonical, canonical_key
from kernelsearch.kernels.resolve import Found, Key, Match, Near
from kernelsearch.kernels.undeclared import Route, UndeclaredKernel
from kernelsearch.search_space.derived import DerivedRule

from . import artifacts, guard
from .backends import BACKENDS, in_daemon_thread
from .declared import DecoratedKernel, declare
from .compile_decision import TUNERS, prune_for_compile, served_for_compile
from .identity import (SourceIdentityError, check_served, load_declarations, searched_as_run,
                       undeclared_key, undeclared_kernel)
from .launch import FORCED, Using, run_forced
from .options import POLICY_WHY, Fallback, Options, Source, Sync
from .ranks import distributed, from_rank0, synced_ranks
from .resolution import Resolution, to_triton
from .search_policy import (default_search_space, list_best, search_space_configs,
                            searched_winner, serve_searched)
from .share import share_declared, share_tuned
from .timing import wallclock_bench

log = logging.getLogger(__name__)


# What a config that cannot be built raises, before anything runs (under the interpreter, where
# building is running, its own wrapper of the same checks).
_BUILD_ERRORS: tuple[type[BaseException], ...] = (OutOfResources, PTXASError, CompilationError,
                                                  InterpreterError)


class Autotuner(TritonAutotuner):
    """Triton's Autotuner (`kernel[grid](...)`, `.configs`, `.best_config`, `.cache`, `.fn`),
    resolving a new key through kernelsearch instead of benchmarking every config here."""

    def __init__(self, fn: Any, arg_names: list[str], configs: list[Config], key: list[str],
                 *args: Any, name: str | None = None,
                 reference: Callable[..., Any] | None = None,
                 search_space: Sequence[Config] | str | DerivedRule | None = None,
                 **kwargs: Any) -> None:
        super().__init__(fn, arg_names, configs, key, *args, **kwargs)
        self.kernel_name = name
        self.reference = reference
        self.reached_by = Route.DECORATOR
        # Configs a worker may search beyond the list (an undeclared kernel's captured calls):
        # given, or the derived space ("derived", a DerivedRule: search_policy).
        self.search_space = self._search_space(
            configs, search_space if search_space is not None else default_search_space())
        self.kernel_def: DecoratedKernel | None = None
        self.sources: dict[tuple, Source] = {}
        self._resolved: dict[tuple, Resolution] = {}
        self._lock = threading.RLock()
        # Triton's Autotuner keeps a call's arguments on itself (`nargs`, read by its benchmark and
        # its restore/reset hooks): one call at a time per kernel, as two threads' calls would
        # restore each other's tensors.
        self._calls = threading.RLock()
        self._meta_names = frozenset(k for c in self.configs for k in c.kwargs)
        # An undeclared kernel's definition, made at its first call (its dtypes come from it).
        self.undeclared: UndeclaredKernel | None = None
        self._told: set[str] = set()
        # torch.compile: Dynamo never calls run(); it calls early_config_prune at trace time, so
        # that is where a compiled call resolves its key (`prune_for_compile`).
        self._user_early_prune: Callable[..., Any] | None = getattr(self, "early_config_prune", None)
        TUNERS[id(self)] = self
        self.early_config_prune = prune_for_compile(id(self), tuple(self.keys),
                                                     self._user_early_prune)
        if not self.user_defined_pre_hook and (self.reset_to_zero or self.restore_value):
            self.pre_hook = self._reset_and_save
        if not self.user_defined_post_hook and self.restore_value:
            self.post_hook = self._restore
        # KS_PREFETCH=1: compiled kernels fetched while the program starts up.
        guard.guarded(self._name(), "prefetching compiled kernels", artifacts.prefetch_soon, None)

    def served_for_compile(self, ints: tuple, tensors: tuple, nones: tuple) -> int:
        """The index in `configs` of this key's served config, else -1 (`compile_decision`)."""
        return served_for_compile(self, ints, tensors, nones)

    # Triton's reset_to_zero / restore_value hooks, skipping an argument passed as None (an
    # optional output), which Triton 3.6's own hooks fail on.
    def _reset_and_save(self, kwargs: dict[str, Any], reset_only: bool = False) -> None:
        for name in self.reset_to_zero:
            if kwargs.get(name) is not None:
                kwargs[name].zero_()
        if not reset_only:
            self.restore_copies = {n: kwargs[n].clone() for n in self.restore_value
                                   if kwargs.get(n) is not None}

    def _restore(self, kwargs: dict[str, Any], exception: BaseException | None) -> None:
        for name, saved in self.restore_copies.items():
            kwargs[name].copy_(saved)
        self.restore_copies = {}

    # Under the interpreter there is no GPU benchmarker: time by the wall clock, as
    # kernels.measure does there, so KS_AUTOTUNE_FALLBACK=tune works on the CPU as well.
    @property
    def do_bench(self) -> Callable[..., Any]:  # type: ignore[override]
        if self._do_bench is not None:
            return self._do_bench
        if os.environ.get("TRITON_INTERPRET") == "1":
            return wallclock_bench
        from triton.runtime.driver import driver

        return driver.active.get_benchmarker()

    # -- the call ------------------------------------------------------------------------------
    def run(self, *args: Any, **kwargs: Any) -> Any:
        forced = getattr(FORCED, "configs", {}).get(id(self))
        if forced is not None:
            return run_forced(self, forced, args, kwargs)
        with self._calls:
            return self._run(args, kwargs)

    def _run(self, args: tuple, kwargs: dict) -> Any:
        self.nargs = dict(zip(self.arg_names, args))
        try:
            if len(self.configs) == 1 and self.kernel_def is None:
                self.best_config = self.configs[0]
                return self._launch(self.configs[0], args, kwargs)
            key: tuple | None = None
            try:
                key, named = self._key(kwargs)
                res = self._resolution(key, named, args, kwargs)
            except Exception as exc:  # the boundary: kernelsearch's failure is never the call's
                if guard.is_users(exc):
                    raise
                guard.failed(self._name(), "resolving a key", exc)
                return self._as_triton(key, args, kwargs)
            self.best_config = res.config
            try:
                ret = self._launch(res.config, args, kwargs)
                if res.source is Source.TUNED_HERE and not res.noted:
                    res.noted = True
                    guard.guarded(self._name(), "sharing the compiled kernel",
                                  lambda: self._note_compiled(named, res.config, ret), None)
                return ret
            except _BUILD_ERRORS as exc:
                if res.source in (Source.FIRST, Source.TUNED_HERE):
                    raise
                # A record this build cannot compile (another Triton, another GPU's limits): the
                # call runs the first config instead, and so does every later call of the key.
                log.warning("%s: the %s config %s does not build here (%s); using the first",
                            self.kernel_name, res.source.value, res.config, exc)
                first = self.prune_configs(kwargs)[0]
                with self._lock:
                    self._resolved[key] = Resolution(first, Source.FIRST, provisional=False)
                    self.sources[key] = Source.FIRST
                    self.cache[key] = self.best_config = first
                return self._launch(first, args, kwargs)
        finally:
            self.nargs = None  # type: ignore[assignment]  # Triton's Autotuner resets it so too

    def _as_triton(self, key: tuple | None, args: tuple, kwargs: dict) -> Any:
        """What triton.autotune does for this call (kernelsearch failed to resolve its key):
        Triton's own run, its benchmark of the pruned configs, disk cache, hooks and prints.
        Later calls of the key run its answer."""
        with self._lock:
            self._resolved.pop(key, None)  # type: ignore[arg-type]
            self.cache.pop(key, None)  # type: ignore[arg-type]
        self.__dict__.pop("bench_time", None)  # set again only when Triton benchmarks
        ret = TritonAutotuner.run(self, *args, **kwargs)
        if key is not None:
            source = (Source.FIRST if len(self.configs) == 1 else
                      Source.TUNED_HERE if "bench_time" in vars(self) else Source.CACHED)
            with self._lock:
                self._resolved[key] = Resolution(self.best_config, source, provisional=False)
                self.sources[key] = source
        return ret

    # The user's own code inside the boundary (pruning, benchmarks, Triton's disk cache): what it
    # raises passes the boundary unchanged, as under triton.autotune.
    def prune_configs(self, kwargs: dict) -> list[Config]:
        return guard.users(super().prune_configs, kwargs)

    def _bench(self, *args: Any, config: Config, **meta: Any) -> Any:
        return guard.users(super()._bench, *args, config=config, **meta)

    def check_disk_cache(self, tuning_key: Any, configs: list[Config], bench_fn: Callable) -> bool:
        return guard.users(super().check_disk_cache, tuning_key, configs, bench_fn)

    def _launch(self, config: Config, args: tuple, kwargs: dict) -> Any:
        if config.pre_hook is not None:
            config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
        return self.fn.run(*args, **kwargs, **config.all_kwargs())

    def _note_compiled(self, named: dict[str, Any], config: Config, handle: Any) -> None:
        """Hand the compiled kernel of a key tuned here to kernelsearch.artifacts, which uploads
        its compile group beside the record once the store has taken it."""
        case = self.case_key(named)
        if case is not None:
            artifacts.note_compiled(self._name(), case.axes_dict, canonical(config), handle)

    def _key(self, kwargs: Mapping[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """Triton's tuning key (key arguments' values, then every tensor argument's dtype)."""
        all_args = {**self.nargs, **kwargs}
        named = {k: v for k, v in all_args.items() if k in self.arg_names}
        key = [named[k] for k in self.keys if k in named]
        key += [str(a.dtype) for a in named.values() if hasattr(a, "dtype")]
        return tuple(key), named

    def _resolution(self, key: tuple, named: dict[str, Any], args: tuple,
                    kwargs: dict) -> Resolution:
        with self._lock:
            res = self._resolved.get(key)
        if res is None:
            res = self._resolve(key, named, args, kwargs)
            with self._lock:
                self._resolved[key] = res
                self.sources[key] = res.source
                self.cache[key] = res.config
            if res.found is not None and res.source in (Source.STORE, Source.SERVICE):
                artifacts.before_first_launch(self._name(), res.found)  # its compiled kernel
        elif res.provisional and not res.pending and time.monotonic() >= res.next_check:
            guard.guarded(self._name(), "looking a key up again",
                          lambda: self._recheck(key, named, res), None)
        return res

    # -- resolving a new key -----------------------------------------------------------------
    def _resolve(self, key: tuple, named: dict[str, Any], args: tuple, kwargs: dict) -> Resolution:
        opts = Options.from_env()
        if self.kernel_def is None:
            load_declarations()
        dist = distributed() if opts.sync is Sync.BROADCAST else None
        if dist is not None and dist.get_rank() != 0:
            return from_rank0(dist, None, self._meta_names, self.configs)
        if dist is not None:  # the other ranks wait for rank 0's broadcast: a failure is a miss
            miss: tuple[Key | None, Resolution | None] = (None, None)
            case, res = guard.guarded(self._name(), "resolving a key",
                                      lambda: self._served(key, named, opts, args, kwargs), miss)
        else:
            case, res = self._served(key, named, opts, args, kwargs)
        if res is None:
            self._tell("miss", logging.INFO, "%s: no served config for key %s now: %s",
                       self._name(), key, POLICY_WHY[opts.fallback])
            res = self._fallback(key, opts, case, args, kwargs)
        if dist is not None:
            return from_rank0(dist, res, self._meta_names, self.configs)
        return res

    def _served(self, key: tuple, named: dict[str, Any], opts: Options, args: tuple,
                kwargs: dict) -> tuple[Key | None, Resolution | None]:
        """The call's record key and what is served for it (None: a miss)."""
        case = self.case_key(named)
        if case is None:
            return None, None
        res = self._lookup(key, case, opts, kwargs)
        if res is not None and res.provisional and opts.fallback is not Fallback.NEAREST:
            res = None  # a nearest record is served only when the user asked for it
        if res is not None and self.kernel_def is None:
            res = check_served(self, key, case, res, args, kwargs)
        return case, res

    def _name(self) -> str:
        kdef = self.kernel_def or self.undeclared
        return kdef.name if kdef is not None else self.base_fn.__name__

    def _near(self, case: Key) -> Near | None:
        """The kernel's own "nearest" (`KernelDef.distance`) from this case's axes."""
        kdef = self.kernel_def or self.undeclared
        if kdef is None:
            return None
        axes = case.axes_dict
        return lambda other: kdef.distance(axes, dict(other))

    @staticmethod
    def _search_space(configs: list[Config], spec: Any) -> list[Config]:
        """The configs workers may search beyond the list. A list the user gave that does not fit
        is the user's error (ValueError naming it); a derived space that does not fit this
        kernel's configs (meta-parameters named `num_warps`, say) is kernelsearch's: warned
        about once, and the workers search the list only."""
        space = search_space_configs(configs, spec)
        for i, c in enumerate(space):
            if not isinstance(c, Config) or set(c.kwargs) != set(configs[0].kwargs):
                if not isinstance(spec, (str, DerivedRule)):
                    raise ValueError(f"search_space[{i}]: expected a triton.Config setting the "
                                     f"configs' meta-parameters {sorted(configs[0].kwargs)}")
                log.warning("kernelsearch: the derived space of a kernel whose configs set %s "
                            "does not fit them; workers search its list only",
                            sorted(configs[0].kwargs))
                return []
        return space

    def _capture(self, kwargs: dict, ran: Sequence[Config]) -> dict[str, Any] | None:
        """This call as data for a worker (kernels.capture), with `ran`, the configs this
        kernel's pruner kept on it; None when it cannot travel."""
        from kernelsearch.kernels.capture import CaptureError, capture_call, heuristics_of

        try:
            named = {k: v for k, v in {**(self.nargs or {}), **kwargs}.items()
                     if k in self.arg_names and k not in self._meta_names}
            constexprs = [self.arg_names[i] for i in getattr(jit_function_of(self), "constexprs", ())]
            return capture_call(named, constexprs,
                                [c.all_kwargs() for c in [*self.configs, *self.search_space]],
                                kwargs.get("grid"), [c.all_kwargs() for c in ran],
                                heuristics_of(self.fn)).as_json()
        except CaptureError as exc:
            self._tell("capture", logging.INFO, "%s: this call cannot be sent to the workers "
                       "(%s); it runs the fallback config until a record lands", self._name(), exc)
            return None
        except Exception as exc:  # a grid that fails on another config: no job, never a failed call
            self._tell("capture", logging.INFO, "%s: no capture of this call (%s: %s)",
                       self._name(), type(exc).__name__, exc)
            return None

    def _lookup(self, key: tuple, case: Key, opts: Options, kwargs: dict) -> Resolution | None:
        ran = self.prune_configs(kwargs)
        n_trials = len(ran)
        near = self._near(case)
        # Workers tune an undeclared kernel from a call's capture, sent in the opt-in modes (the
        # default tunes here and shares the result).
        capture = (self._capture(kwargs, ran) if opts.submit_jobs and self.kernel_def is None
                   and opts.fallback is not Fallback.TUNE else None)
        submit = opts.submit_jobs and (self.kernel_def is not None or capture is not None)
        if capture is not None:
            n_trials = len(capture.get("ran") or self.configs) + len(self.search_space)
        # Imports and clients are local work, bounded whatever the service does: done here, so
        # that the hard timeout below is spent on the lookup itself.
        BACKENDS.prepare()

        definition = (self.undeclared.definition.as_json()
                      if capture is not None and self.undeclared else None)

        def task() -> Found | None:
            found = BACKENDS.lookup(case, near=near)
            if submit and (found is None or found.match is not Match.EXACT):
                guard.guarded(case.kernel, "queuing a tuning job",
                              lambda: BACKENDS.submit_once(case, n_trials, capture=capture,
                                                           definition=definition), None)
            return found

        # A lookup that may queue a job is waited for at exit: a short script's miss still
        # queues its tuning.
        fut = BACKENDS.bounded(task, opts.timeout_s, keep=submit)
        if fut.done():
            found = fut.result()
            if found is not None and self.kernel_def is None and \
                    canonical_key(found.config) not in {canonical_key(c) for c in ran}:
                ran = [*ran, *searched_as_run(self, kwargs)]  # a searched winner, as pruned here
            return self._resolution_of(found, opts, ran)
        self._tell("slow", logging.INFO, "%s: the lookup for key %s did not answer within "
                   "KS_AUTOTUNE_TIMEOUT_S=%g s", self._name(), key, opts.timeout_s)
        # Too slow for this call: whatever it finds later is adopted by a later call (unless
        # keys are pinned to their first answer: KS_AUTOTUNE_RECHECK_S=0, or ranks that follow
        # rank 0's broadcast).
        synced = synced_ranks(opts)
        if opts.recheck_s > 0 and not synced:
            fut.add_done_callback(lambda f: self._adopt(key, f, opts))
        return None

    def _resolution_of(self, found: Found | None, opts: Options,
                       ran: Sequence[Config] = ()) -> Resolution | None:
        """A record as this decorator runs it: a listed config, or one of `ran` (the call's
        pruned list: a pruner may make configs the list lacks); None when it is neither."""
        if found is None:
            return None
        provisional = found.match is not Match.EXACT
        source = Source.NEAREST if provisional else Source(found.source)
        if self.kernel_def is not None and searched_winner(found.record) and \
                not serve_searched(declared=True):
            # KS_AUTOTUNE_SERVE_SEARCHED=off: the list's best by the record's own timings, else
            # the key is tuned as without a record.
            best = list_best(found.timings, self.configs)
            if best is None:
                log.info("%s: the record's winner was searched beyond the list and "
                         "KS_AUTOTUNE_SERVE_SEARCHED=off; it timed none of the list",
                         self.kernel_name)
                return None
            return Resolution(best, source, provisional,
                              next_check=time.monotonic() + opts.recheck_s, found=found)
        config = to_triton(found.config, self._meta_names, self.configs)
        if config is None and self.kernel_def is None:
            config = next((c for c in ran if canonical_key(c) == canonical_key(found.config)), None)
        if config is None:
            log.info("record for %s does not fit this kernel's meta-parameters: %s",
                     self.kernel_name, found.config)
            return None
        return Resolution(config, source, provisional,
                          next_check=time.monotonic() + opts.recheck_s, found=found)

    def _adopt(self, key: tuple, fut: Future, opts: Options) -> None:
        """A late lookup's answer replaces a provisional one (never a tuned or exact one); a
        nearest answer only under KS_AUTOTUNE_FALLBACK=nearest (`first` runs the first config
        until an exact record exists)."""
        try:
            new = self._resolution_of(fut.result(), opts)
        except Exception as exc:
            guard.failed(self._name(), "a late lookup", exc)
            new = None
        if new is not None and new.provisional and opts.fallback is not Fallback.NEAREST:
            new = None
        with self._lock:
            cur = self._resolved.get(key)
            if cur is not None:
                cur.pending = False
                cur.next_check = time.monotonic() + opts.recheck_s
            if new is None or (cur is not None and not cur.provisional):
                return
            if cur is not None and new.provisional and cur.source is Source.NEAREST:
                return
            self._resolved[key] = new
            self.sources[key] = new.source
            self.cache[key] = new.config
        log.info("%s: key %s now runs the %s config %s (a later lookup's answer)", self._name(),
                 key, new.source.value, canonical(new.config))

    def _recheck(self, key: tuple, named: dict[str, Any], res: Resolution) -> None:
        """Look a provisional key up again in the background; the call goes on with what it has."""
        opts = Options.from_env()
        case = self.case_key(named)
        synced = synced_ranks(opts)
        if case is None or opts.recheck_s <= 0 or synced:
            res.provisional = False  # pinned: nothing to look up, or ranks must not drift apart
            return
        res.pending = True
        near = self._near(case)
        fut = in_daemon_thread(lambda: BACKENDS.lookup(case, fresh=True, near=near))
        fut.add_done_callback(lambda f: self._adopt(key, f, opts))

    def _fallback(self, key: tuple, opts: Options, case: Key | None, args: tuple,
                  kwargs: dict) -> Resolution:
        pruned = self.prune_configs(kwargs)
        if opts.fallback is Fallback.TUNE and len(pruned) > 1:
            config, cached = self._tune_here(key, pruned, args, kwargs)
            if case is not None and self.kernel_def is not None:
                guard.guarded(self._name(), "sharing the config tuned here",
                              lambda: share_declared(self.kernel_def, case, config, len(pruned), args), None)
            elif case is not None and not cached:
                # The call too, so that a search of this key has it to run (no job carries it).
                capture = self._capture(kwargs, pruned) if opts.submit_jobs else None
                self._share_undeclared(case, config, self.configs_timings, args, kwargs, pruned[0],
                                       capture)
            return Resolution(config, Source.CACHED if cached else Source.TUNED_HERE,
                              provisional=False)
        return Resolution(pruned[0], Source.FIRST, provisional=case is not None,
                          next_check=time.monotonic() + opts.recheck_s)

    def _tune_here(self, key: tuple, pruned: list[Config], args: tuple,
                   kwargs: dict) -> tuple[Config, bool]:
        """Triton's own benchmark of every pruned config (its `_bench`, hooks included, and its
        disk cache of timings with cache_results). Returns the winner and whether it came from
        that disk cache."""
        from triton import knobs

        def benchmark() -> None:
            t0 = time.time()
            timings = {c: self._bench(*args, config=c, **kwargs) for c in pruned}
            self.bench_time = time.time() - t0
            self.cache[key] = builtins.min(timings, key=lambda c: timings[c])
            guard.users(self.pre_hook, {**self.nargs, **kwargs, **self.cache[key].all_kwargs()},
                        reset_only=True)
            self.configs_timings = timings

        cached = False
        if self.cache_results:
            cached = bool(self.check_disk_cache(key, pruned, benchmark))
        else:
            benchmark()
        if knobs.autotuning.print and not cached:
            print(f"Triton autotuning for function {self.base_fn.__name__},\nwith key as {key},\n"
                  f"finished after {self.bench_time:.2f}s,\nbest config selected: {self.cache[key]};")
        return self.cache[key], cached

    def _share_undeclared(self, case: Key, config: Config, timings: Mapping[Config, Any],
                          args: tuple, kwargs: dict, first: Config,
                          capture: Mapping[str, Any] | None = None) -> None:
        """Share what this process tuned for an undeclared kernel (`share_tuned`, checked and
        uploaded in the background), with the call's `capture` when there is one."""
        if self.undeclared is not None:
            guard.guarded(self._name(), "sharing the config tuned here",
                          lambda: share_tuned(self, self.undeclared, case, config, timings, args,
                                              kwargs, first, capture), None)

    # -- forced configs (the tuner's launches) ------------------------------------------------
    def using(self, config: Config | Mapping[str, Any]) -> "Using":
        """Within the block, every call runs `config` as Triton's benchmark runs a candidate:
        reset_to_zero, restore_value and the pre/post hooks around the launch."""
        if not isinstance(config, Config):
            made = to_triton(config, self._meta_names, self.configs)
            if made is None:
                raise ValueError(f"config: {dict(config)} does not set this kernel's "
                                 f"meta-parameters {sorted(self._meta_names)}")
            config = made
        return Using(self, config)

        return Using(self, config)


    # -- the record key of a call ---------------------------------------------------------------
    def case_key(self, named: Mapping[str, Any]) -> Key | None:
        """The (kernel, axes, device) a call is looked up under; None when it is not declared,
        or the call's dtypes are not the declaration's."""
        kdef = self.kernel_def
        if kdef is not None:
            case = kdef.case_key_of(named)
            if case is None:
                self._tell("outside", logging.INFO, "%s: called outside its declaration (axes %s, "
                           "dtypes %s); such calls are tuned here, not shared", kdef.name,
                           [a.name for a in kdef.axes], dict(kdef.dtypes))
            return case
        und = self._undeclared_of(named)
        return None if und is None else undeclared_key(und, named)

    def _undeclared_of(self, named: Mapping[str, Any]) -> UndeclaredKernel | None:
        """This kernel's definition when it has no declaration, made once from its first call."""
        if self.undeclared is None:
            try:
                self.undeclared = undeclared_kernel(self, named, self.kernel_name)
            except SourceIdentityError as exc:
                self._tell("identity", logging.INFO, "%s: no source identity (%s); tuned here as "
                           "triton.autotune would, not shared", self.base_fn.__name__, exc)
        return self.undeclared

    def _tell(self, what: str, level: int, msg: str, *args: Any) -> None:
        """Log a message once per kernel (the first miss, a record of other code, ...)."""
        if what in self._told:
            return
        self._told.add(what)
        log.log(level, msg, *args)

    def resolved(self, key: tuple) -> tuple[Config, Source] | None:
        """The config a key runs now and where it came from (one consistent view; a late lookup
        may replace it between calls)."""
        with self._lock:
            res = self._resolved.get(key)
            return None if res is None else (res.config, res.source)

    def forget(self) -> None:
        """Drop every resolved key: the next call of each resolves again."""
        with self._lock:
            self._resolved.clear()
            self.sources.clear()
            self.cache.clear()

    # -- the declaration -------------------------------------------------------------------------
    def declare(self, **kw: Any) -> DecoratedKernel:
        """Build and register this kernel's KernelDef (see `declare`)."""
        kw.setdefault("module", sys._getframe(1).f_globals.get("__name__"))
        return declare(self, **kw)
