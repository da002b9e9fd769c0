"""/metrics: the process's Prometheus metrics, with the job counts read at scrape time."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..deps import MetricsDep

router = APIRouter(tags=["service"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def prometheus(metrics: MetricsDep) -> Response:
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
