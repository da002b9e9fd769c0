"""The user program's one backends object (`BACKENDS`), built once from the client settings (again
only when they change) and used by the decorator, `get_kernel`'s provider, the Triton cache
manager and the Helion backend alike: the one resolver (the local store, then the service), the
local store, the writer, the one back-off (the resolver's: a source that fails or does not answer
within a call's bound is left alone for KS_AUTOTUNE_RETRY_S), the one bounded call, job
submission and uploads, and the one drain of background work at exit."""
from __future__ import annotations

import atexit
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Callable, Mapping

from kernelsearch.kernels.resolve import Found, Key, Near, Resolver, SourceUnavailable

if TYPE_CHECKING:
    from kernelsearch.db.interfaces import ServiceStore
    from kernelsearch.service.client_settings import ClientSettings

    from .rest_client import Client

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 10.0


class Backends:
    """The user program's resolver and its writes, shared by every decorated kernel and hook.
    The resolver is one object for the process (its sources change with the settings), so an
    outage seen by one caller is known to all; jobs are submitted at most once per key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ensure_lock = threading.Lock()
        self.resolver = Resolver(())
        self.store: ServiceStore | None = None
        self.client: Client | None = None  # lookups: bounded by the caller's wait
        self.writer: Client | None = None  # writes: off the caller's path, a longer bound
        self._made_for: tuple | None = None
        self._submitted: set[Key] = set()
        self._warned: set[str] = set()  # warnings given once per settings (`warn_once`)
        self._pending = 0  # background work the process waits for at exit (`drain`)
        self._threads: list[threading.Thread] = []  # its threads, joined by `drain`
        self._idle = threading.Condition(self._lock)
        # Told (record, its id in the store or None) of each record stored from this process
        # (`kernelsearch.artifacts` uploads the compile group of its config beside it).
        self.stored_listeners: list[Callable[[Any, int | None], None]] = []

    def ensure(self, settings: ClientSettings | None = None) -> None:
        """Build the backends from `settings` (default: the environment's client settings)
        unless they are built for the same ones already."""
        with self._ensure_lock:
            self._ensure_locked(settings)

    def _ensure_locked(self, settings: ClientSettings | None) -> None:
        from kernelsearch.service.client_settings import client_settings

        from kernelsearch.service.sources import StoreSource

        from .sources import ServiceSource, local_store, service_client

        st = settings if settings is not None else client_settings()
        secret = st.api_token or st.read_token
        token = secret.get_secret_value() if secret else None
        sig = (st.database_url, st.service_url, token, st.provider_timeout_s,
               st.autotune_timeout_s, st.helion_timeout_s, st.autotune_retry_s)
        with self._lock:
            if sig == self._made_for:
                return
        store = local_store(st)
        # A lookup runs in the background: its request may take as long as its caller is willing
        # to wait (KS_AUTOTUNE_TIMEOUT_S, KS_PROVIDER_TIMEOUT_S, KS_HELION_TIMEOUT_S) before the
        # service counts as down.
        client = service_client(st, timeout=max(st.provider_timeout_s, st.autotune_timeout_s,
                                                st.helion_timeout_s))
        # Writes (definitions, records, jobs, Helion's entries) run off the call's path: they may
        # take longer than a lookup's bound without failing (a loaded service still takes them).
        writer = service_client(st, timeout=max(WRITE_TIMEOUT_S, st.provider_timeout_s))
        sources: list[Any] = [StoreSource(store)] if store is not None else []
        if client is not None:
            sources.append(ServiceSource(client))
        with self._lock:
            old = (self.client, self.writer, self.store)
            self.store, self.client, self.writer = store, client, writer
            self.resolver.sources = tuple(sources)
            self.resolver.retry_s = st.autotune_retry_s
            self.resolver.reset()
            self._made_for = sig
            self._warned.clear()
        for c in old:
            if c is not None:
                c.close()
        say_where_results_go(st, store is not None, client is not None)

    def prepare(self) -> None:
        """Import the client and settings and open the store ahead of the first lookup (a
        declaration calls this in the background), so the first call's wait is one request."""
        try:
            self.ensure()
        except Exception as exc:
            log.warning("kernelsearch lookups not prepared: %s", exc)

    def reset(self) -> None:
        """Forget connections and the sources' down state (tests; a changed environment), once
        the background work under way has ended: an upload begun for the old store or service
        must not land in the new one."""
        self.drain(30.0)
        with self._lock:
            self._made_for = None
            self._submitted.clear()
            self.store = self.client = self.writer = None
            self.resolver.sources = ()
            self.resolver.reset()

    def warn_once(self, what: str, message: str) -> None:
        """One WARNING of kind `what` for these settings: a cause every write would repeat."""
        with self._lock:
            if what in self._warned:
                return
            self._warned.add(what)
        log.warning("%s", message)

    def refused(self, exc: Exception) -> bool:
        """Whether `exc` is the service refusing this program's writer token (said once, with
        the fix); the caller then falls back to the local store as for any refusal."""
        from .rest_client import Unauthorized

        if not isinstance(exc, Unauthorized):
            return False
        self.warn_once("token", f"the service refused this program's writer token ({exc}): "
                                "configs tuned here and jobs are not shared; set KS_API_TOKEN to "
                                "the service's KS_API_TOKEN")
        return True

    # -- the one back-off ---------------------------------------------------------------------
    def remote(self) -> str | None:
        """The source a caller's bound waits on: the service when there is one (a local store
        that is slow is still asked; one that fails is left alone by the resolver itself)."""
        return "service" if self.client is not None else None

    def up(self, source: str) -> bool:
        """Whether `source` ("service", "store") is configured and not being left alone."""
        there = self.client if source == "service" else self.store
        return there is not None and not self.resolver.down(source)

    def failed(self, source: str, why: object) -> None:
        """Leave `source` alone for KS_AUTOTUNE_RETRY_S (every caller of this process)."""
        self.resolver.failed(source, why if isinstance(why, BaseException) else RuntimeError(str(why)))

    # -- the one bounded call -----------------------------------------------------------------
    def bounded(self, fn: Callable[[], Any], wait_s: float, *, keep: bool = False,
                source: str | None = None) -> Future:
        """fn() off the caller's thread, waited on for at most `wait_s` (`keep`: the process
        waits for it at exit). The future is returned done, or not done when time ran out: the
        source waited on (`source`, default `remote()`) is then left alone (`failed`): while it
        is, lookups answer from the other sources and from what it already told."""
        fut = self.in_background(fn) if keep else in_daemon_thread(fn)
        try:
            fut.result(timeout=wait_s)
        except FutureTimeout:
            blame = source or self.remote()
            if wait_s > 0 and blame is not None:  # 0: never waited, nothing was slow
                self.failed(blame, f"no answer within {wait_s:g} s")
        except Exception:  # noqa: BLE001 - the caller reads it from the future
            pass
        return fut

    # -- lookups ------------------------------------------------------------------------------
    def lookup(self, key: Key, fresh: bool = False, near: Near | None = None) -> Found | None:
        """The resolver's answer: exact from the store or the service, else (with `near`, the
        kernel's own distance) the nearest either knows; None when there is none, or none now.
        `fresh`: ask the service itself, not this process's snapshot of its records."""
        self.ensure()
        try:
            return self.resolver.resolve(key, near=near, fresh=fresh)
        except SourceUnavailable:
            return None

    def lookup_bounded(self, key: Key, wait_s: float, near: Near | None = None) -> Found | None:
        """`lookup` waited on for at most `wait_s` (KS_AUTOTUNE_TIMEOUT_S): the hooks' lookups,
        which nothing adopts later."""
        self.prepare()
        fut = self.bounded(lambda: self.lookup(key, near=near), wait_s)
        if not fut.done():
            return None
        try:
            return fut.result()
        except Exception as exc:
            log.warning("config lookup for %s failed: %s", key.kernel, exc)
            return None

    # -- writes -------------------------------------------------------------------------------
    def submit_once(self, key: Key, n_trials: int, capture: Mapping[str, Any] | None = None,
                    definition: Mapping[str, Any] | None = None) -> None:
        """Queue one grid job over the pruned configs for this key (service first, else the
        local store through the routes' own acceptance, `accept_job`); an undeclared kernel's
        job carries its call's `capture`, its `definition` registered first. A job refused (by
        the service or the local acceptance) is not queued, and not asked for again."""
        with self._lock:
            if key in self._submitted:
                return
            self._submitted.add(key)
        self.ensure()
        cases = [key.axes_dict]
        if self.writer is not None and self.up("service"):
            from .rest_client import ClientError

            try:
                if definition is not None:
                    self.writer.register_kernel(definition)
                self.writer.submit_job(key.kernel, cases, n_trials=n_trials, sampler="grid",
                                       capture=capture)
                return
            except ClientError as exc:
                if self.refused(exc):
                    return
                if 0 < exc.status < 500:  # the service's own refusal: final
                    log.warning("tuning job for %s %s refused: %s", key.kernel, cases, exc)
                    return
                self.failed("service", exc)
            except Exception as exc:
                self.failed("service", exc)
        if self.store is not None:
            from kernelsearch.kernels import registry
            from kernelsearch.kernels.definitions import define
            from kernelsearch.service.client_settings import job_limits
            from kernelsearch.search_space.job_acceptance import JobRefused, accept_job

            try:
                if definition is not None:
                    define(self.store, definition)
                accept_job(self.store, job_limits(), registry.get_kernel(key.kernel), cases,
                           n_trials, "grid", capture=capture)
                return
            except JobRefused as exc:
                log.warning("tuning job for %s %s refused: %s", key.kernel, cases, exc)
                return
            except Exception as exc:
                log.warning("could not queue a tuning job for %s %s: %s", key.kernel, cases, exc)
        with self._lock:
            self._submitted.discard(key)  # nobody took it: try again on a later lookup

    def keep_capture(self, key: Key, capture: Mapping[str, Any]) -> None:
        """Keep the call of a key this process tuned and shared (its definition registered by
        the upload), so a search of the key has it: the service first (POST /v1/captures), else
        the local store, through the routes' own acceptance (`accept_capture`). A refusal (a
        module the workers do not trust, a call beyond the bounds) is logged, never retried."""
        if self.writer is not None and self.up("service"):
            from .rest_client import ClientError

            try:
                self.writer.keep_capture(key.kernel, capture)
                return
            except ClientError as exc:
                if 0 < exc.status < 500:
                    log.info("the call of %s %s is not kept for a search: %s", key.kernel,
                             key.axes_dict, exc)
                    return
                self.failed("service", exc)
            except Exception as exc:
                self.failed("service", exc)
        if self.store is not None:
            from kernelsearch.kernels import registry
            from kernelsearch.service.client_settings import job_limits
            from kernelsearch.search_space.job_acceptance import JobRefused, accept_capture

            try:
                accept_capture(self.store, job_limits(), registry.get_kernel(key.kernel), capture)
            except JobRefused as exc:
                log.info("the call of %s %s is not kept for a search: %s", key.kernel,
                         key.axes_dict, exc)
            except Exception as exc:
                log.warning("could not keep the call of %s %s: %s", key.kernel, key.axes_dict, exc)

    def upload(self, record: Any, definition: Mapping[str, Any] | None = None) -> bool:
        """Store a record tuned in this process: through the service, else in the local store;
        False when neither took it (or the acceptance gate refused it). An undeclared kernel's
        `definition` is registered first, so the service can gate and serve the record."""
        import socket

        from kernelsearch.search_space.acceptance import RecordRejected, accepted, as_upload

        try:
            gated = accepted(as_upload(record, by=None, host=socket.gethostname()))
        except RecordRejected as exc:
            log.warning("the config tuned here for %s is not shared: %s", record.kernel, exc)
            return False
        record = gated.value
        self.ensure()
        if self.writer is not None and self.up("service"):
            try:
                if definition is not None:
                    self.writer.register_kernel(definition)
                stored = self.writer.upload_record(_record_json(record))
                self._stored(record, stored.get("id") if isinstance(stored, Mapping) else None)
                return True
            except Exception as exc:
                if not self.refused(exc):
                    log.warning("the service did not take the config tuned here for %s: %s",
                                record.kernel, exc)
        if self.store is not None:
            try:
                if definition is not None:
                    from kernelsearch.kernels.definitions import define

                    define(self.store, definition)
                self.store.ensure_device(record.device_info or {"name": record.device})
                view, _ = self.store.upsert_best(gated)
                self._stored(record, view.id)
                return True
            except Exception as exc:
                log.warning("could not store the config tuned here for %s: %s", record.kernel, exc)
        return False

    def _stored(self, record: Any, record_id: Any) -> None:
        from . import guard

        rid = record_id if isinstance(record_id, int) else None
        for listen in list(self.stored_listeners):
            guard.guarded(record.kernel, "after storing the record", lambda: listen(record, rid), None)

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

        fut = in_daemon_thread(body)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(fut.thread)
        return fut

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
            threads, self._threads = self._threads, []
        # Then their threads' ends: a thread past its work still frees what the work held (a
        # share check's tensors, in torch's C++); a daemon thread doing so when the interpreter
        # finalises aborts the process ("terminate called without an active exception").
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._threads[:0] = [t for t in threads if t.is_alive()]


def say_where_results_go(st: ClientSettings, have_store: bool, have_service: bool) -> None:
    """One WARNING, when the settings change, for a result with nowhere to go: no service and no
    local store, or a local store named that does not exist; each says the fix."""
    import os

    from .sources import sqlite_path

    path = sqlite_path(st.database_url)
    missing = path is not None and not os.path.exists(path)
    if not have_store and not have_service:
        where = (f"the local store {path} does not exist" if missing
                 else "no local store answers")
        log.warning("kernelsearch: configs tuned here have nowhere to go, and lookups find none "
                    "(%s and KS_SERVICE_URL is unset): set KS_SERVICE_URL to a service, or "
                    "create the store with `KS_DATABASE_URL=%s kernelsearch db upgrade`", where,
                    st.database_url)
    elif missing and "KS_DATABASE_URL" in os.environ:
        log.warning("kernelsearch: KS_DATABASE_URL names %s, which does not exist: only the "
                    "service is used; create it with `kernelsearch db upgrade`, or unset "
                    "KS_DATABASE_URL", path)


BACKENDS = Backends()
atexit.register(BACKENDS.drain, 10.0)


def _record_json(record: Any) -> dict[str, Any]:
    from dataclasses import asdict

    out = asdict(record)
    out["tuned_at"] = record.tuned_at.isoformat()
    return out


class ThreadFuture(Future):
    """A Future with the daemon thread that runs its work (`Backends.drain` joins it)."""

    thread: threading.Thread


def in_daemon_thread(fn: Callable[[], Any]) -> ThreadFuture:
    """Run `fn` in a daemon thread: a lookup stuck in a socket never holds up the caller or exit."""
    fut = ThreadFuture()

    def body() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            fut.set_exception(exc)

    fut.thread = threading.Thread(target=body, name="kernelsearch-backends", daemon=True)
    fut.thread.start()
    return fut
