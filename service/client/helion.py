"""kernelsearch.helion: Helion's autotune cache kept by kernelsearch, so a kernel Helion tuned once
(on any host) is served to every later process instead of tuned again for minutes.

    HELION_AUTOTUNE_CACHE=RemoteAutotuneCache
    HELION_REMOTE_CACHE_BACKEND=kernelsearch.helion.KernelsearchBackend
    KS_SERVICE_URL=http://host:8000  KS_API_TOKEN=...   # unset: the local store (KS_DATABASE_URL)

Helion builds the backend with no arguments, for every kernel it tunes; this module therefore
keeps its connection and the service's down state per process. It runs inside the user's
program: each call is bounded by KS_HELION_TIMEOUT_S, a failed service is left alone for
KS_AUTOTUNE_RETRY_S, and any fault is a miss (`get` None, `list` empty, `put` dropped), never an
error or a wait past the bound. Entries are shown on the dashboard's /helion page.

KS_HELION_ON_MISS=default (with a service): a miss queues a worker's tuning of the call
(service/helion_jobs.py) and answers Helion's default config, so no user process tunes.
"""
from __future__ import annotations

import atexit
import inspect
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, TypeVar

from helion.autotuner.remote_cache import RemoteCacheBackend

from . import guard

log = logging.getLogger(__name__)
T = TypeVar("T")
LEFT_BEHIND_S = 10.0  # how long a request the caller stopped waiting for may still run

__all__ = ["KernelsearchBackend"]


class _Connection:
    """This process's way to the entries (the service's client, else the local store), made
    again when the settings change, and the time until which it is left alone after a fault."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made_for: tuple | None = None
        self.client: Any = None
        self.store: Any = None
        self.timeout_s = 2.0
        self.retry_s = 30.0
        self.down_until = 0.0
        self._pending: set[threading.Thread] = set()

    def ensure(self) -> None:
        from kernelsearch.service.settings import client_settings

        st = client_settings()
        token = st.api_token.get_secret_value() if st.api_token else None
        sig = (st.service_url, st.database_url, token, st.helion_timeout_s, st.autotune_retry_s)
        with self._lock:
            if sig == self._made_for:
                return
            if self.client is not None:
                self.client.close()
            if self.store is not None:
                self.store.close()
            self.timeout_s, self.retry_s, self.down_until = st.helion_timeout_s, st.autotune_retry_s, 0.0
            if st.service_url:
                from kernelsearch.rest_client import Client

                # The caller waits helion_timeout_s; a request left behind (a put) may finish later.
                self.client = Client(st.service_url, token=token, timeout=max(st.helion_timeout_s, LEFT_BEHIND_S))
                self.store = None
            else:
                from kernelsearch.sources import local_store

                self.client, self.store = None, local_store(st)
            self._made_for = sig

    def reset(self) -> None:
        """Forget the connection and the down state (tests; a changed environment)."""
        with self._lock:
            self._made_for, self.client, self.store, self.down_until = None, None, None, 0.0

    def call(self, what: str, fn: Callable[[], T], default: T) -> T:
        """fn() in a daemon thread, waited on for the bound at most; `default` on a fault, a
        time-out or while the service is left alone."""
        try:
            self.ensure()
        except Exception as exc:
            log.warning("kernelsearch.helion: not configured (%s)", exc)
            return default
        if time.monotonic() < self.down_until or (self.client is None and self.store is None):
            return default
        box: list[Any] = []

        def body() -> None:
            try:
                box.append((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - reported to the caller below
                box.append((False, exc))

        t = threading.Thread(target=body, name=f"ks-helion-{what}", daemon=True)
        t.start()
        t.join(self.timeout_s)
        if not box:
            if what == "put":  # still under way: the process waits for it at exit (drain)
                with self._lock:
                    self._pending.add(t)
            self._failed(what, f"no answer within {self.timeout_s:g} s")
            return default
        ok, value = box[0]
        if ok:
            return value
        from kernelsearch.db.errors import Conflict
        from kernelsearch.search_space.acceptance import RecordRejected
        from kernelsearch.rest_client import ClientError

        # The local store's Conflict: a worker's entry under the key, which an upload never replaces.
        if isinstance(value, (RecordRejected, Conflict)) or (isinstance(value, ClientError) and 0 < value.status < 500):
            log.warning("kernelsearch.helion: %s refused: %s", what, value)  # this entry, not the service
        else:
            self._failed(what, value)
        return default

    def drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` in all for puts that outlived their bound (at exit: a script
        that tuned a kernel still shares it, as the decorator's uploads do)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            pending, self._pending = list(self._pending), set()
        for t in pending:
            t.join(max(0.0, deadline - time.monotonic()))

    def _failed(self, what: str, why: object) -> None:
        log.warning("kernelsearch.helion: %s failed (%s); not asked again for %g s", what, why, self.retry_s)
        with self._lock:
            self.down_until = time.monotonic() + self.retry_s


CONNECTION = _Connection()
atexit.register(CONNECTION.drain, 10.0)


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
        from kernelsearch.service.helion_jobs import tuning_here
        from kernelsearch.service.settings import client_settings

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


def _key_doc(cache: Any) -> dict[str, Any]:
    """Helion's key as its local cache writes it in an entry."""
    return {"type": type(cache.key).__name__, "fields": {k: str(v) for k, v in vars(cache.key).items()}}


