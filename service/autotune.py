"""`@kernelsearch.autotune`: `triton.autotune`'s signature and behaviour, with configs that come from
the shared store or the service instead of being benchmarked again in every process.

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

import atexit
import builtins
import enum
import logging
import math
import os
import statistics
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from triton.compiler.errors import CompilationError
from triton.runtime.autotuner import Autotuner as TritonAutotuner
from triton.runtime.autotuner import Config
from triton.runtime.errors import InterpreterError, OutOfResources, PTXASError

from kernelsearch.kernels.configs import (LAUNCH_DEFAULTS, LAUNCH_OPTIONS, canonical,
                                          canonical_key, to_triton_config)
from kernelsearch.kernels.resolve import Found, Key, Match, Near, Resolver, SourceUnavailable
from kernelsearch.kernels.spec import (Axis, Case, KernelDef, configs_rule, params_from_configs,
                                       source_hash_of)
from kernelsearch.kernels.capture import jit_function_of
from kernelsearch.kernels.runtime import runtime_of
from kernelsearch.kernels.undeclared import (DTYPE_AXIS_SUFFIX, Definition, UndeclaredKernel,
                                             dtype_axis, kernel_def, tensor_args, work_of,
                                             written_mismatches)

from . import guard

if TYPE_CHECKING:
    from kernelsearch.db.interfaces import RecordRepository

log = logging.getLogger(__name__)

MAX_AXIS = 2**31 - 1
WRITE_TIMEOUT_S = 10.0


class Fallback(str, enum.Enum):
    """What a key with no served record runs: Triton's own benchmark here, then shared (the
    default: never worse than triton.autotune), or at once the first config or the nearest
    served one while the workers tune (opt-in)."""

    TUNE = "tune"
    FIRST = "first"
    NEAREST = "nearest"


class Source(str, enum.Enum):
    """Where a key's config came from (`Autotuner.sources`)."""

    STORE = "store"
    SERVICE = "service"
    NEAREST = "nearest"
    FIRST = "first"
    TUNED_HERE = "tuned_here"
    CACHED = "cached"  # Triton's own disk cache of timings (cache_results)
    RANK0 = "rank0"


class Sync(str, enum.Enum):
    """How the ranks of a torch.distributed job agree on a key's config."""

    NONE = "none"
    BROADCAST = "broadcast"


@dataclass(frozen=True)
class Options:
    """The KS_AUTOTUNE_* settings (service/settings.py's ClientSettings, a user program's own),
    read once per resolved key (cheap next to a kernel launch); a bad value is warned about and
    replaced by its default, never raised."""

    fallback: Fallback = Fallback.TUNE
    timeout_s: float = 0.25
    retry_s: float = 30.0
    recheck_s: float = 10.0
    sync: Sync = Sync.NONE
    submit_jobs: bool = True
    prepare: bool = True

    @classmethod
    def from_env(cls) -> "Options":
        from pydantic import ValidationError

        from .settings import ClientSettings as Settings
        from .settings import client_settings

        try:
            st = client_settings()
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
            for name in sorted(bad):
                log.warning("KS_%s=%r is not accepted (%s); using its default", name.upper(),
                            os.environ.get(f"KS_{name.upper()}"),
                            next(e["msg"] for e in exc.errors() if e["loc"][:1] == (name,)))
            try:
                st = Settings(**{n: Settings.model_fields[n].default for n in bad
                                 if n in Settings.model_fields})
            except ValidationError:
                return cls()
        return cls(fallback=Fallback(st.autotune_fallback), timeout_s=st.autotune_timeout_s,
                   retry_s=st.autotune_retry_s, recheck_s=st.autotune_recheck_s,
                   sync=Sync(st.autotune_sync), submit_jobs=st.autotune_submit,
                   prepare=st.autotune_prepare)


# -- configs as records hold them -------------------------------------------------------------------
def to_triton(config: Mapping[str, Any], meta_names: frozenset[str],
              listed: Sequence[Config] = ()) -> Config | None:
    """A record's config as a triton.Config (the listed one when equal, keeping its pre_hook);
    None when its meta-parameters are not this kernel's (a record of another version)."""
    if {k for k in config if k not in LAUNCH_OPTIONS} != set(meta_names):
        return None
    return to_triton_config(config, listed)


# -- where answers come from -----------------------------------------------------------------------
@dataclass(frozen=True)
class _TensorMeta:
    """A tensor argument as a traced call knows it (its dtype and device), for the key."""

    dtype: Any
    device: Any


# Decorated kernels by id, and what a trace decided for each (`_decide_for_compile`).
_TUNERS: dict[int, "Autotuner"] = {}
_DECIDED: dict[int, int] = {}


def _decide_for_compile(ctx: Any) -> None:
    """Run by Dynamo at trace time (`comptime`) inside `_prune_for_compile`'s traced code: where
    the call's key is made of constants (Dynamo has not made an integer dynamic), look it up
    (`Autotuner.served_for_compile`) and leave the answer for `_decided`; -1 otherwise."""
    names = ("tid", "ints", "tensors", "nones")
    got = [ctx.get_local(n) for n in names]
    tid = got[0].as_python_constant()
    answer = -1
    if all(v.is_python_constant() for v in got):
        ints, tensors, nones = (v.as_python_constant() for v in got[1:])
        try:
            answer = _TUNERS[tid].served_for_compile(ints, tensors, nones)
        except Exception as exc:  # compiling never fails for a lookup: Inductor tunes every config
            guard.failed(_TUNERS[tid]._name() if tid in _TUNERS else "a kernel",
                         "the torch.compile decision", exc)
    _DECIDED[tid] = answer


def _decided(tid: int) -> int:
    """The trace's decision (`_decide_for_compile`), a constant of the graph."""
    return _DECIDED.pop(tid, -1)


