"""/v1/best: the best config for a case on a device, the one route on the hot path.

Its query parameters are the axes of every kernel known when the app is built (a plugin's
kernels included), so the router is built then, by `make_router`, rather than at import.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from kernelsearch import kernels
from kernelsearch.db import errors as dberr
from kernelsearch.kernels.resolve import Key, Resolver, SourceUnavailable

from .. import errors, schemas
from ..definitions import known_or_reloaded
from ..deps import (BestCacheDep, LookupPoolDep, LookupStore, LookupStoreDep, MetricsDep,
                    SettingsDep)
from ..errors import query_error
from ..lookups import HIT_WAIT_S, bounded
from ..sources import StoreSource
from ..strict_input import AxisError, parse_case_axes
from ..views import current_versions, dumps, record_json
from .common import ERRORS, check_text, kernel_or_404

log = logging.getLogger(__name__)

MATCHES = ("nearest", "exact")


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
               cache: BestCacheDep, metrics: MetricsDep, pool: LookupPoolDep) -> Response:
    """The best config for a case on a device: exact, else (match=nearest, the default) the
    tuned case nearest in bytes moved within KS_NEAREST_MAX_RATIO. A cached answer is served
    whatever the database does (X-KS-Cache: stale, with Age, when it could not be checked)."""
    t0 = time.perf_counter()
    await _known_kernel(request.query_params.get("kernel"), lookups, settings.lookup_timeout_s, pool)
    q = parse_best_query(request.query_params.multi_items())
    key = (q.kernel, q.device, tuple(sorted(q.axes.items())), q.match, q.ignored)
    budget = settings.lookup_timeout_s
    cached = key in cache.entries
    try:
        # A hit needs the version check only to be fresh: it waits on a slow one briefly.
        current = await cache.fresh(timeout_s=min(budget, HIT_WAIT_S) if cached else budget)
    except dberr.StoreUnavailable:
        if key not in cache.entries:
            raise
        current = False
    hit = cache.entries.get(key)
    if hit is None:
        outcome = "miss"
        left = max(0.05, budget - (time.perf_counter() - t0))
        hit = await bounded(lookup, lookups, q, settings.nearest_max_ratio, timeout_s=left,
                            pool=pool)
        cache.put(key, hit)
    else:
        outcome = "hit" if current else "stale"
    metrics.record_cache.labels(outcome).inc()
    status, body, match = hit
    metrics.count_lookup(match, time.perf_counter() - t0)
    headers = {"X-KS-Cache": outcome}
    if outcome == "stale" and math.isfinite(cache.age()):
        headers["Age"] = str(int(cache.age()))
    return Response(body, status_code=status, media_type="application/json", headers=headers)


async def _known_kernel(name: str | None, lookups: Any, timeout_s: float, pool: Any) -> None:
    """A kernel this process does not know may be an undeclared one another process registered:
    the store's definitions are read again (throttled, in the lookups' pool, within the bound)."""
    if not name or not hasattr(lookups, "kernel_definitions"):
        return
    try:
        kernels.get_kernel(name)
    except KeyError:
        try:
            await bounded(known_or_reloaded, lookups, name, timeout_s=timeout_s, pool=pool)
        except dberr.StoreUnavailable:
            pass  # a slow database: the name is answered as this process knows it


def _parameters() -> list[dict[str, Any]]:
    all_kernels = kernels.all_kernels().values()
    axis_names = sorted({a.name for k in all_kernels for a in k.axes}
                        | {x for k in all_kernels for x in k.extra_axes})
    return [
        {"name": "kernel", "in": "query", "required": True, "schema": {"type": "string", "minLength": 1}},
        {"name": "device", "in": "query", "required": True,
         "schema": {"type": "string", "minLength": 1, "maxLength": 200},
         "description": "device name as torch reports it, e.g. NVIDIA H200"},
        {"name": "match", "in": "query", "required": False,
         "schema": {"type": "string", "enum": list(MATCHES), "default": "nearest"},
         "description": "exact: only a record of these axes; nearest: else the tuned case "
                        "nearest in bytes moved, within KS_NEAREST_MAX_RATIO"},
    ] + [{"name": a, "in": "query", "required": False, "schema": _axis_schema(a),
          "description": "a case axis of the kernel (see /v1/kernels/{kernel})"} for a in axis_names]


def _axis_schema(name: str) -> dict[str, Any]:
    """An axis query parameter's schema: a category (e.g. a dtype) where any kernel declares it so."""
    cats = sorted({c for k in kernels.all_kernels().values() for a in k.axes
                   if a.name == name and a.categorical for c in a.choices})
    return {"type": "string", "enum": cats} if cats else {"type": "integer"}


@dataclass(frozen=True)
class BestQuery:
    """A /v1/best query, checked: the kernel's key axes, how to match, and the informational
    axes it named (accepted, said to be ignored)."""

    kernel: str
    device: str
    axes: dict[str, Any]
    match: str = "nearest"
    ignored: tuple[str, ...] = ()


