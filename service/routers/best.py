"""/v1/best: the best config for a case on a device, the one route on the hot path.

Its query parameters are the axes of every kernel known when the app is built (a plugin's
kernels included), so the router is built then, by `make_router`, rather than at import.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from kernelsearch import kernels

from .. import errors, schemas
from ..deps import BestCacheDep, LookupStore, LookupStoreDep, MetricsDep, SettingsDep
from ..lookups import HIT_WAIT_S, bounded
from ..strict_input import parse_case_axes
from ..views import case_work, current_versions, dumps, record_json
from .common import ERRORS, check_text, kernel_or_404

log = logging.getLogger(__name__)


def make_router() -> APIRouter:
    """The /v1/best router over the kernels registered now; computes their versions too, so the
    first lookup's time bound is not spent parsing kernel sources."""
    for name in kernels.kernel_names():
        try:
            current_versions(name)
        except Exception as exc:  # a kernel whose identity cannot be computed still serves
            log.warning("versions of %s: %s", name, exc)
    router = APIRouter(tags=["lookups"])
    router.add_api_route("/v1/best", best, methods=["GET"], response_model=schemas.BestOut,
                         responses=ERRORS, openapi_extra={"parameters": _parameters()})
    return router


async def best(request: Request, settings: SettingsDep, lookups: LookupStoreDep,
               cache: BestCacheDep, metrics: MetricsDep) -> Response:
    """The best config for a case on a device: exact, else the nearest tuned case in work."""
    t0 = time.perf_counter()
    kernel, device, axes = parse_best_query(request.query_params.multi_items())
    key = (kernel, device, tuple(sorted(axes.items())))
    budget = settings.lookup_timeout_s
    # A hit needs the version check only to be fresh: it waits on a slow one briefly.
    await cache.fresh(timeout_s=min(budget, HIT_WAIT_S) if key in cache.entries else budget)
    hit = cache.entries.get(key)
    if hit is None:
        metrics.record_cache.labels("miss").inc()
        left = max(0.05, budget - (time.perf_counter() - t0))
        hit = await bounded(lookup, lookups, kernel, device, axes, timeout_s=left)
        cache.put(key, hit)
    status, body, match = hit
    metrics.count_lookup(match, time.perf_counter() - t0)
    return Response(body, status_code=status, media_type="application/json")


def _parameters() -> list[dict[str, Any]]:
    all_kernels = kernels.all_kernels().values()
    axis_names = sorted({a.name for k in all_kernels for a in k.axes}
                        | {x for k in all_kernels for x in k.extra_axes})
    return [
        {"name": "kernel", "in": "query", "required": True, "schema": {"type": "string"}},
        {"name": "device", "in": "query", "required": True, "schema": {"type": "string"},
         "description": "device name as torch reports it, e.g. NVIDIA H200"},
    ] + [{"name": a, "in": "query", "required": False, "schema": _axis_schema(a),
          "description": "a case axis of the kernel (see /v1/kernels/{kernel})"} for a in axis_names]


def _axis_schema(name: str) -> dict[str, Any]:
    """An axis query parameter's schema: a category (e.g. a dtype) where any kernel declares it so."""
    cats = sorted({c for k in kernels.all_kernels().values() for a in k.axes
                   if a.name == name and a.categorical for c in a.choices})
    return {"type": "string", "enum": cats} if cats else {"type": "integer"}


def parse_best_query(items: list[tuple[str, str]]) -> tuple[str, str, dict[str, int]]:
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
    check_text("device", device)
    k = kernel_or_404(kernel)
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


def lookup(store: LookupStore, kernel: str, device: str,
           axes: Mapping[str, int]) -> tuple[int, bytes, str]:
    """(status, body, match) for the cache: the record's JSON, or a 404 naming the devices known."""
    k = kernels.get_kernel(kernel)
    found = store.find_best(kernel, device, dict(axes), case_work(k, axes),
                            distance=lambda other, _w: k.distance(axes, other))
    if found is None:
        devices = [d["name"] for d in store.list_devices() if d.get("n_records")]
        body = errors.error_body(f"no record of {kernel} on device {device!r}; devices with "
                                 f"records: {', '.join(map(repr, devices)) or 'none'}")
        return 404, dumps(body), "none"
    record, match = found
    out = record_json(record)
    current = current_versions(kernel)
    out.update(match=match, requested=dict(axes), current_versions=current,
               same_versions=all(out["versions"].get(n) == v for n, v in current.items()))
    return 200, dumps(out), match