# What torch._dynamo.assume_constant_result sets (without importing Dynamo in every program).
_decided._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _prune_for_compile(tuner_id: int, keys: tuple[str, ...],
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


class Backends:
    """The user program's resolver (the local store, then the service: `service.sources`) and its
    writes, shared by every decorated kernel. The resolver leaves a source that fails alone for
    `retry_s`; jobs are submitted at most once per key per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ensure_lock = threading.Lock()
        self.resolver = Resolver(())
        self._store: RecordRepository | None = None
        self._client: Any = None
        self._writer: Any = None
        self._made_for: tuple | None = None
        # Until then, a new key does not wait for its lookup at all (the last one ran out of time).
        self.slow_until = 0.0
        self._submitted: set[Key] = set()
        self._pending = 0  # background work the process waits for at exit (`drain`)
        self._idle = threading.Condition(self._lock)

    def _ensure(self) -> None:
        with self._ensure_lock:
            self._ensure_locked()

    def _ensure_locked(self) -> None:
        from .settings import client_settings
        from .sources import ServiceSource, StoreSource, local_store, service_client

        settings = client_settings()
        sig = (settings.database_url, settings.service_url, settings.provider_timeout_s,
               settings.autotune_timeout_s)
        with self._lock:
            if sig == self._made_for:
                return
        store = local_store(settings)
        # A lookup runs in the background: its request may take as long as the call is willing
        # to wait (KS_AUTOTUNE_TIMEOUT_S) before the service counts as down.
        client = service_client(settings, timeout=max(settings.provider_timeout_s,
                                                      settings.autotune_timeout_s))
        # Writes (definitions, records, jobs) run off the call's path: they may take longer than
        # a lookup's bound without failing (a loaded service still takes them).
        writer = service_client(settings, timeout=max(WRITE_TIMEOUT_S, settings.provider_timeout_s))
        sources: list[Any] = [StoreSource(store)] if store is not None else []
        if client is not None:
            sources.append(ServiceSource(client))
        with self._lock:
            old = (self._client, self._writer)
            self._store, self._client, self._writer = store, client, writer
            self.resolver = Resolver(sources, retry_s=settings.autotune_retry_s)
            self._made_for = sig
        for c in old:
            if c is not None:
                c.close()

    def prepare(self) -> None:
        """Import the client and settings and open the store ahead of the first lookup (a
        declaration calls this in the background), so the first call's wait is one request."""
        try:
            self._ensure()
        except Exception as exc:
            log.warning("kernelsearch lookups not prepared: %s", exc)

    def reset(self) -> None:
        """Forget connections and the sources' down state (tests; a changed environment)."""
        with self._lock:
            self._made_for = None
            self.slow_until = 0.0
            self._submitted.clear()
            self._store = self._client = self._writer = None
            self.resolver = Resolver(())

    def _service_up(self) -> bool:
        return self._client is not None and not self.resolver.down("service")

    def _service_failed(self, exc: Exception, retry_s: float) -> None:
        self.resolver.failed("service", exc, retry_s)

    def lookup(self, key: Key, opts: Options, fresh: bool = False,
               near: Near | None = None) -> Found | None:
        """The resolver's answer: exact from the store or the service, else (with `near`, the
        kernel's own distance) the nearest either knows; None when there is none, or none now.
        `fresh`: ask the service itself, not this process's snapshot of its records."""
        self._ensure()
        try:
            return self.resolver.resolve(key, near=near, fresh=fresh, retry_s=opts.retry_s)
        except SourceUnavailable:
            return None

    def lookup_bounded(self, key: Key, opts: Options, near: Near | None = None) -> Found | None:
        """`lookup` waited on for at most `KS_AUTOTUNE_TIMEOUT_S` (not at all while the last
        one ran out of time): the hooks' lookups, which nothing adopts later."""
        self.prepare()
        fut = _in_background(lambda: self.lookup(key, opts, near=near))
        wait = 0.0 if time.monotonic() < self.slow_until else opts.timeout_s
        try:
            return fut.result(timeout=wait)
        except FutureTimeout:
            if wait > 0:
                self.slow_until = time.monotonic() + opts.retry_s
            return None
        except Exception as exc:
            log.warning("config lookup for %s failed: %s", key.kernel, exc)
            return None

    def submit_once(self, key: Key, n_trials: int, opts: Options,
                    capture: Mapping[str, Any] | None = None,
                    definition: Mapping[str, Any] | None = None) -> None:
        """Queue one grid job over the pruned configs for this key (service first, else store);
        an undeclared kernel's job carries its call's `capture`, its `definition` registered first."""
        with self._lock:
            if key in self._submitted:
                return
            self._submitted.add(key)
        self._ensure()
        cases = [key.axes_dict]
        if self._service_up():
            from .client import ClientError

            try:
                if definition is not None:
                    self._writer.register_kernel(definition)
                self._writer.submit_job(key.kernel, cases, n_trials=n_trials, sampler="grid",
                                        capture=capture)
                return
            except ClientError as exc:
                if not 0 < exc.status < 500:
                    self._service_failed(exc, opts.retry_s)
                log.warning("could not queue a tuning job for %s %s: %s", key.kernel, cases, exc)
            except Exception as exc:
                self._service_failed(exc, opts.retry_s)
        if self._store is not None:
            try:
                if definition is not None:
                    self._store.save_definition(key.kernel, dict(definition))  # type: ignore[attr-defined]
                self._store.create_job(key.kernel, cases, n_trials, "grid",  # type: ignore[attr-defined]
                                       capture=dict(capture) if capture is not None else None)
                return
            except Exception as exc:
                log.warning("could not queue a tuning job for %s %s: %s", key.kernel, cases, exc)
        with self._lock:
            self._submitted.discard(key)  # nobody took it: try again on a later lookup

    def upload(self, record: Any, definition: Mapping[str, Any] | None = None) -> bool:
        """Store a record tuned in this process: through the service, else in the local store;
        False when neither took it (or the acceptance gate refused it). An undeclared kernel's
        `definition` is registered first, so the service can gate and serve the record."""
        import socket

        from kernelsearch.search_space.acceptance import RecordRejected, accepted, as_upload

        try:
            record = accepted(as_upload(record, by=None, host=socket.gethostname()))
        except RecordRejected as exc:
            log.warning("the config tuned here for %s is not shared: %s", record.kernel, exc)
            return False
        self._ensure()
        if self._service_up():
            try:
                if definition is not None:
                    self._writer.register_kernel(definition)
                stored = self._writer.upload_record(_record_json(record))
                _stored(record, stored.get("id") if isinstance(stored, Mapping) else None)
                return True
            except Exception as exc:
                log.warning("the service did not take the config tuned here for %s: %s",
                            record.kernel, exc)
        if self._store is not None:
            try:
                if definition is not None:
                    self._store.save_definition(record.kernel, dict(definition))  # type: ignore[attr-defined]
                self._store.ensure_device(record.device_info or {"name": record.device})
                view, _ = self._store.upsert_best(record)
                _stored(record, view.id)
                return True
            except Exception as exc:
                log.warning("could not store the config tuned here for %s: %s", record.kernel, exc)
        return False

    def in_background(self, fn: Callable[[], Any]) -> Future:
        """fn() off the caller's thread, as work the process waits for at exit (`drain`): an
        upload, a share check, a lookup that queues a job."""
        with self._lock:
            self._pending += 1

        def body() -> Any:
            try:
                return fn()
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

        return _in_background(body)

    def upload_in_background(self, record: Any, definition: Mapping[str, Any] | None) -> None:
        """`upload` off the caller's thread; the process waits for it at exit (`drain`)."""
        self.in_background(lambda: self.upload(record, definition))

    def idle(self) -> bool:
        """No background work under way."""
        with self._lock:
            return self._pending == 0

    def drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for background work under way (at exit: a short script that
        tuned a kernel still shares it, and a miss still queues its job)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._pending and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))


