"""kernelsearch.helion: Helion's autotune cache kept by kernelsearch, so a kernel Helion tuned once
(on any host) is served to every later process instead of tuned again for minutes.

    HELION_AUTOTUNE_CACHE=RemoteAutotuneCache
    HELION_REMOTE_CACHE_BACKEND=kernelsearch.helion.KernelsearchBackend
    KS_SERVICE_URL=http://host:8000  KS_API_TOKEN=...   # unset: the local store (KS_DATABASE_URL)

Helion builds the backend with no arguments, for every kernel it tunes; it therefore uses the
process's one backends object (`kernelsearch.backends`: the service's client, else the local
store, and their back-off). It runs inside the user's program: each call is bounded by
KS_HELION_TIMEOUT_S, a failed service is left alone for KS_AUTOTUNE_RETRY_S, and any fault is a
miss (`get` None, `list` empty, `put` dropped), never an error or a wait past the bound. Entries
are shown on the dashboard's /helion page.

KS_HELION_ON_MISS=default (with a service): a miss queues a worker's tuning of the call
(search_space/helion_job.py; a worker tunes it) and answers Helion's default config, so no user process tunes.
"""
from __future__ import annotations

import inspect
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, TypeVar

from helion.autotuner.remote_cache import RemoteCacheBackend

from kernelsearch.db.statuses import JobStatus

from . import guard
from .backends import BACKENDS

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = ["KernelsearchBackend"]


def _call(what: str, fn: Callable[[], T], default: T) -> T:
    """fn() through the backends' one bounded call, waited on for KS_HELION_TIMEOUT_S at most;
    `default` on a fault, a time-out or while the way to the entries (the service, else the
    local store) is being left alone. A put that outlives its bound is drained at exit."""
    from kernelsearch.service.client_settings import client_settings

    try:
        BACKENDS.ensure()
        wait_s = client_settings().helion_timeout_s
    except Exception as exc:
        log.warning("kernelsearch.helion: not configured (%s)", exc)
        return default
    source = "service" if BACKENDS.client is not None else "store"
    if not BACKENDS.up(source):
        return default
    fut = BACKENDS.bounded(fn, wait_s, keep=what == "put", source=source)
    if not fut.done():
        return default
    try:
        return fut.result()
    except Exception as exc:
        from kernelsearch.db.errors import Conflict
        from kernelsearch.search_space.acceptance import RecordRejected

        from .rest_client import ClientError

        # The local store's Conflict: a worker's entry under the key, which an upload never replaces.
        if isinstance(exc, (RecordRejected, Conflict)) or (isinstance(exc, ClientError) and 0 < exc.status < 500):
            log.warning("kernelsearch.helion: %s refused: %s", what, exc)  # this entry, not the service
        else:
            BACKENDS.failed(source, exc)
        return default


def _caller(kind: type) -> Any:
    """The Helion object of that kind (its cache, or its search) whose method called the backend,
    when one did: it names the kernel, its arguments, its device and the autotuner's settings,
    which Helion's key and entry text do not all hold."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return None
        obj = frame.f_locals.get("self")
        if isinstance(obj, kind):
            return obj
        frame = frame.f_back
    return None


def _hardware(search: Any) -> str | None:
    """The hardware Helion's warm start matches entries on (None: any)."""
    try:
        hw = search._get_current_hardware_and_specialization()[0]
        return hw if isinstance(hw, str) and hw else None
    except Exception:
        return None


def _kernel_facts(cache: Any) -> tuple[str | None, list[str] | None, bool | None]:
    """(module.qualname, the tensor arguments' names in call order, whether Helion's accuracy
    check was on) of the kernel a cache object tunes; None for what it does not show."""
    if cache is None:
        return None, None, None
    try:
        import torch

        fn = cache.kernel.kernel.fn
        module = fn.__module__
        if module == "__main__":  # a script: named by its file, as `python -m` would import it
            module = os.path.splitext(os.path.basename(fn.__code__.co_filename))[0]
        params = list(inspect.signature(fn).parameters)
        names = [n for n, a in zip(params, cache.args) if isinstance(a, torch.Tensor)]
        checked = getattr(cache.autotuner.settings, "autotune_accuracy_check", None)
        return f"{module}.{fn.__qualname__}", names, checked if isinstance(checked, bool) else None
    except Exception:  # a Helion whose objects look otherwise: the entry is named by its source hash
        return None, None, None