def _job_capture(cache: Any, key: str) -> dict[str, Any]:
    """The job's capture of a cache's call (service/helion_jobs.py reads it)."""
    import torch

    from kernelsearch.kernels.capture import capture_args
    from kernelsearch.service.helion_jobs import KIND, SETTINGS, VERSION

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
        return guard.guarded(f"helion entry {key[:12]}", "Helion's cache lookup",
                             lambda: self._get(key), None)

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

    def _get(self, key: str) -> str | None:
        c = CONNECTION
        cache = _miss_cache(key)

        def fetch() -> str | None:
            if c.client is not None:
                got = c.client.helion_get(key)
                if got is not None and _entry_of(key, str(got["data"])):
                    return str(got["data"])
                if cache is None:
                    return None
                try:  # only on a miss: a hit costs no capture
                    capture, default = _job_capture(cache, key), _default_entry(cache)
                except Exception as exc:  # noqa: BLE001 - not the service's fault: no back-off
                    _not_queued(exc)
                    return None
                job = c.client.helion_queue(key, capture)
                if job.get("status") == "failed":
                    log.warning("kernelsearch.helion: no entry for %s (%s) and its job %s failed (%s); "
                                "running Helion's default config", capture["qualname"], key[:12],
                                job.get("id"), job.get("error"))
                else:
                    log.info("kernelsearch.helion: no entry for %s (%s); running Helion's default "
                             "config while job %s tunes it", capture["qualname"], key[:12], job.get("id"))
                return default
            entry = c.store.get_helion_entry(key)
            return entry.data if entry is not None and _entry_of(key, entry.data) else None

        return c.call("get", fetch, None)

    def _put(self, key: str, data: str) -> None:
        from helion.autotuner.base_cache import AutotuneCacheBase

        kernel, arg_names, checked = _kernel_facts(_caller(AutotuneCacheBase))
        c = CONNECTION

        def store() -> None:
            if c.client is not None:
                c.client.helion_put(key, data, kernel=kernel, arg_names=arg_names, checked=checked)
                return
            from kernelsearch.search_space.acceptance import accepted_helion

            c.store.put_helion_entry(accepted_helion(key, data, kernel=kernel, arg_names=arg_names,
                                                     checked=checked, host=socket.gethostname()))

        c.call("put", store, None)

    def _list(self, max_results: int | None = None) -> Iterable[str]:
        from helion.autotuner.base_search import BaseSearch

        limit = 100 if max_results is None else max(1, min(int(max_results), 1000))
        hardware = _hardware(_caller(BaseSearch))
        c = CONNECTION

        def fetch() -> list[str]:
            if c.client is not None:
                return [str(e["data"]) for e in c.client.helion_list(limit, hardware=hardware)]
            return [e.data for e in c.store.list_helion_entries(limit, hardware=hardware)]

        return c.call("list", fetch, [])