def _stored(record: Any, record_id: Any) -> None:
    """Tell kernelsearch.artifacts which record the store made of one tuned here (it uploads the
    compile group of its config beside it)."""
    from kernelsearch import artifacts

    guard.guarded(record.kernel, "sharing the compiled kernel",
                  lambda: artifacts.note_record(record, record_id if isinstance(record_id, int) else None),
                  None)


BACKENDS = Backends()
atexit.register(BACKENDS.drain, 10.0)


def serves_list(found: Found, und: UndeclaredKernel, configs: Sequence[Config]) -> bool:
    """Whether a record may stand for this undeclared kernel's list with nothing measured here:
    tuned on this code, with a timing for every listed config."""
    if found.source_hash not in (None, und.definition.source_hash):
        return False
    return bool(found.timings) and {canonical_key(c) for c in configs} <= set(found.timings or ())


class SourceIdentityError(Exception):
    """A kernel whose source cannot be read has no identity to share a record under."""


def undeclared_kernel(tuner: TritonAutotuner, named: Mapping[str, Any],
                      name: str | None = None) -> UndeclaredKernel:
    """The definition of any Triton autotuned kernel, from a call's named arguments: identity
    (module, qualified name, Triton's JIT cache key), key and dtype arguments; registered, so that
    the store and the service can gate its records (a declared kernel of that name stays)."""
    base = tuner.base_fn
    try:
        source_hash = source_hash_of([_jit_of(tuner)])
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


def launch_alone(tuner: TritonAutotuner, config: Config, args: tuple, kwargs: dict) -> Any:
    """One launch of `config` as Triton's benchmark runs a candidate (the config's and the
    user's hooks, reset_to_zero), touching no state the autotuner shares with calls on other
    threads (its `nargs`, its restore copies): the share check runs in the background."""
    current = dict(kwargs, **config.all_kwargs())
    full = {**dict(zip(tuner.arg_names, args)), **current}
    if config.pre_hook:
        config.pre_hook(full)
    if tuner.user_defined_pre_hook:
        tuner.pre_hook(full)
    for name in tuner.reset_to_zero:
        if full.get(name) is not None:
            full[name].zero_()
    ret = tuner.fn.run(*args, **current)
    if tuner.user_defined_post_hook:
        tuner.post_hook(full, exception=None)
    return ret


def share_tuned(tuner: TritonAutotuner, und: UndeclaredKernel, case: Key, config: Config,
                timings: Mapping[Config, Any], args: tuple, kwargs: dict, first: Config) -> None:
    """Share what this process tuned for an undeclared kernel, once the winner writes what the
    `first` config (after pruning) writes on this call's inputs (every tensor either changes,
    at its dtype's tolerance). Only a copy of the inputs is taken on the call's path: the check
    and the upload run in the background after the call (the process waits for them at exit)."""
    before = _clone_call(args, kwargs) if canonical_key(config) != canonical_key(first) else None
    stream = _stream_of(args)

    def check_and_upload() -> None:
        err = 0.0
        if before is not None:
            try:
                with stream():
                    ref, got = _clone_call(*before), _clone_call(*before)
                    launch_alone(tuner, first, *ref)
                    launch_alone(tuner, config, *got)
            except Exception as exc:
                log.warning("%s: the config tuned here could not be checked (%s); not shared",
                            und.name, exc)
                return
            names = [*tuner.arg_names[:len(args)], *sorted(kwargs)]
            scratch = {i for i, n in enumerate(names) if n in tuner.reset_to_zero}
            err, bad = written_mismatches(_tensors(before), _tensors(ref), _tensors(got), scratch)
            if bad:
                log.warning("%s: the config tuned here (%s) does not write what the first config "
                            "writes (%s); used here, not shared", und.name, config, "; ".join(bad))
                return
        kdef = _knowing_ran(tuner, und, timings)
        BACKENDS.upload(_undeclared_record(kdef, case, config, timings, err, args),
                        kdef.definition.as_json())

    BACKENDS.in_background(lambda: guard.guarded(und.name, "sharing the config tuned here",
                                                 check_and_upload, None))


def _knowing_ran(tuner: TritonAutotuner, und: UndeclaredKernel,
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


def _stream_of(args: tuple) -> Callable[[], Any]:
    """The caller's current CUDA stream of the call's device, taken on the call's path, as a
    context for the background check: it binds that device's primary context to the background
    thread first (a fresh thread has none; Triton's launch binds one itself, but its host-side
    tensor descriptors (TMA) need it bound already), then follows the call's work on its stream.
    A context that does nothing without a CUDA tensor."""
    import contextlib

    device = next((a.device for a in args if getattr(getattr(a, "device", None), "type", "") == "cuda"),
                  None)
    if device is None:
        return contextlib.nullcontext
    import torch

    caller = torch.cuda.current_stream(device)

    @contextlib.contextmanager
    def on_callers_stream() -> Any:
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)  # a runtime call: binds the primary context here
            with torch.cuda.stream(caller):
                yield

    return on_callers_stream


def _record_json(record: Any) -> dict[str, Any]:
    from dataclasses import asdict

    out = asdict(record)
    out["tuned_at"] = record.tuned_at.isoformat()
    return out


def _in_background(fn: Callable[[], Any]) -> Future:
    """Run `fn` in a daemon thread: a lookup stuck in a socket never holds up the caller or exit."""
    fut: Future = Future()

    def body() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            fut.set_exception(exc)

    threading.Thread(target=body, name="ks-autotune-lookup", daemon=True).start()
    return fut


# -- the decorator ---------------------------------------------------------------------------------
@dataclass
class Resolution:
    config: Config
    source: Source
    # A nearest record or a fallback: looked up again every recheck_s until a tuned record lands.
    provisional: bool
    next_check: float = 0.0
    pending: bool = False
    found: Found | None = None
    # A key tuned here: its first launch's compiled kernel was handed to kernelsearch.artifacts.
    noted: bool = False


_forced = threading.local()
# What a config that cannot be built raises, before anything runs (under the interpreter, where
# building is running, its own wrapper of the same checks).
_BUILD_ERRORS: tuple[type[BaseException], ...] = (OutOfResources, PTXASError, CompilationError,
                                                  InterpreterError)