_warned_local = False


def _miss_cache(key: str) -> Any:
    """Under KS_HELION_ON_MISS=default: the Helion cache object asking for `key`, found in the
    caller's thread (Helion's frames are there), whose call a miss captures and queues; None
    when a miss is to tune as Helion does (the setting, no service to queue on, a worker's own
    tuning, no such caller)."""
    global _warned_local
    try:
        from kernelsearch.search_space.helion_job import tuning_here
        from kernelsearch.service.client_settings import client_settings

        st = client_settings()
        if st.helion_on_miss != "default" or tuning_here():
            return None
        if not st.service_url:
            if not _warned_local:
                _warned_local = True
                log.warning("kernelsearch.helion: KS_HELION_ON_MISS=default needs a service "
                            "(KS_SERVICE_URL) whose workers tune; with the local store only, a miss "
                            "tunes here")
            return None
        from helion.autotuner.base_cache import AutotuneCacheBase

        cache = _caller(AutotuneCacheBase)
        if cache is None or getattr(cache, "key", None) is None or cache.key.stable_hash() != key:
            return None
        return cache
    except Exception as exc:  # noqa: BLE001 - a miss that cannot be queued tunes as before
        _not_queued(exc)
        return None


def _not_queued(exc: Exception) -> None:
    log.warning("kernelsearch.helion: this miss is tuned here, not queued (%s: %s)",
                type(exc).__name__, exc)


# A lookup's answer: (the entry's text, whether it is the stored entry); a miss or a fault.
_MISS: tuple[str | None, bool] = (None, False)


def _compiled_kernels(bound: Any) -> list[Any]:
    """kernels.compiled.helion_handles: the compiled kernels of the bound kernel's config here."""
    from kernelsearch.kernels import compiled

    return compiled.helion_handles(bound)


def _key_doc(cache: Any) -> dict[str, Any]:
    """Helion's key as its local cache writes it in an entry."""
    return {"type": type(cache.key).__name__, "fields": {k: str(v) for k, v in vars(cache.key).items()}}


def _job_capture(cache: Any, key: str) -> dict[str, Any]:
    """The job's capture of a cache's call (search_space/helion_job.py reads it)."""
    import torch

    from kernelsearch.kernels.capture import capture_args
    from kernelsearch.search_space.helion_job import KIND, SETTINGS, VERSION

    name, _, checked = _kernel_facts(cache)
    fn = cache.kernel.kernel.fn
    if name is None:
        raise ValueError("the kernel's module and name are not visible")
    params = list(inspect.signature(fn).parameters)
    args = capture_args(dict(zip(params, cache.args)))
    devices = [a.device.type for a in cache.args if isinstance(a, torch.Tensor)]
    if not devices:
        raise ValueError("the call has no tensor argument to take its device from")
    settings = {}
    for s in SETTINGS:
        v = getattr(cache.autotuner.settings, s, None)
        try:
            if json.loads(json.dumps(v)) == v:
                settings[s] = v
        except (TypeError, ValueError):
            continue
    return {"kind": KIND, "version": VERSION, "key": key,
            "module": name[: -len(fn.__qualname__) - 1], "qualname": fn.__qualname__,
            "args": [a.as_json() for a in args], "device": devices[0], "settings": settings,
            "key_type": type(cache.key).__name__, "key_fields": _key_doc(cache)["fields"],
            "checked": checked}


def _default_entry(cache: Any) -> str:
    """An entry text holding Helion's default config for the bound kernel, in the shape Helion's
    local cache writes (RemoteAutotuneCache reads its `config`, then writes it locally)."""
    config = cache.kernel.config_spec.default_config()
    return json.dumps({"config": config.to_json(), "key": _key_doc(cache)}, indent=2)


def _entry_of(key: str, data: str) -> bool:
    """Whether an entry's text is the one Helion asked for: its own key fields hash to `key` as
    Helion computes it. Anything else (a forged or mangled entry) is a miss, never loaded."""
    from kernelsearch.search_space.acceptance import RecordRejected, helion_entry_key

    try:
        if helion_entry_key(data) == key:
            return True
    except RecordRejected:
        pass
    log.warning("kernelsearch.helion: the entry served under %s is not that key's (its own key "
                "fields hash otherwise): not loaded, a miss", key[:12])
    return False


