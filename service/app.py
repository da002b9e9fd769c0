"""The FastAPI app: kernels, best-config lookups, records, the job queue, the dashboard, metrics.

`create_app()` builds what the routes share (stores, lookup cache, metrics, the writers' token)
once, into `app.state`, where routers/ read it through deps.py; `kernelsearch serve` runs it
under uvicorn. The database is the only state shared between processes: jobs are rows a worker
claims, records are rows a lookup reads (through an in-process cache that notices changes via
records_version()).
"""
from __future__ import annotations

import asyncio
from importlib import metadata
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from kernelsearch.db import errors as dberr
from kernelsearch.db.engine import check_schema
from kernelsearch.db.interfaces import ServiceStore

from . import errors
from .definitions import load_definitions
from .errors import redact
from .deps import WriterToken
from .lookups import (BestCache, BoundedPool, LookupTimeout, ReadTimeout, current_reads, lookup_store,
                      read_store)
from .metrics import Metrics
from .routers import (artifacts, best, dashboard, definitions, health, helion, jobs, kernels, metrics,
                      records, search)
from .settings import Settings, get_settings
from .strict_input import BodyLimit, StrictJSON, TrustedHost, query_text

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")


def create_app(settings: Settings | None = None, *, store: ServiceStore | None = None,
               start_worker: bool = False, worker_process: bool = False,
               trusted_hosts: frozenset[str] | None = None,
               schema_checked: bool = False) -> FastAPI:
    """The API over `store` (default: a Store on settings.database_url with a statement timeout,
    and another with its own pool and timeouts for lookups; both closed when the app stops).

    With trusted_hosts (`serve` on a loopback address), any other Host header is refused 400.

    With start_worker, a WorkerRunner claims and tunes jobs for as long as the app runs: in a
    thread (its new records invalidate the lookup cache at once), or with worker_process in a
    `kernelsearch worker` child process (restarted if it dies).
    Startup refuses a database whose schema is not this code's (db.errors.SchemaBehind), unless
    schema_checked says the caller (`serve`) did that already.
    """
    settings = settings or get_settings()
    own_store = store is None
    if store is None:
        store = read_store(settings)
    lookups = lookup_store(settings) if own_store else store

    # FastAPIOffline: /docs and /redoc load their scripts from the installed package, not a CDN.
    app = FastAPIOffline(
        title="kernelsearch",
        version=metadata.version("kernelsearch"),
        summary="Best Triton kernel configs per workload case and device, and a tuning job queue.",
        lifespan=_lifespan(own_store, start_worker, worker_process, schema_checked),
        dependencies=[Depends(query_text)],
        # Not `model`: that would file the schema under an HTML route's own media type.
        responses={"4XX": {"description": "the request was refused (one shape for every 4xx)",
                           "content": {"application/json": {"schema": {
                               "$ref": "#/components/schemas/Message"}}}}},
    )
    errors.install(app)
    app.state.settings = settings
    app.state.store = store
    app.state.lookups = lookups
    app.state.metrics = Metrics(count_jobs=lambda status: store.count_jobs(status=status),
                                count_trials=store.count_job_trials)
    app.state.best_cache = BestCache(lookups, settings.records_check_seconds)
    app.state.writer_token = (settings.api_token.get_secret_value().encode()
                              if settings.api_token else None)
    app.state.worker = None
    app.state.embedded_worker = start_worker
    app.state.lookup_pool = BoundedPool("lookups", settings.lookup_threads, LookupTimeout,
                                        "KS_LOOKUP_TIMEOUT_S")
    app.state.read_pool = BoundedPool("reads", settings.read_threads, ReadTimeout,
                                      "KS_READ_TIMEOUT_S")

    app.add_middleware(StrictJSON)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,
                       larger={p: settings.artifact_max_bytes * 4 // 3 + 65536
                               for p in ("/v1/artifacts", "/v1/helion/entries/[^/]+/artifacts")})
    app.add_middleware(WriterToken)  # outside the body's checks: a 401 before any 413/422
    app.add_middleware(ReadBound, pool=app.state.read_pool, timeout_s=settings.read_timeout_s)
    if settings.cors_origins:  # outside the checks above, so their refusals carry CORS headers too
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    if trusted_hosts is not None:
        app.add_middleware(TrustedHost, allowed=trusted_hosts)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    for router in (health.router, artifacts.router, kernels.router, definitions.router, best.make_router(),
                   records.router, helion.router,
                   jobs.router, search.router, metrics.router, dashboard.router):
        app.include_router(router)
    _document_as_served(app)
    return app


