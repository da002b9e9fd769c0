"""/v1/search: queue a search beyond the config list (issue 35) for every key a program's stored
calls met (`kernelsearch search --from-captures` over HTTP)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from kernelsearch.db import errors as dberr

from ..deps import SettingsDep, StoreDep, require_writer
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
    """Queue a search job per captured key (budget KS_SEARCH_TRIALS, KS_SEARCH_SECONDS); 202
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
