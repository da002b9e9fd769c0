"""The routes' dependencies: what create_app built once, read back from `request.app.state`.

A route names what it needs by type (`store: StoreDep`) instead of closing over create_app's
locals, so the routers live in their own modules and a test can see what each route touches.
They are coroutines: a sync dependency would wait for a thread of the server's shared pool, which
slow reads must never make a lookup or /healthz wait for.
"""
from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated, Any, Protocol, runtime_checkable

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.routing import Match

from kernelsearch.db.interfaces import DeviceRegistry, Health, RecordRepository, ServiceStore

from .lookups import BestCache, BoundedPool
from .metrics import Metrics
from .settings import Settings


@runtime_checkable
class LookupStore(RecordRepository, DeviceRegistry, Health, Protocol):
    """What /v1/best and /healthz read: records, the devices they name, reachability."""


async def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> ServiceStore:
    return request.app.state.store


async def get_lookup_store(request: Request) -> LookupStore:
    return request.app.state.lookups


async def get_best_cache(request: Request) -> BestCache:
    return request.app.state.best_cache


async def get_lookup_pool(request: Request) -> BoundedPool:
    return request.app.state.lookup_pool


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_embedded_worker(request: Request) -> bool:
    """Whether this app runs a worker itself (else workers run as `kernelsearch worker`)."""
    return bool(request.app.state.embedded_worker)


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
StoreDep = Annotated[ServiceStore, Depends(get_store)]
LookupStoreDep = Annotated[LookupStore, Depends(get_lookup_store)]
BestCacheDep = Annotated[BestCache, Depends(get_best_cache)]
LookupPoolDep = Annotated[BoundedPool, Depends(get_lookup_pool)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
EmbeddedWorkerDep = Annotated[bool, Depends(get_embedded_worker)]

bearer = HTTPBearer(auto_error=False, description="KS_API_TOKEN, when the service sets one")


UNAUTHORIZED = "missing or wrong bearer token (Authorization: Bearer <token>)"


def token_ok(expected: bytes | None, authorization: str | None) -> bool:
    """Whether an Authorization header carries the token (always, when none is set); compared
    in constant time."""
    if expected is None:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    raw = given.strip().encode("utf-8", "surrogateescape")
    return bool(raw) and hmac.compare_digest(raw, expected)


async def require_writer(request: Request,
                         creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """Writes need the bearer token when KS_API_TOKEN is set (constant-time comparison). The
    app's WriterToken middleware checks it first, before the body is read; this dependency
    keeps it in the OpenAPI document and guards a route mounted without the middleware."""
    token: bytes | None = request.app.state.writer_token
    if token is None:
        return
    given = creds.credentials.encode() if creds is not None else b""
    if not (given and hmac.compare_digest(given, token)):
        raise HTTPException(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})


class WriterToken:
    """Pure ASGI middleware: a request to a route that requires the writers' token is answered
    401 before its body is read or validated (a wrong token with a bad body is a 401, not a 422
    that tells an unauthenticated client what the route accepts)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        fastapi_app = scope.get("app")
        expected = getattr(getattr(fastapi_app, "state", None), "writer_token", None)
        if expected is not None and _needs_writer(fastapi_app, scope):
            auth = dict(scope.get("headers", ())).get(b"authorization", b"").decode("latin-1")
            if not token_ok(expected, auth):
                from .errors import error_response

                resp = error_response(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _needs_writer(app: Any, scope: dict) -> bool:
    from .errors import leaf_routes

    for route in leaf_routes(getattr(app, "routes", ())):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return any(getattr(d, "dependency", None) is require_writer
                       for d in getattr(route, "dependencies", ()))
    return False
