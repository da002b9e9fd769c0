"""The REST API: kernels, best-config lookups, records, the job queue, the dashboard and metrics.

`create_app()` builds the app from settings; `kernelsearch serve` runs it under uvicorn. The
database is the only state shared between processes: jobs are rows a worker claims, records are
rows a lookup reads (through an in-process cache that notices changes via records_version()).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, AsyncIterator, Callable, Mapping

from fastapi import Depends, FastAPI, HTTPException, Path as PathParam, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from kernelsearch import kernels
from kernelsearch.db import errors as dberr
from kernelsearch.db.engine import check_schema
from kernelsearch.db.store import RecordDoc
from kernelsearch.kernels.device import versions as kernel_versions

from . import errors, schemas
from .metrics import Metrics
from .settings import Settings, get_settings
from .strict_input import AsciiInt, StrictJSON, parse_case_axes, query_text, replaying

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
_ERRORS = {400: {"model": schemas.Message}, 404: {"model": schemas.Message},
           422: {"model": schemas.Message}, 503: {"model": schemas.Message}}
_WRITE_ERRORS = {**_ERRORS, 401: {"model": schemas.Message}, 409: {"model": schemas.Message},
                 413: {"model": schemas.Message}, 429: {"model": schemas.Message}}
JOB_ID = PathParam(ge=1, le=2**31 - 1, description="a job's id")
HIT_WAIT_S = 0.2
_URL_CREDENTIALS = re.compile(r"(\w+://[^:/@\s]+):[^@\s]*@")


def redact(text: str) -> str:
    """Drop passwords from database URLs quoted in messages and logs."""
    return _URL_CREDENTIALS.sub(r"\1:***@", text)


# -- body size limit ------------------------------------------------------------------------------
class BodyLimit:
    """Pure ASGI middleware: a request body over `max_bytes` is answered 413 before any parsing."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(scope, send, 400, "Content-Length is not a number")
                    return
                if declared > self.max_bytes:
                    await self._reject(scope, send, 413, self._too_big())
                    return
        messages = []
        size = 0
        while True:
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break
            size += len(msg.get("body", b""))
            if size > self.max_bytes:
                await self._reject(scope, send, 413, self._too_big())
                return
            if not msg.get("more_body", False):
                break
        await self.app(scope, replaying(messages, receive), send)

    def _too_big(self) -> str:
        return f"request body larger than {self.max_bytes} bytes (KS_MAX_BODY_BYTES)"

    @staticmethod
    async def _reject(scope: dict, send: Callable, status: int, detail: str) -> None:
        resp = errors.error_response(status, detail)
        await resp(scope, _no_receive, send)


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}


# -- /v1/best cache -------------------------------------------------------------------------------
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

    def __init__(self, store: Any, check_s: float) -> None:
        self.store = store
        self.check_s = check_s
        self.entries: dict[tuple, tuple[int, bytes, str]] = {}
        self.version: int | None = None
        self.checked = float("-inf")
        self.error: Exception | None = None
        self._pending: tuple[Any, float] | None = None  # (future, started) of a slow check
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ks-records-version")

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


class LookupTimeout(dberr.StoreUnavailable):
    """The database did not answer a lookup within KS_LOOKUP_TIMEOUT_S (answered 503)."""


async def bounded(fn: Callable[..., Any], *args: Any, timeout_s: float | None) -> Any:
    """fn(*args) in a worker thread, given up (LookupTimeout) after `timeout_s`: the thread is
    abandoned, and the database's own statement and lock timeouts end its query later."""
    import anyio

    if timeout_s is None:
        return await run_in_threadpool(fn, *args)
    try:
        with anyio.fail_after(timeout_s):
            return await anyio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)
    except TimeoutError:
        raise LookupTimeout(f"database unavailable: no answer within {timeout_s:g} s "
                            "(KS_LOOKUP_TIMEOUT_S)") from None


def lookup_store(settings: Settings) -> Any:
    """The store /v1/best and /healthz read through: its own connection pool (lookups never
    queue behind the worker's or the other routes' connections), and server-side timeouts a
    little past KS_LOOKUP_TIMEOUT_S, so an abandoned lookup frees its connection soon."""
    from kernelsearch.db.store import Store

    t = settings.lookup_timeout_s
    return Store(settings.database_url, statement_timeout_ms=max(1000, int(3000 * t)),
                 lock_timeout_ms=max(500, int(2000 * t)), pool_timeout_s=t)


