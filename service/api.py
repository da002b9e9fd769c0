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
from contextlib import asynccontextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from fastapi import Depends, FastAPI, HTTPException, Path as PathParam, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles

from kernelsearch import kernels
from kernelsearch.db import errors as dberr
from kernelsearch.db.engine import check_schema
from kernelsearch.db.store import RecordDoc
from kernelsearch.kernels.device import versions as kernel_versions

from . import schemas
from .metrics import Metrics
from .settings import Settings, get_settings

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
_ERRORS = {400: {"model": schemas.Message}, 404: {"model": schemas.Message},
           422: {"model": schemas.Message}, 503: {"model": schemas.Message}}
_WRITE_ERRORS = {**_ERRORS, 401: {"model": schemas.Message}, 409: {"model": schemas.Message},
                 413: {"model": schemas.Message}, 429: {"model": schemas.Message}}
JOB_ID = PathParam(ge=1, le=2**31 - 1, description="a job's id")
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
        replay = iter(messages)

        async def receive_again() -> dict:
            try:
                return next(replay)
            except StopIteration:
                return await receive()

        await self.app(scope, receive_again, send)

    def _too_big(self) -> str:
        return f"request body larger than {self.max_bytes} bytes (KS_MAX_BODY_BYTES)"

    @staticmethod
    async def _reject(scope: dict, send: Callable, status: int, detail: str) -> None:
        resp = JSONResponse({"detail": detail}, status_code=status)
        await resp(scope, _no_receive, send)


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}


# -- /v1/best cache -------------------------------------------------------------------------------
class BestCache:
    """Answers of /v1/best by (kernel, device, axes), dropped whenever records change.

    The store's records_version() is read at most every `check_s` seconds (not per request); this
    process's own writes call invalidate(). While the database is unreachable the cache answers
    503 like every other route, until a check succeeds again.
    """

    MAX_ENTRIES = 50_000

    def __init__(self, store: Any, check_s: float) -> None:
        self.store = store
        self.check_s = check_s
        self.entries: dict[tuple, tuple[int, bytes, str]] = {}
        self.version: int | None = None
        self.checked = float("-inf")
        self.error: Exception | None = None

    def invalidate(self) -> None:
        self.entries.clear()
        self.checked = float("-inf")

    async def fresh(self) -> None:
        """Make sure entries are not older than `check_s`; raise StoreUnavailable while down."""
        now = time.monotonic()
        if now - self.checked >= self.check_s:
            self.checked = now
            try:
                version = await run_in_threadpool(self.store.records_version)
            except dberr.StoreUnavailable as exc:
                self.error = exc
                raise
            self.error = None
            if version != self.version:
                self.entries.clear()
                self.version = version
        elif self.error is not None:
            raise self.error

    def put(self, key: tuple, value: tuple[int, bytes, str]) -> None:
        if len(self.entries) >= self.MAX_ENTRIES:
            self.entries.clear()
        self.entries[key] = value


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


def _kernel_or_404(name: str) -> kernels.KernelDef:
    try:
        return kernels.get_kernel(name)
    except KeyError as exc:
        raise HTTPException(404, exc.args[0]) from None


