"""The user program's backends, shared by every decorated kernel and hook: the resolver (the local
store, then the service), the writer, job submission, uploads, background work and its drain at exit."""
from __future__ import annotations

import atexit
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Callable, Mapping

from kernelsearch.kernels.resolve import Found, Key, Near, Resolver, SourceUnavailable

from .options import Options

if TYPE_CHECKING:
    from kernelsearch.db.interfaces import RecordRepository

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 10.0


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
        from kernelsearch.service.settings import client_settings
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
        fut = in_daemon_thread(lambda: self.lookup(key, opts, near=near))
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
            from .rest_client import ClientError

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
                self._writer.upload_record(_record_json(record))
                return True
            except Exception as exc:
                log.warning("the service did not take the config tuned here for %s: %s",
                            record.kernel, exc)
        if self._store is not None:
            try:
                if definition is not None:
                    self._store.save_definition(record.kernel, dict(definition))  # type: ignore[attr-defined]
                self._store.ensure_device(record.device_info or {"name": record.device})
                self._store.upsert_best(record)
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

        return in_daemon_thread(body)

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


BACKENDS = Backends()
atexit.register(BACKENDS.drain, 10.0)


def _record_json(record: Any) -> dict[str, Any]:
    from dataclasses import asdict

    out = asdict(record)
    out["tuned_at"] = record.tuned_at.isoformat()
    return out


def in_daemon_thread(fn: Callable[[], Any]) -> Future:
    """Run `fn` in a daemon thread: a lookup stuck in a socket never holds up the caller or exit."""
    fut: Future = Future()

    def body() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            fut.set_exception(exc)

    threading.Thread(target=body, name="ks-autotune-lookup", daemon=True).start()
    return fut
