"""/metrics: the process's Prometheus metrics, with the job counts read at scrape time."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..deps import MetricsDep
from ..lookups import run_read

router = APIRouter(tags=["service"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def prometheus(metrics: MetricsDep) -> Response:
    # Rendering counts the jobs in the database: a read, bounded like the others.
    return Response(await run_read(metrics.render), media_type=CONTENT_TYPE_LATEST)