def parse_best_query(items: list[tuple[str, str]]) -> BestQuery:
    """The query of /v1/best; 404 (unknown kernel) or 422 naming the parameter otherwise."""
    seen: dict[str, str] = {}
    for name, value in items:
        if name in seen:
            raise query_error(name, f"query parameter {name!r} given twice")
        seen[name] = value
    kernel = seen.pop("kernel", None)
    device = seen.pop("device", None)
    match = seen.pop("match", "nearest")
    if not kernel:
        raise query_error("kernel", "query parameter 'kernel' is required")
    if not device:
        raise query_error("device", "query parameter 'device' is required")
    check_text("device", device)
    if match not in MATCHES:
        raise query_error("match", f"match: one of {', '.join(MATCHES)}, got {match[:40]!r}")
    k = kernel_or_404(kernel)
    for extra in k.extra_axes:
        if extra in seen:
            v = seen[extra]
            if not (v.isascii() and v.isdigit() and 0 < len(v) < 12 and int(v) > 0):
                raise query_error(extra, f"{k.name}: axis {extra!r} must be a positive integer, "
                                         f"got {v[:40]!r}")
    try:
        axes = parse_case_axes(k, seen)
    except AxisError as exc:
        raise query_error(exc.name, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    ignored = tuple(sorted(n for n in k.extra_axes if n in seen))
    return BestQuery(k.name, device, axes, match, ignored)


def lookup(store: LookupStore, q: BestQuery, max_ratio: float) -> tuple[int, bytes, str]:
    """(status, body, match) for the cache: the record's JSON with its distance, or a 404 that
    says why and names the devices with records of this kernel."""
    k = kernels.get_kernel(q.kernel)
    near = None if q.match == "exact" else (lambda other: k.distance(q.axes, dict(other)))
    # One source, the database this app reads, asked anew on each miss of the route's cache.
    resolver = Resolver([StoreSource(store)], retry_s=0.0, max_ratio=max_ratio)
    key = Key.of(q.kernel, q.axes, q.device)
    try:
        got = resolver.resolve(key, near=near)
        # Only to say why nothing is served: the nearest case past the bound, if there is one.
        far_got = None if got is not None or near is None else resolver.resolve(key, near=near, max_ratio=math.inf)
    except SourceUnavailable as exc:
        raise _store_error(exc) from None
    found = None if got is None else (got.record, got.match.value)
    far = ""
    if far_got is not None:
        far = (f"; the nearest tuned case, {_axes_text(far_got.record.axes)}, moves "
               f"{math.exp(far_got.distance):.3g}x more or fewer bytes, past KS_NEAREST_MAX_RATIO "
               f"({max_ratio:g})")
    if found is None:
        recs = store.list_records(kernel=q.kernel)
        devices = sorted({r.device for r in recs})
        what = "for exactly these axes " if q.match == "exact" else ""
        body = errors.error_body(f"no record of {q.kernel} {what}on device {q.device!r}{far}"
                                 f"{_missing_category(k, q, recs)}; "
                                 f"devices with records of {q.kernel}: "
                                 f"{', '.join(map(repr, devices)) or 'none'}")
        return 404, dumps(body), "none"
    record, match = found
    out = record_json(record)
    current = current_versions(q.kernel)
    out.update(match=match, requested=dict(q.axes),
               distance=0.0 if match == "exact" else round(k.distance(q.axes, record.axes), 6),
               current_versions=current,
               same_versions=all(out["versions"].get(n) == v for n, v in current.items()))
    if q.ignored:
        out["ignored_axes"] = list(q.ignored)
    return 200, dumps(out), match


def _missing_category(k: Any, q: BestQuery, recs: list[Any]) -> str:
    """Why a device with records of the kernel still has none to serve: the query's category (a
    dtype, a key token) has none there, and "nearest" never crosses a category."""
    def category(axes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple((a.name, c) for a in k.axes
                     if a.name in axes and (c := a.category_of(axes[a.name])) is not None)

    wanted = category(q.axes)
    here = {category(r.axes) for r in recs if r.device == q.device}
    if not wanted or not here or wanted in here:
        return ""
    shown = ", ".join(f"{n}={c}" for n, c in wanted)
    others = "; ".join(", ".join(f"{n}={c}" for n, c in cat) for cat in sorted(here))
    return (f": the category {shown} has no record there (nearest never crosses a category); "
            f"its categories with records: {others}")


def _store_error(exc: BaseException) -> BaseException:
    """The database's own error under a source's `SourceUnavailable` (it says 503 and why)."""
    while isinstance(exc, SourceUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc if isinstance(exc, dberr.StoreError) else dberr.StoreUnavailable(str(exc))


def _axes_text(axes: dict[str, Any]) -> str:
    return ", ".join(f"{n}={v}" for n, v in sorted(axes.items()))