_CAPTURE = object()  # forced "config" that stops a call at its launch with its arguments


class _Captured(Exception):
    """Carries a launch's named arguments out of the user's launcher (`named_args_for`)."""


class Autotuner(TritonAutotuner):
    """Triton's Autotuner (`kernel[grid](...)`, `.configs`, `.best_config`, `.cache`, `.fn`),
    resolving a new key through kernelsearch instead of benchmarking every config here."""

    def __init__(self, fn: Any, arg_names: list[str], configs: list[Config], key: list[str],
                 *args: Any, name: str | None = None,
                 reference: Callable[..., Any] | None = None,
                 search_space: Sequence[Config] | None = None, **kwargs: Any) -> None:
        super().__init__(fn, arg_names, configs, key, *args, **kwargs)
        self.kernel_name = name
        self.reference = reference
        # Configs a worker may search beyond the list (an undeclared kernel's captured calls).
        self.search_space = list(search_space or ())
        for i, c in enumerate(self.search_space):
            if not isinstance(c, Config) or set(c.kwargs) != set(configs[0].kwargs):
                raise ValueError(f"search_space[{i}]: expected a triton.Config setting the "
                                 f"configs' meta-parameters {sorted(configs[0].kwargs)}")
        self.kernel_def: DecoratedKernel | None = None
        self.sources: dict[tuple, Source] = {}
        self._resolved: dict[tuple, Resolution] = {}
        self._lock = threading.RLock()
        self._meta_names = frozenset(k for c in self.configs for k in c.kwargs)
        # An undeclared kernel's definition, made at its first call (its dtypes come from it).
        self.undeclared: UndeclaredKernel | None = None
        self._told: set[str] = set()
        # torch.compile: Dynamo never calls run(); it calls early_config_prune at trace time, so
        # that is where a compiled call resolves its key (`_prune_for_compile`).
        self._user_early_prune: Callable[..., Any] | None = getattr(self, "early_config_prune", None)
        _TUNERS[id(self)] = self
        self.early_config_prune = _prune_for_compile(id(self), tuple(self.keys),
                                                     self._user_early_prune)
        if not self.user_defined_pre_hook and (self.reset_to_zero or self.restore_value):
            self.pre_hook = self._reset_and_save
        if not self.user_defined_post_hook and self.restore_value:
            self.post_hook = self._restore
        from kernelsearch import artifacts  # KS_PREFETCH=1: compiled kernels fetched meanwhile

        guard.guarded(self._name(), "prefetching compiled kernels", artifacts.prefetch_soon, None)

    def served_for_compile(self, ints: tuple, tensors: tuple, nones: tuple) -> int:
        """The index in `configs` of this key's served config (exact, of this code and this
        config list), else -1: torch.compile then tunes every config, as triton.autotune would."""
        import torch

        named: dict[str, Any] = {k: v for k, v in ints}
        named.update({k: None for k in nones})
        for k, dtype, device in tensors:
            named[k] = _TensorMeta(getattr(torch, dtype.removeprefix("torch.")), torch.device(device))
        opts = Options.from_env()
        if self.kernel_def is None:
            _load_declarations()
        case = self.case_key(named)
        if case is None:
            return -1
        found = BACKENDS.lookup_bounded(case, opts)
        res = self._resolution_of(found, opts)
        if res is None or res.provisional or found is None:
            return -1
        und = self.undeclared
        if self.kernel_def is None and und is not None and not serves_list(found, und, self.configs):
            return -1
        key = tuple(v for _, v in ints) + tuple(d for _, d, _ in tensors)
        with self._lock:
            self.sources[key] = res.source
        log.info("%s: torch.compile runs the %s config %s for key %s", self._name(),
                 res.source.value, canonical(res.config), key)
        return next(i for i, c in enumerate(self.configs)
                    if canonical_key(c) == canonical_key(res.config))

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
            return _wallclock_bench
        from triton.runtime.driver import driver

        return driver.active.get_benchmarker()

    # -- the call ------------------------------------------------------------------------------
    def run(self, *args: Any, **kwargs: Any) -> Any:
        forced = getattr(_forced, "configs", {}).get(id(self))
        if forced is not None:
            return self._run_forced(forced, args, kwargs)
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
        from kernelsearch import artifacts

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
                from kernelsearch import artifacts  # its compiled kernel, before the first launch

                artifacts.before_first_launch(self._name(), res.found)
        elif res.provisional and not res.pending and time.monotonic() >= res.next_check:
            guard.guarded(self._name(), "looking a key up again",
                          lambda: self._recheck(key, named, res), None)
        return res

    # -- resolving a new key -----------------------------------------------------------------
    def _resolve(self, key: tuple, named: dict[str, Any], args: tuple, kwargs: dict) -> Resolution:
        opts = Options.from_env()
        if self.kernel_def is None:
            _load_declarations()
        dist = _distributed() if opts.sync is Sync.BROADCAST else None
        if dist is not None and dist.get_rank() != 0:
            return self._from_rank0(dist, None)
        if dist is not None:  # the other ranks wait for rank 0's broadcast: a failure is a miss
            miss: tuple[Key | None, Resolution | None] = (None, None)
            case, res = guard.guarded(self._name(), "resolving a key",
                                      lambda: self._served(key, named, opts, args, kwargs), miss)
        else:
            case, res = self._served(key, named, opts, args, kwargs)
        if res is None:
            self._tell("miss", logging.INFO, "%s: no served config for key %s now: %s",
                       self._name(), key, _POLICY_WHY[opts.fallback])
            res = self._fallback(key, opts, case, args, kwargs)
        if dist is not None:
            return self._from_rank0(dist, res)
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
            res = self._check_served(key, case, res, args, kwargs)
        return case, res

    def _name(self) -> str:
        kdef = self.kernel_def or self.undeclared
        return kdef.name if kdef is not None else self.base_fn.__name__

    def _check_served(self, key: tuple, case: Key, res: Resolution, args: tuple,
                      kwargs: dict) -> Resolution | None:
        """An undeclared kernel's served record, held to this decorator: tuned on this code, and
        over this config list. Configs the record never measured are measured here (only those),
        and the faster of them and the record's wins; None when nothing of it can be used."""
        found, und = res.found, self.undeclared
        if found is None or und is None or res.provisional:
            return res
        if found.source_hash is not None and found.source_hash != und.definition.source_hash:
            self._tell("source", logging.INFO, "%s: the served record was tuned on other code "
                       "(source %s, this %s); tuning here", und.name, found.source_hash,
                       und.definition.source_hash)
            return None
        pruned = self.prune_configs(kwargs)
        by_key = {canonical_key(c): c for c in pruned}
        stored = {k: (math.inf if v is None else float(v))
                  for k, v in (found.timings or {}).items() if k in by_key}
        winner = canonical_key(found.config)
        # A winner from `search_space` (a worker searched beyond the list) is served too, once
        # the record measured the whole list.
        beyond = {canonical_key(c) for c in self.search_space}
        if (winner in by_key or winner in beyond) and len(stored) == len(by_key):
            return res
        if not stored:
            return None  # a record of another config list: not this one's
        missing = [c for k, c in by_key.items() if k not in stored]
        timings: dict[Config, list[float]] = {by_key[k]: [v / 1e3] * 3 for k, v in stored.items()}
        self.configs_timings = timings
        if not missing:
            # The record timed this whole list (its winner is outside it): the fastest listed
            # config by the record's own timings, measured and shared by nobody here.
            best = builtins.min(timings, key=lambda c: timings[c][0])
            return Resolution(best, res.source, provisional=False, found=found)
        t0 = time.time()
        measured = {c: self._bench(*args, config=c, **kwargs) for c in missing}
        self.bench_time = time.time() - t0
        timings.update({c: _quantiles(t) for c, t in measured.items()})
        best = builtins.min(timings, key=lambda c: timings[c][0])
        guard.users(self.pre_hook, {**self.nargs, **kwargs, **best.all_kwargs()}, reset_only=True)
        log.info("%s: measured %d config(s) the served record had not, for key %s", und.name,
                 len(missing), key)
        self._share_undeclared(case, best, timings, args, kwargs, pruned[0])
        source = Source.TUNED_HERE if best in measured else res.source
        return Resolution(best, source, provisional=False)

    def _near(self, case: Key) -> Near | None:
        """The kernel's own "nearest" (`KernelDef.distance`) from this case's axes."""
        kdef = self.kernel_def or self.undeclared
        if kdef is None:
            return None
        axes = case.axes_dict
        return lambda other: kdef.distance(axes, dict(other))

    def _capture(self, kwargs: dict) -> dict[str, Any] | None:
        """This call as data for a worker (kernels.capture), None when it cannot travel."""
        from kernelsearch.kernels.capture import CaptureError, capture_call

        try:
            named = {k: v for k, v in {**(self.nargs or {}), **kwargs}.items()
                     if k in self.arg_names and k not in self._meta_names}
            constexprs = [self.arg_names[i] for i in getattr(_jit_of(self), "constexprs", ())]
            return capture_call(named, constexprs,
                                [c.all_kwargs() for c in [*self.configs, *self.search_space]],
                                kwargs.get("grid")).as_json()
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
        capture = (self._capture(kwargs) if opts.submit_jobs and self.kernel_def is None
                   and opts.fallback is not Fallback.TUNE else None)
        submit = opts.submit_jobs and (self.kernel_def is not None or capture is not None)
        if capture is not None:
            n_trials = len(self.configs) + len(self.search_space)
        # Imports and clients are local work, bounded whatever the service does: done here, so
        # that the hard timeout below is spent on the lookup itself.
        BACKENDS.prepare()

        definition = (self.undeclared.definition.as_json()
                      if capture is not None and self.undeclared else None)

        def task() -> Found | None:
            found = BACKENDS.lookup(case, opts, near=near)
            if submit and (found is None or found.match is not Match.EXACT):
                guard.guarded(case.kernel, "queuing a tuning job",
                              lambda: BACKENDS.submit_once(case, n_trials, opts, capture=capture,
                                                           definition=definition), None)
            return found

        # A lookup that may queue a job is waited for at exit: a short script's miss still
        # queues its tuning.
        fut = BACKENDS.in_background(task) if submit else _in_background(task)
        wait = 0.0 if time.monotonic() < BACKENDS.slow_until else opts.timeout_s
        try:
            found = fut.result(timeout=wait)
        except FutureTimeout:
            if wait > 0:
                BACKENDS.slow_until = time.monotonic() + opts.retry_s
            self._tell("slow", logging.INFO, "%s: the lookup for key %s did not answer within "
                       "KS_AUTOTUNE_TIMEOUT_S=%g s", self._name(), key, opts.timeout_s)
            # Too slow for this call: whatever it finds later is adopted by a later call (unless
            # keys are pinned to their first answer: KS_AUTOTUNE_RECHECK_S=0, or ranks that
            # follow rank 0's broadcast).
            synced = opts.sync is Sync.BROADCAST and _distributed() is not None
            if opts.recheck_s > 0 and not synced:
                fut.add_done_callback(lambda f: self._adopt(key, f, opts))
            return None
        return self._resolution_of(found, opts, ran)

    def _resolution_of(self, found: Found | None, opts: Options,
                       ran: Sequence[Config] = ()) -> Resolution | None:
        """A record as this decorator runs it: a listed config, or one of `ran` (the call's
        pruned list: a pruner may make configs the list lacks); None when it is neither."""
        if found is None:
            return None
        config = to_triton(found.config, self._meta_names, self.configs)
        if config is None and self.kernel_def is None:
            config = next((c for c in ran if canonical_key(c) == canonical_key(found.config)), None)
        if config is None:
            log.info("record for %s does not fit this kernel's meta-parameters: %s",
                     self.kernel_name, found.config)
            return None
        provisional = found.match is not Match.EXACT
        source = Source.NEAREST if provisional else Source(found.source)
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
        synced = opts.sync is Sync.BROADCAST and _distributed() is not None
        if case is None or opts.recheck_s <= 0 or synced:
            res.provisional = False  # pinned: nothing to look up, or ranks must not drift apart
            return
        res.pending = True
        near = self._near(case)
        fut = _in_background(lambda: BACKENDS.lookup(case, opts, fresh=True, near=near))
        fut.add_done_callback(lambda f: self._adopt(key, f, opts))

    def _fallback(self, key: tuple, opts: Options, case: Key | None, args: tuple,
                  kwargs: dict) -> Resolution:
        pruned = self.prune_configs(kwargs)
        if opts.fallback is Fallback.TUNE and len(pruned) > 1:
            config, cached = self._tune_here(key, pruned, args, kwargs)
            if case is not None and self.kernel_def is not None:
                guard.guarded(self._name(), "sharing the config tuned here",
                              lambda: self._share(case, config, len(pruned), args), None)
            elif case is not None and not cached:
                self._share_undeclared(case, config, self.configs_timings, args, kwargs, pruned[0])
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
                          args: tuple, kwargs: dict, first: Config) -> None:
        """Share what this process tuned for an undeclared kernel (`share_tuned`, checked and
        uploaded in the background)."""
        if self.undeclared is not None:
            guard.guarded(self._name(), "sharing the config tuned here",
                          lambda: share_tuned(self, self.undeclared, case, config, timings, args,
                                              kwargs, first), None)

    def _share(self, case: Key, config: Config, n_trials: int, args: tuple) -> None:
        """Store the config tuned here for everyone, once it passes the same gate and is timed
        the same way (CUPTI, cold L2) as a worker's; otherwise this process alone uses it."""
        from kernelsearch.kernels.check import check_config
        from kernelsearch.kernels.measure import measure_config

        kdef = self.kernel_def
        if kdef is None:
            return
        cfg = canonical(config)
        device = next((a.device for a in args if hasattr(a, "device")), None)
        try:
            checked = check_config(kdef, case.axes_dict, cfg, device=device)
            if not checked.ok:
                log.warning("%s: the config tuned here fails the correctness gate (%s); not stored",
                            kdef.name, checked.detail)
                return
            timing = measure_config(kdef, case.axes_dict, cfg, device=device)
        except Exception as exc:
            log.warning("%s: the config tuned here could not be checked: %s", kdef.name, exc)
            return
        BACKENDS.upload(kdef.record_of(case, cfg, timing, checked, n_trials, device))

    def _from_rank0(self, dist: Any, res: Resolution | None) -> Resolution:
        """Rank 0's resolution, broadcast: every rank runs the same config for the key."""
        payload: list[Any] = [None if res is None else (canonical(res.config), res.source.value)]
        dist.broadcast_object_list(payload, src=0)
        cfg, source = payload[0]
        config = to_triton(cfg, self._meta_names, self.configs) or self.configs[0]
        return Resolution(config, Source(source) if res is not None else Source.RANK0,
                          provisional=False)

    # -- forced configs (the tuner's launches) ------------------------------------------------
    def using(self, config: Config | Mapping[str, Any]) -> "_Using":
        """Within the block, every call runs `config` as Triton's benchmark runs a candidate:
        reset_to_zero, restore_value and the pre/post hooks around the launch."""
        if not isinstance(config, Config):
            made = to_triton(config, self._meta_names, self.configs)
            if made is None:
                raise ValueError(f"config: {dict(config)} does not set this kernel's "
                                 f"meta-parameters {sorted(self._meta_names)}")
            config = made
        return _Using(self, config)

    def _run_forced(self, config: Config | object, args: tuple, kwargs: dict) -> Any:
        if config is _CAPTURE:
            raise _Captured({**dict(zip(self.arg_names, args)), **kwargs})
        if not isinstance(config, Config):
            raise TypeError(f"a forced launch needs a triton.Config, got {type(config).__name__}")
        outer = getattr(self, "nargs", None)  # a forced launch may run inside a call's resolution
        self.nargs = dict(zip(self.arg_names, args))
        current = dict(kwargs, **config.all_kwargs())
        full = {**self.nargs, **current}
        try:
            if config.pre_hook:
                config.pre_hook(full)
            self.pre_hook(full)
            try:
                ret = self.fn.run(*args, **current)
            except Exception as exc:
                self.post_hook(full, exception=exc)
                raise
            self.post_hook(full, exception=None)
            self.best_config = config
            self.last_launch = ret
            return ret
        finally:
            self.nargs = outer  # type: ignore[assignment]  # None outside a call, as Triton keeps it

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
    def declare(self, **kw: Any) -> "DecoratedKernel":
        """Build and register this kernel's KernelDef (see `declare`)."""
        kw.setdefault("module", sys._getframe(1).f_globals.get("__name__"))
        return declare(self, **kw)


