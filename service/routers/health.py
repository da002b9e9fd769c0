"""/healthz: whether the database answers, for load balancers and `kernelsearch` clients."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from kernelsearch.db import errors as dberr
from kernelsearch.kernels.device import versions as kernel_versions

from .. import schemas
from ..deps import (EmbeddedWorkerDep, LookupPoolDep, LookupStore, LookupStoreDep, SettingsDep,
                    StoreDep)
from ..errors import redact
from ..lookups import LookupTimeout, bounded

router = APIRouter(tags=["service"])


def _health(lookups: LookupStore) -> tuple[int, list[Any]]:
    lookups.ping()
    return lookups.records_version(), lookups.list_devices()


@router.get("/healthz", response_model=schemas.Health,
            responses={503: {"model": schemas.Unhealthy}})
async def healthz(settings: SettingsDep, store: StoreDep, lookups: LookupStoreDep,
                  embedded_worker: EmbeddedWorkerDep, pool: LookupPoolDep) -> Any:
    """200 when the database answers; 503 with the reason while it does not ("degraded"
    when it is reachable but slower than KS_LOOKUP_TIMEOUT_S: lookups answer from cache)."""
    try:
        version, devices = await bounded(_health, lookups, timeout_s=settings.lookup_timeout_s,
                                        pool=pool)
    except LookupTimeout as exc:
        return JSONResponse({"status": "degraded", "detail": str(exc)},
                            status_code=503, headers={"Retry-After": "5"})
    except (dberr.StoreUnavailable, dberr.SchemaBehind) as exc:
        return JSONResponse({"status": "unavailable", "detail": redact(str(exc))},
                            status_code=503, headers={"Retry-After": "5"})
    return {"status": "ok", "database": store_backend(store),
            "records_version": version,
            "devices": [d if isinstance(d, str) else d.get("name") for d in devices],
            "worker": "embedded" if embedded_worker else "none",
            "versions": kernel_versions()}


def store_backend(store: object) -> str:
    """The SQL dialect behind `store` ("sqlite", "postgresql"), or "unknown"."""
    engine = getattr(store, "engine", None)
    return engine.dialect.name if engine is not None else "unknown"