class KernelsearchBackend(RemoteCacheBackend):
    """Helion's `RemoteCacheBackend` over kernelsearch: `HELION_REMOTE_CACHE_BACKEND=
    kernelsearch.helion.KernelsearchBackend` with `HELION_AUTOTUNE_CACHE=RemoteAutotuneCache`."""

    def get(self, key: str) -> str | None:
        """The exact text stored under Helion's cache key; None on a miss or any fault. Under
        KS_HELION_ON_MISS=default a miss the service answered queues a worker's tuning of the
        call and answers Helion's default config, which Helion then runs without tuning."""
        text, served = guard.guarded(f"helion entry {key[:12]}", "Helion's cache lookup",
                                     lambda: self._get(key), _MISS)
        if served:  # Helion compiles the entry's config next: its compiled kernel first
            from . import artifacts

            artifacts.before_helion_compile(key)
        return text

    def put(self, key: str, data: str) -> None:
        """Store Helion's entry text under its key; dropped (logged) on any fault."""
        guard.guarded(f"helion entry {key[:12]}", "sharing Helion's entry",
                      lambda: self._put(key, data), None)

    def list(self, max_results: int | None = None) -> Iterable[str]:
        """The newest entries' texts, newest first, of the calling search's hardware when it
        shows one (Helion's warm start keeps those of its hardware and specialization); empty on
        any fault."""
        return guard.guarded("helion", "listing Helion's entries", lambda: self._list(max_results),
                             [])

    def _get(self, key: str) -> tuple[str | None, bool]:
        """(the entry's text or None, whether it is the stored entry, not a miss's default)."""
        c = BACKENDS
        cache = _miss_cache(key)

        def fetch() -> tuple[str | None, bool]:
            if c.client is not None:
                got = c.client.helion_get(key)
                if got is not None and _entry_of(key, str(got["data"])):
                    return str(got["data"]), True
                if cache is None:
                    return None, False
                try:  # only on a miss: a hit costs no capture
                    capture, default = _job_capture(cache, key), _default_entry(cache)
                except Exception as exc:  # noqa: BLE001 - not the service's fault: no back-off
                    _not_queued(exc)
                    return None, False
                job = c.client.helion_queue(key, capture)
                if job.get("status") == JobStatus.FAILED:
                    log.warning("kernelsearch.helion: no entry for %s (%s) and its job %s failed (%s); "
                                "running Helion's default config", capture["qualname"], key[:12],
                                job.get("id"), job.get("error"))
                else:
                    log.info("kernelsearch.helion: no entry for %s (%s); running Helion's default "
                             "config while job %s tunes it", capture["qualname"], key[:12], job.get("id"))
                return default, False
            assert c.store is not None  # `_call` asks only a configured way
            entry = c.store.get_helion_entry(key)
            if entry is not None and _entry_of(key, entry.data):
                return entry.data, True
            return None, False

        return _call("get", fetch, _MISS)

    def _put(self, key: str, data: str) -> None:
        from helion.autotuner.base_cache import AutotuneCacheBase

        cache = _caller(AutotuneCacheBase)
        kernel, arg_names, checked = _kernel_facts(cache)
        c = BACKENDS

        def store() -> None:
            if c.client is not None:
                assert c.writer is not None  # made with the client
                c.writer.helion_put(key, data, kernel=kernel, arg_names=arg_names, checked=checked)
                return
            from kernelsearch.search_space.acceptance import accepted_helion

            assert c.store is not None
            c.store.put_helion_entry(accepted_helion(key, data, kernel=kernel, arg_names=arg_names,
                                                     checked=checked, host=socket.gethostname()))

        _call("put", store, None)
        if cache is not None:  # Helion compiles the stored config next: share what it compiles
            from . import artifacts

            artifacts.note_helion_put(key, lambda: _compiled_kernels(cache.kernel))

    def _list(self, max_results: int | None = None) -> Iterable[str]:
        from helion.autotuner.base_search import BaseSearch

        limit = 100 if max_results is None else max(1, min(int(max_results), 1000))
        hardware = _hardware(_caller(BaseSearch))
        c = BACKENDS

        def fetch() -> list[str]:
            if c.client is not None:
                return [str(e["data"]) for e in c.client.helion_list(limit, hardware=hardware)]
            assert c.store is not None
            return [e.data for e in c.store.list_helion_entries(limit, hardware=hardware)]

        return _call("list", fetch, [])