# -- record and job views -------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _current_versions(kernel: str) -> dict[str, str | None]:
    # Cached: fixed for the life of the process, while source_hash re-reads and hashes the
    # kernel's module on every call, and every /v1/best cache miss asks for it.
    v = kernel_versions()
    return {"torch": v.get("torch"), "triton": v.get("triton"),
            "source_hash": kernels.get_kernel(kernel).source_hash}


def record_json(record: Any) -> dict[str, Any]:
    """A record view as the API shows it (RecordOut's fields plus whatever the store adds)."""
    d = record.as_dict() if hasattr(record, "as_dict") else dict(record)
    out = dict(d)
    out.setdefault("case", d.get("axes"))
    out.setdefault("latency_us", d.get("latency_median_us"))
    out.setdefault("versions", {"torch": d.get("torch_version"),
                                "triton": d.get("triton_version"),
                                "source_hash": d.get("source_hash")})
    return _jsonable(out)


def job_json(job: Any) -> dict[str, Any]:
    d = job.as_dict() if hasattr(job, "as_dict") else dict(job)
    return _jsonable(d)


def _jsonable(d: Any) -> Any:
    return json.loads(json.dumps(d, default=_default))


def _default(o: Any) -> Any:
    if hasattr(o, "isoformat"):
        return o.isoformat()
    raise TypeError(f"not JSON-able: {type(o).__name__}")


def _dumps(d: Any) -> bytes:
    return json.dumps(d, default=_default, separators=(",", ":")).encode()


def _axis_schema(name: str) -> dict[str, Any]:
    """An axis query parameter's schema: a category (e.g. a dtype) where any kernel declares it so."""
    cats = sorted({c for k in kernels.all_kernels().values() for a in k.axes
                   if a.name == name and a.categorical for c in a.choices})
    return {"type": "string", "enum": cats} if cats else {"type": "integer"}


def _kernel_or_404(name: str) -> kernels.KernelDef:
    try:
        return kernels.get_kernel(name)
    except KeyError as exc:
        raise HTTPException(404, exc.args[0]) from None