class _Using:
    def __init__(self, tuner: Autotuner, config: Config | object) -> None:
        self.tuner, self.config = tuner, config

    def __enter__(self) -> Any:
        d = getattr(_forced, "configs", None)
        if d is None:
            d = _forced.configs = {}
        self._prev = d.get(id(self.tuner))
        d[id(self.tuner)] = self.config
        return self.config

    def __exit__(self, *exc: object) -> None:
        d = _forced.configs
        if self._prev is None:
            d.pop(id(self.tuner), None)
        else:
            d[id(self.tuner)] = self._prev


_declarations_loaded = False


def _load_declarations() -> None:
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


_POLICY_WHY = {
    Fallback.TUNE: "tuning here as triton.autotune would, then sharing the result "
                   "(KS_AUTOTUNE_FALLBACK=tune, the default)",
    Fallback.FIRST: "running the first config now (KS_AUTOTUNE_FALLBACK=first)",
    Fallback.NEAREST: "running the nearest served config, else the first, now "
                      "(KS_AUTOTUNE_FALLBACK=nearest)",
}


def _quantiles(t: Any) -> list[float]:
    """A do_bench answer as [median, p20, p80] in ms (a user's do_bench may give one number)."""
    if isinstance(t, (int, float)):
        return [float(t)] * 3
    vals = [float(x) for x in t]
    return (vals + [vals[0]] * 3)[:3]