# -- the app --------------------------------------------------------------------------------------
def create_app(settings: Settings | None = None, *, store: Any | None = None,
               start_worker: bool = False) -> FastAPI:
    """The API over `store` (default: a Store on settings.database_url).

    With start_worker, a Worker thread claims and tunes jobs for as long as the app runs.
    Startup refuses a database whose schema is not this code's (db.errors.SchemaBehind).
    """
    settings = settings or get_settings()
    if store is None:
        from kernelsearch.db.store import Store

        store = Store(settings.database_url)
    metrics = Metrics(count_jobs=lambda status: store.count_jobs(status=status))
    cache = BestCache(store, settings.records_check_seconds)
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
        if start_worker:
            from .worker import Worker

            worker = Worker(settings, store, metrics=metrics, on_records_changed=cache.invalidate)
            thread = threading.Thread(target=worker.run_forever, args=(stop,),
                                      name="ks-worker", daemon=True)
            thread.start()
            app.state.worker = worker
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                await asyncio.to_thread(thread.join, settings.trial_timeout_s + 10)

    app = FastAPI(
        title="kernelsearch",
        version="0.1.0",
        summary="Best Triton kernel configs per workload case and device, and a tuning job queue.",
        lifespan=lifespan,
    )
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
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.exception_handler(dberr.StoreUnavailable)
    async def _unavailable(request: Request, exc: dberr.StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": redact(str(exc)) or "database unavailable"}, status_code=503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(dberr.SchemaBehind)
    async def _schema(request: Request, exc: dberr.SchemaBehind) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(dberr.NotFound)
    async def _not_found(request: Request, exc: dberr.NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

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
    @app.get("/healthz", response_model=schemas.Health, tags=["service"],
             responses={503: {"model": schemas.Unhealthy}})
    def healthz() -> Any:
        """200 when the database answers; 503 with the reason while it does not."""
        try:
            store.ping()
            version = store.records_version()
            devices = store.list_devices()
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
    axis_names = sorted({a.name for k in kernels.all_kernels().values() for a in k.axes}
                        | {x for k in kernels.all_kernels().values() for x in k.extra_axes})
    best_params = [
        {"name": "kernel", "in": "query", "required": True, "schema": {"type": "string"}},
        {"name": "device", "in": "query", "required": True, "schema": {"type": "string"},
         "description": "device name as torch reports it, e.g. NVIDIA H200"},
    ] + [{"name": a, "in": "query", "required": False, "schema": {"type": "integer"},
          "description": "a case axis of the kernel (see /v1/kernels/{kernel})"} for a in axis_names]

    @app.get("/v1/best", tags=["lookups"], response_model=schemas.BestOut,
             responses=_ERRORS, openapi_extra={"parameters": best_params})
    async def best(request: Request) -> Response:
        """The best config for a case on a device: exact, else the nearest tuned case in work."""
        t0 = time.perf_counter()
        kernel, device, axes = _parse_best_query(request.query_params.multi_items())
        key = (kernel, device, tuple(sorted(axes.items())))
        await cache.fresh()
        hit = cache.entries.get(key)
        if hit is None:
            metrics.record_cache.labels("miss").inc()
            hit = await run_in_threadpool(_lookup, store, kernel, device, axes)
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
                    cases.append(k.validate_axes(axes))
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
                  limit: int = Query(100, ge=1, le=1000)) -> Any:
        """Newest first."""
        return [job_json(j) for j in store.list_jobs(status=status, limit=limit)]

    @app.get("/v1/jobs/{job_id}", response_model=schemas.JobOut, tags=["jobs"], responses=_ERRORS)
    def get_job(job_id: int = JOB_ID) -> Any:
        job = store.get_job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return job_json(job)

    @app.post("/v1/jobs/{job_id}/cancel", response_model=schemas.JobOut, tags=["jobs"],
              responses=_WRITE_ERRORS, dependencies=[Depends(require_writer)])
    def cancel_job(job_id: int = JOB_ID) -> Any:
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
        axes = k.validate_axes(seen)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return k.name, device, axes


def _lookup(store: Any, kernel: str, device: str, axes: Mapping[str, int]) -> tuple[int, bytes, str]:
    """(status, body, match) for the cache: the record's JSON, or a 404 naming the devices known."""
    k = kernels.get_kernel(kernel)
    found = store.find_best(kernel, device, dict(axes), int(k.bytes_moved(axes)))
    if found is None:
        devices = [d["name"] for d in store.list_devices() if d.get("n_records")]
        body = {"detail": f"no record of {kernel} on device {device!r}; devices with records: "
                          f"{', '.join(map(repr, devices)) or 'none'}"}
        return 404, _dumps(body), "none"
    record, match = found
    out = record_json(record)
    current = _current_versions(kernel)
    out.update(match=match, requested=dict(axes), current_versions=current,
               same_versions=all(out["versions"].get(n) == v for n, v in current.items()))
    return 200, _dumps(out), match
