"""/v1/search: queue a search beyond the config list (issue 35) for every key a program's stored
calls met (`kernelsearch search --from-captures` over HTTP); /v1/captures: keep a call a
program tuned itself, so that search has it."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from kernelsearch.db import errors as dberr

from ..deps import SettingsDep, StoreDep, require_writer
from ..job_acceptance import JobRefused, accept_capture
from ..search_jobs import queue_searches
from ..views import job_json
from .common import WRITE_ERRORS, kernel_or_404

router = APIRouter(tags=["jobs"])


class SearchCreate(BaseModel):
    """Which keys to search: those of one undeclared kernel, or every one's (no kernel)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    kernel: str | None = Field(None, min_length=1, max_length=1000)


@router.post("/v1/search", status_code=202, responses=WRITE_ERRORS,
             dependencies=[Depends(require_writer)])
def queue_search(body: SearchCreate, settings: SettingsDep, store: StoreDep) -> Any:
    """Queue a search job per captured key (budget KS_SEARCH_TRIALS, KS_SEARCH_S); 202
    with the jobs, each `"existing": true` where an identical one was queued or running."""
    if body.kernel is not None:
        kernel_or_404(body.kernel, store)
    try:
        queued = queue_searches(store, settings, body.kernel)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    except dberr.Conflict as exc:
        raise HTTPException(429, str(exc)) from None
    return {"jobs": [{**job_json(j), "existing": not new} for j, new in queued]}


class CaptureCreate(BaseModel):
    """A call of an undeclared kernel that a program tuned itself (no job carries it)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    kernel: str = Field(min_length=1, max_length=1000)
    capture: dict[str, Any] = Field(
        description="the call (kernels.capture.Capture as JSON: arguments and a grid per config)")


@router.post("/v1/captures", status_code=201, responses=WRITE_ERRORS,
             dependencies=[Depends(require_writer)])
def keep_capture(body: CaptureCreate, settings: SettingsDep, store: StoreDep) -> Any:
    """Keep the call, checked as a job's capture is (422 naming what is wrong; 404 for an
    unknown kernel), so `POST /v1/search` can search its key; `"new": false` when this call
    was kept already."""
    k = kernel_or_404(body.kernel, store)
    try:
        case, new = accept_capture(store, settings, k, body.capture)
    except JobRefused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return {"kernel": k.name, "case": case, "new": new}