def _clone_call(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A call's arguments with every tensor cloned (the correctness check writes into these)."""
    def c(v: Any) -> Any:
        return v.clone() if hasattr(v, "clone") and hasattr(v, "dtype") else v

    return tuple(c(a) for a in args), {k: c(v) for k, v in kwargs.items()}


def _tensors(call: tuple[tuple, dict]) -> list[Any]:
    args, kwargs = call
    return [*args, *(kwargs[k] for k in sorted(kwargs))]


def _undeclared_record(und: UndeclaredKernel, case: Key, config: Config,
                       timings: Mapping[Config, Any], rel_error: float, args: tuple) -> Any:
    """The record of a config tuned here: the winner's timing and every config's median."""
    from kernelsearch.db.views import RecordIn
    from kernelsearch.kernels.device import device_info, versions

    q = {c: _quantiles(t) for c, t in timings.items()}
    med, p20, p80 = q[config]
    device = next((a.device for a in args if hasattr(a, "device")), None)
    v = versions()
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    return RecordIn(
        kernel=und.name, axes=case.axes_dict, work=float(work_of(case.axes_dict)),
        device=case.device, device_info=device_info(device), torch_version=v["torch"],
        triton_version=v["triton"], source_hash=und.definition.source_hash,
        config=canonical(config), latency_median_us=med * 1e3,
        latency_min_us=builtins.min(med, p20) * 1e3, latency_max_us=builtins.max(med, p80) * 1e3,
        latency_iqr_us=abs(p80 - p20) * 1e3,
        timing_method="interpreter-wallclock" if interp else "triton-do-bench",
        rel_error=rel_error, n_trials=len(q),
        # A config that failed to build or run here is measured too (None): not measured again.
        config_timings={canonical_key(c): (t[0] * 1e3 if math.isfinite(t[0]) else None)
                        for c, t in q.items()})


def _wallclock_bench(kernel_call: Callable[[], Any], quantiles: Sequence[float] = (0.5, 0.2, 0.8),
                     n: int = 3) -> list[float]:
    kernel_call()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        kernel_call()
        samples.append((time.perf_counter() - t0) * 1e3)
    s = sorted(samples)
    return [statistics.median(s), s[0], s[-1]][:len(quantiles)]


def _distributed() -> Any | None:
    """torch.distributed when a process group of more than one rank is up, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def autotune(configs: list[Config], key: list[str], prune_configs_by: dict | None = None,
             reset_to_zero: list[str] | None = None, restore_value: list[str] | None = None,
             pre_hook: Callable | None = None, post_hook: Callable | None = None,
             warmup: int | None = None, rep: int | None = None, use_cuda_graph: bool = False,
             do_bench: Callable | None = None, cache_results: bool = False, *,
             name: str | None = None,
             reference: Callable[..., Any] | None = None,
             search_space: Sequence[Config] | None = None) -> Callable[[Any], Autotuner]:
    """`triton.autotune` with the same arguments; `name` (the kernel's name in kernelsearch) and
    `reference` (what the correctness gate compares with, instead of the first config) may also
    be given to `declare`. `search_space`: more configs (the same meta-parameters) that workers
    may search besides the list, for a kernel they tune from a call's capture or a declaration;
    this process only ever benchmarks the list."""

    def decorator(fn: Any) -> Autotuner:
        return Autotuner(fn, fn.arg_names, configs, key, reset_to_zero, restore_value,
                         pre_hook=pre_hook, post_hook=post_hook, prune_configs_by=prune_configs_by,
                         warmup=warmup, rep=rep, use_cuda_graph=use_cuda_graph, do_bench=do_bench,
                         cache_results=cache_results, name=name, reference=reference,
                         search_space=search_space)

    return decorator


# -- the KernelDef of a decorated kernel (the one place that adapts to kernels.spec) ---------------
@dataclass(frozen=True, eq=False)
class DecoratedKernel(KernelDef):
    """A KernelDef whose search space is a decorator's list of configs."""

    autotuner: Any = field(default=None, repr=False)
    # Arguments of the Triton kernel whose dtypes the declaration covers (others: not looked up).
    dtypes: Mapping[str, Any] = field(default_factory=dict)
    # The user's own launcher, `launch(*inputs)`, that calls the decorated kernel.
    user_launch: Callable[..., Any] | None = field(default=None, repr=False)

    @property
    def space_configs(self) -> tuple[dict[str, Any], ...]:
        """The searched configs, as records hold them, in the decorator's order (`space`)."""
        return tuple(dict(c) for c in self.space)

    def case_key_of(self, named: Mapping[str, Any]) -> Key | None:
        from kernelsearch.kernels.device import device_name

        axes: dict[str, Any] = {}
        for a in self.axes:
            if a.categorical:  # a dtype axis (`declare(dtypes={arg: [...]})`)
                dt = getattr(named.get(a.name.removesuffix(DTYPE_AXIS_SUFFIX)), "dtype", None)
                name = str(dt).removeprefix("torch.")
                if dt is None or name not in a.choices:
                    return None
                axes[a.name] = name
                continue
            v = named.get(a.name)
            if isinstance(v, bool) or not isinstance(v, int) or not a.minimum <= v <= a.maximum:
                return None
            axes[a.name] = int(v)
        for arg, dtype in self.dtypes.items():
            t = named.get(arg)
            if getattr(t, "dtype", None) != dtype:
                return None
        device = next((t.device for t in named.values() if hasattr(t, "device")), None)
        return Key(self.name, tuple(sorted(axes.items())), device_name(device))

    def configs_for_case(self, axes: Mapping[str, int]) -> list[dict[str, Any]]:
        """The space of one case: the configs the decorator's pruning keeps for its inputs."""
        tuner = self.autotuner
        if tuner._user_early_prune is None and tuner.perf_model is None:
            return [dict(c) for c in self.space_configs]
        named = self.named_args_for(axes)
        tuner.nargs = {k: v for k, v in named.items() if k in tuner.arg_names}
        try:
            extra = {k: v for k, v in named.items() if k not in tuner.arg_names}
            pruned = tuner.prune_configs(extra)
        finally:
            tuner.nargs = None
        keep = {canonical_key(c) for c in pruned}
        out = [dict(c) for c in self.space_configs if canonical_key(c) in keep]
        return out or [dict(c) for c in self.space_configs]

    def named_args_for(self, axes: Mapping[str, int]) -> dict[str, Any]:
        """The Triton kernel's named arguments for a case, captured from one launcher call that
        stops at the launch."""
        if self.user_launch is None:
            raise RuntimeError(f"{self.name}: declared without a launch to capture arguments from")
        inputs = self.empty_inputs(axes, "cpu")
        with _Using(self.autotuner, _CAPTURE):
            try:
                self.user_launch(*inputs)
            except _Captured as got:
                return dict(got.args[0])
        raise RuntimeError(f"{self.name}: the declared launch did not call the kernel")

    def record_of(self, case: Key, config: Mapping[str, Any], timing: Any, checked: Any,
                  n_trials: int, device: Any) -> Any:
        """A record of a config tuned in a user's process: gated and timed as a worker's."""
        from kernelsearch.db.store import RecordIn
        from kernelsearch.kernels.device import device_info, versions

        v = versions()
        return RecordIn(
            kernel=self.name, axes=case.axes_dict, work=float(self.bytes_moved(case.axes_dict)),
            device=case.device, device_info=device_info(device), torch_version=v["torch"],
            triton_version=v["triton"], source_hash=self.source_hash, config=dict(config),
            latency_median_us=timing.median_us, latency_min_us=timing.min_us,
            latency_max_us=timing.max_us, latency_iqr_us=timing.iqr_us,
            timing_method=timing.method, rel_error=checked.max_error, n_trials=n_trials,
            study_name="tuned-here")


def _as_cases(cases: Iterable[Any], axis_names: Sequence[str]) -> tuple[Case, ...]:
    out = []
    for i, c in enumerate(cases, start=1):
        if isinstance(c, Case):
            out.append(c)
            continue
        axes = dict(c) if isinstance(c, Mapping) else dict(zip(axis_names, c))
        if set(axes) != set(axis_names):
            raise ValueError(f"cases[{i - 1}]: expected axes {list(axis_names)}, got {axes}")
        out.append(Case(number=i, axes={k: int(v) for k, v in axes.items()}))
    return tuple(out)


# The @triton.jit function under the decorator (its JIT cache key is the source identity).
_jit_of = jit_function_of


def declare(tuner: Autotuner, *, name: str | None = None, launch: Callable[..., Any],
            make_inputs: Callable[..., Sequence[Any]], axes: Sequence[str | Axis],
            input_names: Sequence[str], output_names: Sequence[str],
            bytes_moved: Callable[[Mapping[str, int]], int], rtol: float,
            cases: Iterable[Any] = (), reference: Callable[..., Any] | None = None,
            torch_reference: Callable[..., Any] | None = None,
            axes_of: Callable[..., Mapping[str, int]] | None = None,
            check_inputs: Callable[..., None] | None = None,
            flops: Callable[[Mapping[str, int]], int] | None = None,
            dtypes: Mapping[str, Any] | None = None,
            output_dtypes: Callable[[Mapping[str, int]], Sequence[Any]] | None = None,
            tolerance: Callable[[Mapping[str, int]], float] | None = None,
            search_space: Sequence[Config] | None = None,
            description: str = "", benchmark_problem: str = "",
            register: bool = True, module: str | None = None) -> DecoratedKernel:
    """The KernelDef of a decorated kernel, registered so that a worker importing the calling
    module tunes it. `launch(*inputs)` is the user's own function that calls the kernel;
    `make_inputs(axes, seed=, distribution=, device=)` draws a case's inputs; `reference(*inputs)`
    gives the outputs to compare with (default: the first config's); `axes` name arguments of the
    Triton kernel whose values key a record; `dtypes` the tensor arguments' dtypes it covers (a
    list of dtypes for an argument makes a categorical axis `<arg>.dtype`, so one declaration
    serves each of them);
    `search_space` what a worker searches (default: the decorator's configs); `module` the
    module a worker imports to see the declaration (default: the caller's)."""
    if not isinstance(tuner, Autotuner):
        raise TypeError(f"declare() takes a @kernelsearch.autotune kernel, got {type(tuner).__name__}")
    kname = name or tuner.kernel_name or f"{tuner.base_fn.__module__}.{tuner.base_fn.__name__}"
    axis_defs = tuple(a if isinstance(a, Axis) else Axis(str(a), 1, MAX_AXIS) for a in axes)
    for a in axis_defs:
        if a.name not in tuner.arg_names:
            raise ValueError(f"axes: {a.name!r} is not an argument of {tuner.base_fn.__name__} "
                             f"({', '.join(tuner.arg_names)})")
    # dtypes: one dtype per argument (calls of other dtypes are not this declaration's), or a
    # list of them: a categorical axis `<arg>.dtype`, so one declaration keys each dtype's record.
    fixed_dtypes: dict[str, Any] = {}
    for arg, dt in (dtypes or {}).items():
        if arg not in tuner.arg_names:
            raise ValueError(f"dtypes: {arg!r} is not an argument of {tuner.base_fn.__name__}")
        if isinstance(dt, (list, tuple)):
            if not dt:
                raise ValueError(f"dtypes: {arg!r} lists no dtype")
            axis_defs += (Axis(dtype_axis(arg), doc=f"dtype of {arg}",
                               choices=tuple(str(d).removeprefix("torch.") for d in dt)),)
        else:
            fixed_dtypes[arg] = dt
    space = [canonical(c) for c in (search_space or [*tuner.configs, *tuner.search_space])]
    if not space:
        raise ValueError("search_space: give at least one triton.Config")
    # Every config names the same launch options, so that the kernel's validated (complete)
    # form of a config is the listed one.
    opts = [o for o in LAUNCH_OPTIONS if any(o in c for c in space)]
    space = [{**c, **{o: c.get(o, LAUNCH_DEFAULTS[o]) for o in opts}} for c in space]
    module = module or sys._getframe(1).f_globals.get("__name__", launch.__module__)
    first = tuner.configs[0]
    ref_fn = reference or tuner.reference

    def kd_launch(*inputs: Any, config: Mapping[str, Any], out: Sequence[Any] | None = None) -> tuple:
        with tuner.using(config):
            got = launch(*inputs)
        runtime_of(kdef).last_compiled = getattr(tuner, "last_launch", None)
        outs = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        if out is not None:
            for o, g in zip(out, outs):
                o.copy_(g)
            return tuple(out)
        return outs

    def first_config_reference(*inputs: Any) -> tuple:
        outs = kd_launch(*[t.clone() for t in inputs], config=canonical(first))
        return tuple(o.double() for o in outs)

    def kd_reference(*inputs: Any) -> tuple:
        if ref_fn is None:
            return first_config_reference(*inputs)
        got = ref_fn(*inputs)
        outs = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        return tuple(o.double() for o in outs)

    def kd_torch_reference(*inputs: Any) -> tuple:
        got = torch_reference(*inputs) if torch_reference is not None else ()
        return tuple(got) if isinstance(got, (tuple, list)) else (got,)

    def kd_axes_of(*inputs: Any) -> dict[str, int]:
        if axes_of is None:
            raise NotImplementedError(f"{kname}: the declaration gives no axes_of")
        return dict(axes_of(*inputs))

    kd_launch.__module__ = module
    kdef = DecoratedKernel(
        name=kname, description=description or (tuner.base_fn.__doc__ or "").strip().split("\n")[0],
        benchmark_problem=benchmark_problem, axes=axis_defs, params=params_from_configs(space),
        cases=_as_cases(cases, [a.name for a in axis_defs]), input_names=tuple(input_names),
        output_names=tuple(output_names), rtol=float(rtol), make_inputs=make_inputs,
        reference=kd_reference if ref_fn is not None else first_config_reference,
        # No torch_reference, no speedups: timing the float64 reference instead says nothing.
        torch_reference=kd_torch_reference if torch_reference is not None else None, launch=kd_launch, axes_of=kd_axes_of,
        bytes_moved=bytes_moved, check_inputs=check_inputs or (lambda *i: None),
        rules=configs_rule(space), autotuner=tuner, space=tuple(space),
        triton_kernels=(_jit_of(tuner),),
        dtypes=fixed_dtypes, flops=flops, user_launch=launch, output_dtypes=output_dtypes,
        tolerance=tolerance)
    tuner.kernel_name = kname
    tuner.kernel_def = kdef
    if Options.from_env().prepare:
        _in_background(BACKENDS.prepare)
    if register:
        from kernelsearch.kernels.registry import register as reg

        reg(kdef, replace=True)
    return kdef