# -- the app --------------------------------------------------------------------------------------
def create_app(settings: Settings | None = None, *, store: Any | None = None,
               start_worker: bool = False, worker_process: bool = False) -> FastAPI:
    """The API over `store` (default: a Store on settings.database_url, and another with its
    own pool and timeouts for lookups).

    With start_worker, a Worker claims and tunes jobs for as long as the app runs: in a thread,
    or with worker_process in a `kernelsearch worker` child process (restarted if it dies).
    Startup refuses a database whose schema is not this code's (db.errors.SchemaBehind).
    """
    settings = settings or get_settings()
    own_store = store is None
    if store is None:
        from kernelsearch.db.store import Store

        store = Store(settings.database_url)
    lookups = lookup_store(settings) if own_store else store
    metrics = Metrics(count_jobs=lambda status: store.count_jobs(status=status))
    cache = BestCache(lookups, settings.records_check_seconds)
    token = settings.api_token.get_secret_value().encode() if settings.api_token else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await run_in_threadpool(_check_schema, store)
        except dberr.StoreUnavailable as exc:
            # Serve anyway: every route answers 503 until the database is back.
            log.warning("starting without the database: %s", redact(str(exc)))
        stop = threading.Event()
        thread = None
        child = None
        if start_worker and worker_process:
            from .worker_process import WorkerProcess

            child = WorkerProcess(settings).start()
            app.state.worker = child
        elif start_worker:
            from .worker import Worker, worker_store

            # Its own pool: a tuning job's writes never hold the connections lookups need.
            wstore = worker_store(settings) if own_store else store
            worker = Worker(settings, wstore, metrics=metrics, on_records_changed=cache.invalidate)
            thread = threading.Thread(target=worker.run_forever, args=(stop,),
                                      name="ks-worker", daemon=True)
            thread.start()
            app.state.worker = worker
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                from kernelsearch.search_space.runner import INTERPRETER_TRIAL_TIMEOUT_S

                # The embedded worker ends its trial first (no limit set: the longest default).
                limit = settings.trial_timeout_s or INTERPRETER_TRIAL_TIMEOUT_S
                await asyncio.to_thread(thread.join, limit + 10)
            if child is not None:
                await asyncio.to_thread(child.stop)

    # FastAPIOffline: /docs and /redoc load their scripts from the installed package, not a CDN.
    app = FastAPIOffline(
        title="kernelsearch",
        version="0.1.0",
        summary="Best Triton kernel configs per workload case and device, and a tuning job queue.",
        lifespan=lifespan,
        dependencies=[Depends(query_text)],
        # Not `model`: that would file the schema under an HTML route's own media type.
        responses={"4XX": {"description": "the request was refused (one shape for every 4xx)",
                           "content": {"application/json": {"schema": {
                               "$ref": "#/components/schemas/Message"}}}}},
    )
    errors.install(app)
    app.state.settings = settings
    app.state.store = store
    app.state.metrics = metrics
    app.state.best_cache = cache
    app.state.worker = None
    app.state.embedded_worker = start_worker

    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(StrictJSON)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.exception_handler(dberr.StoreUnavailable)
    async def _unavailable(request: Request, exc: dberr.StoreUnavailable) -> JSONResponse:
        return errors.error_response(503, redact(str(exc)) or "database unavailable",
                                     headers={"Retry-After": "5"})

    @app.exception_handler(dberr.SchemaBehind)
    async def _schema(request: Request, exc: dberr.SchemaBehind) -> JSONResponse:
        return errors.error_response(503, str(exc))

    @app.exception_handler(dberr.NotFound)
    async def _not_found(request: Request, exc: dberr.NotFound) -> JSONResponse:
        return errors.error_response(404, str(exc))

    bearer = HTTPBearer(auto_error=False, description="KS_API_TOKEN, when the service sets one")

    def require_writer(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        """Writes need the bearer token when KS_API_TOKEN is set (constant-time comparison)."""
        if token is None:
            return
        given = creds.credentials.encode() if creds is not None else b""
        if not (given and hmac.compare_digest(given, token)):
            raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})

    # -- health, kernels ---------------------------------------------------------------------
    def _health() -> tuple[int, list[Any]]:
        lookups.ping()
        return lookups.records_version(), lookups.list_devices()

    @app.get("/healthz", response_model=schemas.Health, tags=["service"],
             responses={503: {"model": schemas.Unhealthy}})
    async def healthz() -> Any:
        """200 when the database answers; 503 with the reason while it does not ("degraded"
        when it is reachable but slower than KS_LOOKUP_TIMEOUT_S: lookups answer from cache)."""
        try:
            version, devices = await bounded(_health, timeout_s=settings.lookup_timeout_s)
        except LookupTimeout as exc:
            return JSONResponse({"status": "degraded", "detail": str(exc)},
                                status_code=503, headers={"Retry-After": "5"})
        except (dberr.StoreUnavailable, dberr.SchemaBehind) as exc:
            return JSONResponse({"status": "unavailable", "detail": redact(str(exc))},
                                status_code=503, headers={"Retry-After": "5"})
        return {"status": "ok", "database": store_backend(store), "records_version": version,
                "devices": [d if isinstance(d, str) else d.get("name") for d in devices],
                "worker": "embedded" if start_worker else "none",
                "versions": kernel_versions()}

    @app.get("/v1/kernels", response_model=list[schemas.KernelOut], tags=["kernels"])
    def list_kernels() -> Any:
        return [_describe(k) for k in kernels.all_kernels().values()]

    @app.get("/v1/kernels/{kernel}", response_model=schemas.KernelOut, tags=["kernels"],
             responses=_ERRORS)
    def get_kernel(kernel: str) -> Any:
        return _describe(_kernel_or_404(kernel))

    @app.get("/v1/kernels/{kernel}/cases", response_model=list[schemas.CaseOut], tags=["kernels"],
             responses=_ERRORS)
    def kernel_cases(kernel: str) -> Any:
        k = _kernel_or_404(kernel)
        return [{"number": c.number, "axes": c.axes, "bytes_moved": int(k.bytes_moved(c.axes)),
                 "info": c.info} for c in k.cases]

    # -- lookups -----------------------------------------------------------------------------
    # The versions a lookup compares a record with, worked out now rather than inside the first
    # lookup's time bound (the source identity parses the kernels' sources).
    for name in kernels.kernel_names():
        try:
            _current_versions(name)
        except Exception as exc:  # a kernel whose identity cannot be computed still serves
            log.warning("versions of %s: %s", name, exc)
    axis_names = sorted({a.name for k in kernels.all_kernels().values() for a in k.axes}
                        | {x for k in kernels.all_kernels().values() for x in k.extra_axes})
    best_params = [
        {"name": "kernel", "in": "query", "required": True, "schema": {"type": "string"}},
        {"name": "device", "in": "query", "required": True, "schema": {"type": "string"},
         "description": "device name as torch reports it, e.g. NVIDIA H200"},
    ] + [{"name": a, "in": "query", "required": False, "schema": _axis_schema(a),
          "description": "a case axis of the kernel (see /v1/kernels/{kernel})"} for a in axis_names]

    @app.get("/v1/best", tags=["lookups"], response_model=schemas.BestOut,
             responses=_ERRORS, openapi_extra={"parameters": best_params})
    async def best(request: Request) -> Response:
        """The best config for a case on a device: exact, else the nearest tuned case in work."""
        t0 = time.perf_counter()
        kernel, device, axes = _parse_best_query(request.query_params.multi_items())
        key = (kernel, device, tuple(sorted(axes.items())))
        budget = settings.lookup_timeout_s
        # A hit needs the version check only to be fresh: it waits on a slow one briefly.
        await cache.fresh(timeout_s=min(budget, HIT_WAIT_S) if key in cache.entries else budget)
        hit = cache.entries.get(key)
        if hit is None:
            metrics.record_cache.labels("miss").inc()
            left = max(0.05, budget - (time.perf_counter() - t0))
            hit = await bounded(_lookup, lookups, kernel, device, axes, timeout_s=left)
            cache.put(key, hit)
        status, body, match = hit
        metrics.count_lookup(match, time.perf_counter() - t0)
        return Response(body, status_code=status, media_type="application/json")

    @app.get("/v1/records", response_model=list[schemas.RecordOut], tags=["lookups"],
             responses=_ERRORS)
    def records(kernel: str | None = Query(None, max_length=200),
                device: str | None = Query(None, max_length=200)) -> Any:
        """The current tuned records, optionally of one kernel and/or one device."""
        if kernel is not None:
            _kernel_or_404(kernel)
        if device is not None:
            _check_text("device", device)
        return [record_json(r) for r in store.list_records(kernel=kernel, device=device)]

    @app.post("/v1/records", status_code=201, response_model=schemas.RecordOut, tags=["lookups"],
              responses=_WRITE_ERRORS, dependencies=[Depends(require_writer)])
    def upload_record(body: RecordDoc) -> Any:
        """Store a record tuned outside the workers (`@kernelsearch.autotune` with
        KS_AUTOTUNE_FALLBACK=tune, on a host whose workers cannot import the kernel); it becomes
        the current record under the same rule as a worker's."""
        k = _kernel_or_404(body.kernel)
        try:
            k.validate_axes(body.axes)
        except ValueError as exc:
            raise HTTPException(422, f"axes: {exc}") from None
        rec = body.to_record_in()
        store.ensure_device(rec.device_info or {"name": rec.device})
        view, _ = store.upsert_best(rec)
        cache.invalidate()
        return record_json(view)

    # -- jobs --------------------------------------------------------------------------------
    @app.post("/v1/jobs", status_code=202, response_model=schemas.JobOut, tags=["jobs"],
              responses=_WRITE_ERRORS, dependencies=[Depends(require_writer)])
    def submit_job(body: schemas.JobCreate) -> Any:
        """Queue a tuning job; a worker claims it. 202 with the job as queued."""
        k = _kernel_or_404(body.kernel)
        if body.n_trials > settings.max_trials_per_job:
            raise HTTPException(422, f"n_trials: at most {settings.max_trials_per_job} per job "
                                     f"(KS_MAX_TRIALS_PER_JOB), got {body.n_trials}")
        if body.cases == "all":
            cases = [dict(c.axes) for c in k.cases]
        else:
            if not body.cases:
                raise HTTPException(422, 'cases: give at least one case, or "all"')
            cases = []
            for i, axes in enumerate(body.cases):
                try:
                    cases.append(k.validate_axes(axes, strict=True))
                except ValueError as exc:
                    raise HTTPException(422, f"cases[{i}]: {exc}") from None
            cases = list({tuple(sorted(c.items())): c for c in cases}.values())
        if len(cases) > settings.max_cases_per_job:
            raise HTTPException(422, f"cases: at most {settings.max_cases_per_job} per job "
                                     f"(KS_MAX_CASES_PER_JOB), got {len(cases)}")
        sampler = body.sampler or "tpe"
        known = _samplers()
        if known and sampler not in known:
            raise HTTPException(422, f"sampler: unknown {sampler!r}; known: {', '.join(known)}")
        try:
            job = store.create_job(k.name, cases, body.n_trials, sampler,
                                   timeout_s=body.timeout_s, max_queued=settings.max_queued_jobs)
        except dberr.Conflict as exc:
            raise HTTPException(429, str(exc)) from None
        return job_json(job)

    @app.get("/v1/jobs", response_model=list[schemas.JobOut], tags=["jobs"], responses=_ERRORS)
    def list_jobs(status: schemas.JobStatus | None = None,
                  limit: Annotated[AsciiInt, Query(ge=1, le=1000)] = 100) -> Any:
        """Newest first."""
        return [job_json(j) for j in store.list_jobs(status=status, limit=limit)]

    @app.get("/v1/jobs/{job_id}", response_model=schemas.JobOut, tags=["jobs"], responses=_ERRORS)
    def get_job(job_id: Annotated[AsciiInt, JOB_ID]) -> Any:
        job = store.get_job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return job_json(job)

    @app.post("/v1/jobs/{job_id}/cancel", response_model=schemas.JobOut, tags=["jobs"],
              responses=_WRITE_ERRORS, dependencies=[Depends(require_writer)])
    def cancel_job(job_id: Annotated[AsciiInt, JOB_ID]) -> Any:
        """Cancel a queued or running job (a running one stops after its current trial)."""
        job = store.get_job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        if job.status in ("succeeded", "failed"):
            raise HTTPException(409, f"job {job_id} already {job.status}")
        return job_json(store.cancel_job(job_id))

    # -- dashboard, metrics ------------------------------------------------------------------
    @app.get("/metrics", tags=["service"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    from .dashboard import router as dashboard_router

    app.include_router(dashboard_router)
    return app


def _check_schema(store: Any) -> None:
    engine = getattr(store, "engine", None)
    if engine is None:
        from kernelsearch.db.engine import make_engine

        engine = make_engine(store.url)
    check_schema(engine)


def store_backend(store: Any) -> str:
    engine = getattr(store, "engine", None)
    return engine.dialect.name if engine is not None else "unknown"


def _describe(k: kernels.KernelDef) -> dict[str, Any]:
    return {**k.describe(), "extra_axes": list(k.extra_axes)}


def _check_text(name: str, value: str) -> None:
    """Reject control characters (PostgreSQL refuses NUL in text) and absurd lengths: 422."""
    if len(value) > 200 or any(ord(ch) < 32 for ch in value):
        raise HTTPException(422, f"{name}: at most 200 printable characters")


def _samplers() -> tuple[str, ...]:
    try:
        from kernelsearch.search_space.tuner import SAMPLERS
    except ImportError:
        return ()
    return tuple(SAMPLERS)


def _parse_best_query(items: list[tuple[str, str]]) -> tuple[str, str, dict[str, int]]:
    """kernel, device and the case axes of a /v1/best query; 404/422 with a message otherwise."""
    seen: dict[str, str] = {}
    for name, value in items:
        if name in seen:
            raise HTTPException(422, f"query parameter {name!r} given twice")
        seen[name] = value
    kernel = seen.pop("kernel", None)
    device = seen.pop("device", None)
    if not kernel:
        raise HTTPException(422, "query parameter 'kernel' is required")
    if not device:
        raise HTTPException(422, "query parameter 'device' is required")
    _check_text("device", device)
    k = _kernel_or_404(kernel)
    for extra in k.extra_axes:
        if extra in seen:
            v = seen[extra]
            if not (v.isascii() and v.isdigit() and 0 < len(v) < 12 and int(v) > 0):
                raise HTTPException(422, f"{k.name}: axis {extra!r} must be a positive integer, "
                                         f"got {v!r}")
    try:
        axes = parse_case_axes(k, seen)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return k.name, device, axes


def _lookup(store: Any, kernel: str, device: str, axes: Mapping[str, int]) -> tuple[int, bytes, str]:
    """(status, body, match) for the cache: the record's JSON, or a 404 naming the devices known."""
    k = kernels.get_kernel(kernel)
    found = store.find_best(kernel, device, dict(axes), int(k.bytes_moved(axes)),
                            distance=lambda other, _w: k.distance(axes, other))
    if found is None:
        devices = [d["name"] for d in store.list_devices() if d.get("n_records")]
        body = errors.error_body(f"no record of {kernel} on device {device!r}; devices with "
                                 f"records: {', '.join(map(repr, devices)) or 'none'}")
        return 404, _dumps(body), "none"
    record, match = found
    out = record_json(record)
    current = _current_versions(kernel)
    out.update(match=match, requested=dict(axes), current_versions=current,
               same_versions=all(out["versions"].get(n) == v for n, v in current.items()))
    return 200, _dumps(out), match
