"""/v1/jobs: the tuning job queue (workers claim what is queued here)."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from kernelsearch.db.statuses import FINISHED_STATUSES, JobStatus

from .. import schemas
from ..deps import SettingsDep, StoreDep, require_writer
from kernelsearch.search_space.job_acceptance import JobRefused, accept_job
from ..lookups import run_read
from ..strict_input import AsciiInt
from ..views import job_json
from .common import ERRORS, JOB_ID, WRITE_ERRORS, kernel_or_404

router = APIRouter(tags=["jobs"])

# Cancelling a cancelled job answers it again; one that ended otherwise (succeeded, failed) is a
# conflict.
_ENDED = tuple(s for s in FINISHED_STATUSES if s != JobStatus.CANCELLED)


@router.post("/v1/jobs", status_code=202, response_model=schemas.JobSubmitted,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def submit_job(body: schemas.JobCreate, settings: SettingsDep, store: StoreDep) -> Any:
    """Queue a tuning job; a worker claims it. 202 with the job as queued and `"existing":
    false`; when an identical job is already queued or running, 202 with that job and
    `"existing": true` (a retried submit stays harmless: the trials are not added twice)."""
    k = kernel_or_404(body.kernel, store)
    try:
        job, existing = accept_job(store, settings, k, body.cases, body.n_trials, body.sampler,
                                   timeout_s=body.timeout_s, capture=body.capture)
    except JobRefused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return {**job_json(job), "existing": existing}


@router.get("/v1/jobs", response_model=list[schemas.JobOut], responses=ERRORS)
async def list_jobs(store: StoreDep, status: schemas.JobStatus | None = None,
                    limit: Annotated[AsciiInt, Query(ge=1, le=1000)] = 100) -> Any:
    """Newest first (503 with Retry-After when the database is slower than KS_READ_TIMEOUT_S)."""
    jobs = await run_read(lambda: store.list_jobs(status=status, limit=limit))
    return [job_json(j) for j in jobs]


@router.get("/v1/jobs/{job_id}", response_model=schemas.JobOut, responses=ERRORS)
async def get_job(job_id: Annotated[AsciiInt, JOB_ID], store: StoreDep) -> Any:
    job = await run_read(store.get_job, job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    return job_json(job)


@router.post("/v1/jobs/{job_id}/cancel", response_model=schemas.JobOut,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def cancel_job(job_id: Annotated[AsciiInt, JOB_ID], store: StoreDep) -> Any:
    """Cancel a queued or running job (a running one stops after its current trial)."""
    job = store.get_job(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    if job.status in _ENDED:
        raise HTTPException(409, f"job {job_id} already {job.status}")
    return job_json(store.cancel_job(job_id))
