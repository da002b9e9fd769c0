"""/v1/search: queue a search beyond the config list for every key a program's stored
calls met (`kernelsearch search --from-captures` over HTTP); /v1/captures: keep a call a
program tuned itself, so that search has it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from kernelsearch.db import errors as dberr

from ..deps import SettingsDep, StoreDep, require_writer
from kernelsearch.search_space.job_acceptance import JobRefused, accept_capture, search_share, untrusted_kernels
from ..search_jobs import queue_searches
from ..views import job_json
from .common import WRITE_ERRORS, kernel_or_404

router = APIRouter(tags=["jobs"])


class SearchCreate(BaseModel):
    """Which keys to search: those of one undeclared kernel, or every one's (no kernel)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    kernel: str | None = Field(None, min_length=1, max_length=1000)


@dataclass
class SearchesQueued:
    """What one POST /v1/search queued: its jobs (job, new), how many keys it left out (the
    request's share of the queue was spent) and the kernels refused for their module."""

    jobs: list[tuple[Any, bool]]
    left_out: int
    refused: dict[str, str]


def accept_searches(store: Any, settings: Any, kernel: str | None = None) -> SearchesQueued:
    """Queue search jobs (`search_jobs.queue_searches`) as a request may: only for kernels whose
    module the workers trust (`kernel`'s untrusted: 422 naming the module; among every kernel's,
    the untrusted are refused and listed), and at most `search_share` new jobs."""
    names = [kernel] if kernel else sorted(store.kernel_definitions())
    refused = untrusted_kernels(store, settings, names)
    if kernel and kernel in refused:
        raise JobRefused(f"kernel: {refused[kernel]}")
    share = search_share(store, settings)
    trusted = [n for n in names if n not in refused]
    jobs: list[tuple[Any, bool]] = []
    for name in trusted:
        try:
            jobs += queue_searches(store, settings, name,
                                   max_new=share - sum(new for _, new in jobs))
        except ValueError:  # a kernel without a stored call: named, it is the answer
            if kernel:
                raise
    if refused and not jobs and not kernel:
        raise JobRefused("kernel: no kernel with a stored call is one the workers trust: "
                         + "; ".join(refused.values()))
    keys = sum(len(store.kernel_captures(n)) for n in trusted)
    return SearchesQueued(jobs=jobs, left_out=max(0, keys - len(jobs)), refused=refused)


@router.post("/v1/search", status_code=202, responses=WRITE_ERRORS,
             dependencies=[Depends(require_writer)])
def queue_search(body: SearchCreate, settings: SettingsDep, store: StoreDep) -> Any:
    """Queue a search job per captured key (budget KS_SEARCH_TRIALS, KS_SEARCH_S) of the
    kernels whose module the workers trust, at most KS_SEARCH_QUEUE_SHARE of the queue's room;
    202 with the jobs, each `"existing": true` where an identical one was queued or running,
    `left_out` (keys not queued this time: ask again once the queue has room) and `refused`
    (kernel: why its module is not imported). 422 for a kernel whose module is not trusted;
    429 when the queue is full."""
    if body.kernel is not None:
        kernel_or_404(body.kernel, store)
    try:
        got = accept_searches(store, settings, body.kernel)
    except JobRefused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    except dberr.Conflict as exc:
        raise HTTPException(429, str(exc)) from None
    return {"jobs": [{**job_json(j), "existing": not new} for j, new in got.jobs],
            "left_out": got.left_out, "refused": got.refused}


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
