"""The read paths' machinery: the /v1/best answer cache, time bounds on the database, and the
stores they read through.

Lookups are the hot path and must answer within KS_LOOKUP_TIMEOUT_S even while the database is
slow or gone: answers are kept ready to send (a hit is served whatever the database does), the
database is asked in a thread of the lookups' own pool that is abandoned at the bound, and
lookups get their own connection pool. The other read routes (jobs, records, the dashboard,
/metrics) ask the database in threads of another pool, waited on for KS_READ_TIMEOUT_S: neither
kind can take the other's threads, nor the server's shared pool.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

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


class ReadTimeout(dberr.StoreUnavailable):
    """The database did not answer a read route within KS_READ_TIMEOUT_S (answered 503)."""


class BoundedPool:
    """Threads of their own for one kind of database call, each call waited on for at most a
    bound. Past it the caller gets `timeout_error` (a 503) and the thread is left to the
    database's statement timeout; a call still queued behind busy threads is dropped."""

    def __init__(self, name: str, threads: int, timeout_error: type[dberr.StoreUnavailable],
                 setting: str) -> None:
        self.name = name
        self.threads = threads
        self.timeout_error = timeout_error
        self.setting = setting
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.threads,
                                                thread_name_prefix=f"ks-{self.name}")
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        fut = asyncio.get_running_loop().run_in_executor(self._executor, call)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise self.timeout_error(f"database unavailable: no answer within {timeout_s:g} s "
                                     f"({self.setting})") from None

    def close(self) -> None:
        """Stop the threads (a call still running is not waited for); the next run() starts
        others, so an app can be started again."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


# The read pool and bound of the app serving the current request (set by app.py's middleware),
# so code below the routers (the dashboard's pages) reads through it without taking the app.
current_reads: contextvars.ContextVar[tuple[BoundedPool, float] | None] = contextvars.ContextVar(
    "ks_current_reads", default=None)


async def run_read(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) (a read of the database) in the read pool, bounded by KS_READ_TIMEOUT_S:
    ReadTimeout (a 503 with Retry-After) past it. Outside a request: the shared thread pool."""
    reads = current_reads.get()
    if reads is None:
        return await run_in_threadpool(fn, *args)
    pool, timeout_s = reads
    return await pool.run(fn, *args, timeout_s=timeout_s)


class BestCache:
    """Answers of /v1/best by (kernel, device, axes, match), dropped whenever records change.

    The store's records_version() is read at most every `check_s` seconds (not per request); this
    process's own writes call invalidate(). A check that fails (the database refuses) or hangs
    leaves the entries as they are: hits keep answering from them, marked stale (fresh() raises,
    the route serves the hit anyway), and a miss answers 503. A slow check is waited on for at
    most the caller's bound and then left to finish in the background; no second check starts
    while it runs, and after STALE_S seconds of it fresh() raises LookupTimeout.
    """

    MAX_ENTRIES = 50_000
    STALE_S = 10.0

    def __init__(self, store: RecordRepository, check_s: float) -> None:
        self.store = store
        self.check_s = check_s
        self.entries: dict[tuple, tuple[int, bytes, str]] = {}
        self.version: int | None = None
        self.checked = float("-inf")
        self.confirmed = float("-inf")  # when the entries were last known to be current
        self.error: Exception | None = None
        self._pending: tuple[asyncio.Future[int], float] | None = None  # (future, started) of a slow check
        self._executor: ThreadPoolExecutor | None = None

    def invalidate(self) -> None:
        self.entries.clear()
        self.checked = float("-inf")

    async def fresh(self, timeout_s: float | None = None) -> bool:
        """Make sure entries are not older than `check_s`: True when they are known current,
        False while a slow check runs (they may be stale); StoreUnavailable while the database
        refuses, or once a check has hung for STALE_S.

        A check that takes longer than `timeout_s` leaves the entries as they are (hits answer
        from them; a miss waits on the database itself, bounded too)."""
        if self._pending is not None:
            fut, started = self._pending
            if not fut.done():
                if time.monotonic() - started > self.STALE_S:
                    raise LookupTimeout(f"database unavailable: no answer for {self.STALE_S:g} s")
                return False
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
                return False
            except dberr.StoreUnavailable as exc:
                self.error = exc
                raise
            self._apply(version)
        elif self.error is not None:
            raise self.error
        return True

    def age(self) -> float:
        """Seconds since the entries were last known current (inf: never)."""
        return time.monotonic() - self.confirmed

    def _apply(self, version: int) -> None:
        self.error = None
        self.confirmed = time.monotonic()
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


async def bounded(fn: Callable[..., Any], *args: Any, timeout_s: float | None,
                  pool: BoundedPool | None = None) -> Any:
    """fn(*args) in a thread of `pool` (the lookups' own), given up (LookupTimeout) after
    `timeout_s`: the thread is abandoned, and the database's own statement and lock timeouts
    end its query later. Without a pool or a bound: the shared thread pool, unbounded."""
    if timeout_s is None or pool is None:
        return await run_in_threadpool(fn, *args)
    return await pool.run(fn, *args, timeout_s=timeout_s)


def lookup_store(settings: Settings) -> Store:
    """The store /v1/best and /healthz read through: its own connection pool (lookups never
    queue behind the worker's or the other routes' connections), and server-side timeouts a
    little past KS_LOOKUP_TIMEOUT_S, so an abandoned lookup frees its connection soon."""
    from kernelsearch.db.store import Store

    t = settings.lookup_timeout_s
    return Store(settings.database_url, statement_timeout_ms=max(1000, int(3000 * t)),
                 lock_timeout_ms=max(500, int(2000 * t)), pool_timeout_s=t)


def read_store(settings: Settings) -> Store:
    """The store of every other route (jobs, records, the dashboard, /metrics, writes): a
    PostgreSQL statement timeout of KS_STATEMENT_TIMEOUT_S on each connection, so a read the
    route stopped waiting for (KS_READ_TIMEOUT_S) frees its thread and connection soon after."""
    from kernelsearch.db.store import Store

    ms = int(1000 * settings.statement_timeout_s) if settings.statement_timeout_s else None
    return Store(settings.database_url, statement_timeout_ms=ms, pool_timeout_s=settings.read_timeout_s)
