"""The lookup path's machinery: the /v1/best answer cache, time bounds on the database, and the
store lookups read through.

Lookups are the hot path and must answer within KS_LOOKUP_TIMEOUT_S even while the database is
slow or gone: answers are kept ready to send, the database is asked in a worker thread that is
abandoned at the bound, and lookups get their own connection pool.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import anyio
from fastapi.concurrency import run_in_threadpool

from kernelsearch.db import errors as dberr
from kernelsearch.db.interfaces import RecordRepository

from .settings import Settings

if TYPE_CHECKING:
    from kernelsearch.db.store import Store

# How long a cache hit waits on a slow version check before answering from the entries it has.
HIT_WAIT_S = 0.2


class LookupTimeout(dberr.StoreUnavailable):
    """The database did not answer a lookup within KS_LOOKUP_TIMEOUT_S (answered 503)."""


class BestCache:
    """Answers of /v1/best by (kernel, device, axes), dropped whenever records change.

    The store's records_version() is read at most every `check_s` seconds (not per request); this
    process's own writes call invalidate(). While the database is unreachable the cache answers
    503 like every other route, until a check succeeds again. While it is reachable but slow (a
    lock, a stalled server), a check is waited on for at most the caller's bound and then left
    to finish in the background; the entries keep answering for up to STALE_S seconds of that.
    """

    MAX_ENTRIES = 50_000
    STALE_S = 10.0

    def __init__(self, store: RecordRepository, check_s: float) -> None:
        self.store = store
        self.check_s = check_s
        self.entries: dict[tuple, tuple[int, bytes, str]] = {}
        self.version: int | None = None
        self.checked = float("-inf")
        self.error: Exception | None = None
        self._pending: tuple[asyncio.Future[int], float] | None = None  # (future, started) of a slow check
        self._executor: ThreadPoolExecutor | None = None

    def invalidate(self) -> None:
        self.entries.clear()
        self.checked = float("-inf")

    async def fresh(self, timeout_s: float | None = None) -> None:
        """Make sure entries are not older than `check_s`; raise StoreUnavailable while down.

        A check that takes longer than `timeout_s` leaves the entries as they are (hits answer
        from them; a miss waits on the database itself, bounded too), and no second check
        starts while it runs."""
        if self._pending is not None:
            fut, started = self._pending
            if not fut.done():
                if time.monotonic() - started > self.STALE_S:
                    raise LookupTimeout(f"database unavailable: no answer for {self.STALE_S:g} s")
                return
            self._pending = None
            if fut.exception() is None:
                self._apply(fut.result())
            else:
                self.checked = float("-inf")  # a check we stopped waiting for failed: ask again
        now = time.monotonic()
        if now - self.checked >= self.check_s:
            self.checked = now
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="ks-records-version")
            fut = asyncio.get_running_loop().run_in_executor(self._executor, self.store.records_version)
            try:
                version = await asyncio.wait_for(asyncio.shield(fut), timeout_s)
            except TimeoutError:
                self._pending = (fut, now)
                return
            except dberr.StoreUnavailable as exc:
                self.error = exc
                raise
            self._apply(version)
        elif self.error is not None:
            raise self.error

    def _apply(self, version: int) -> None:
        self.error = None
        if version != self.version:
            self.entries.clear()
            self.version = version

    def put(self, key: tuple, value: tuple[int, bytes, str]) -> None:
        if len(self.entries) >= self.MAX_ENTRIES:
            self.entries.clear()
        self.entries[key] = value

    def close(self) -> None:
        """Stop the version-check thread (a check still running is not waited for); the next
        fresh() starts another, so an app can be started again."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self._pending = None


async def bounded(fn: Callable[..., Any], *args: Any, timeout_s: float | None) -> Any:
    """fn(*args) in a worker thread, given up (LookupTimeout) after `timeout_s`: the thread is
    abandoned, and the database's own statement and lock timeouts end its query later."""
    if timeout_s is None:
        return await run_in_threadpool(fn, *args)
    try:
        with anyio.fail_after(timeout_s):
            return await anyio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)
    except TimeoutError:
        raise LookupTimeout(f"database unavailable: no answer within {timeout_s:g} s "
                            "(KS_LOOKUP_TIMEOUT_S)") from None


def lookup_store(settings: Settings) -> Store:
    """The store /v1/best and /healthz read through: its own connection pool (lookups never
    queue behind the worker's or the other routes' connections), and server-side timeouts a
    little past KS_LOOKUP_TIMEOUT_S, so an abandoned lookup frees its connection soon."""
    from kernelsearch.db.store import Store

    t = settings.lookup_timeout_s
    return Store(settings.database_url, statement_timeout_ms=max(1000, int(3000 * t)),
                 lock_timeout_ms=max(500, int(2000 * t)), pool_timeout_s=t)