# JSON Schema's names for the bounds pydantic leaves under its own (a validated int's ge/le).
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}
# What query_text lets through: no control character in any query parameter.
QUERY_TEXT_PATTERN = "^[^\\x00-\\x1f\\x7f]*$"


def _document_as_served(app: FastAPI) -> None:
    """The OpenAPI document as the app behaves: the HTML pages' refusals are their own 4xx page
    (text/html) or the JSON shape when the refusal comes before the page (a bad path argument);
    a query parameter's text has no control characters (query_text); an integer parameter's
    bounds are JSON Schema's minimum/maximum."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        for ops in schema.get("paths", {}).values():
            for op in ops.values():
                if not isinstance(op, dict):
                    continue
                for param in op.get("parameters", ()):
                    _document_parameter(param)
                responses = op.get("responses", {})
                if "text/html" not in responses.get("200", {}).get("content", {}):
                    continue
                for code, resp in responses.items():
                    if code.startswith("4"):
                        resp.setdefault("content", {})["text/html"] = {"schema": {"type": "string"}}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document_parameter(param: dict[str, Any]) -> None:
    schema = param.get("schema", {})
    for sub in [schema, *schema.get("anyOf", ())]:
        for ours, theirs in _BOUNDS.items():
            if ours in sub:
                sub[theirs] = sub.pop(ours)
        items = sub.get("items")
        for text in (sub, items if isinstance(items, dict) else {}):  # a repeated parameter too
            if param.get("in") == "query" and text.get("type") == "string" and "enum" not in text:
                text.setdefault("pattern", QUERY_TEXT_PATTERN)


def _lifespan(own_store: bool, start_worker: bool, worker_process: bool,
              schema_checked: bool) -> Any:
    """Check the schema (unless the caller did), run the embedded worker if asked, and at the end
    stop it and close what create_app opened."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        try:
            if not schema_checked:
                await run_in_threadpool(_check_schema, state.store)
            await run_in_threadpool(load_definitions, state.store)
        except dberr.StoreUnavailable as exc:
            # Serve anyway: every route answers 503 until the database is back.
            log.warning("starting without the database: %s", redact(str(exc)))
        launcher = _start_worker(state, own_store, worker_process) if start_worker else None
        state.worker = launcher
        try:
            yield
        finally:
            if launcher is not None:
                # The worker ends its trial first, its job handed back.
                await asyncio.to_thread(launcher.stop)
            state.best_cache.close()
            state.lookup_pool.close()
            state.read_pool.close()
            if own_store:
                state.lookups.close()
                state.store.close()

    return lifespan


def _start_worker(state: Any, own_store: bool, worker_process: bool) -> Any:
    """The embedded worker's launcher, started: a `kernelsearch worker` child, or a thread
    sharing this process and so told of each record it writes."""
    if worker_process:
        from .worker_process import WorkerProcess

        return WorkerProcess(state.settings).start()
    from .worker_runner import WorkerRunner, WorkerThread

    # Its own pool: a tuning job's writes never hold the connections lookups need.
    runner = WorkerRunner(state.settings, store=None if own_store else state.store,
                          metrics=state.metrics, on_records_changed=state.best_cache.invalidate)
    return WorkerThread(runner).start()


class ReadBound:
    """Pure ASGI middleware: the request's database reads (lookups.run_read) go to this app's
    read pool, each waited on for at most KS_READ_TIMEOUT_S."""

    def __init__(self, app: Any, pool: BoundedPool, timeout_s: float) -> None:
        self.app = app
        self.reads = (pool, timeout_s)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        token = current_reads.set(self.reads)
        try:
            await self.app(scope, receive, send)
        finally:
            current_reads.reset(token)


def _check_schema(store: Any) -> None:
    engine = getattr(store, "engine", None)
    if engine is None:
        from kernelsearch.db.engine import make_engine

        engine = make_engine(store.url)
    check_schema(engine)
