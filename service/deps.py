"""The routes' dependencies: what create_app built once, read back from `request.app.state`.

A route names what it needs by type (`store: StoreDep`) instead of closing over create_app's
locals, so the routers live in their own modules and a test can see what each route touches.
"""
from __future__ import annotations

import hmac
from typing import Annotated, Protocol, runtime_checkable

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kernelsearch.db.interfaces import DeviceRegistry, Health, RecordRepository, ServiceStore

from .lookups import BestCache
from .metrics import Metrics
from .settings import Settings


@runtime_checkable
class LookupStore(RecordRepository, DeviceRegistry, Health, Protocol):
    """What /v1/best and /healthz read: records, the devices they name, reachability."""


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> ServiceStore:
    return request.app.state.store


def get_lookup_store(request: Request) -> LookupStore:
    return request.app.state.lookups


def get_best_cache(request: Request) -> BestCache:
    return request.app.state.best_cache


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def get_embedded_worker(request: Request) -> bool:
    """Whether this app runs a worker itself (else workers run as `kernelsearch worker`)."""
    return bool(request.app.state.embedded_worker)


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
StoreDep = Annotated[ServiceStore, Depends(get_store)]
LookupStoreDep = Annotated[LookupStore, Depends(get_lookup_store)]
BestCacheDep = Annotated[BestCache, Depends(get_best_cache)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
EmbeddedWorkerDep = Annotated[bool, Depends(get_embedded_worker)]

bearer = HTTPBearer(auto_error=False, description="KS_API_TOKEN, when the service sets one")


def require_writer(request: Request,
                   creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """Writes need the bearer token when KS_API_TOKEN is set (constant-time comparison)."""
    token: bytes | None = request.app.state.writer_token
    if token is None:
        return
    given = creds.credentials.encode() if creds is not None else b""
    if not (given and hmac.compare_digest(given, token)):
        raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})
