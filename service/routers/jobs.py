"""/v1/jobs: the tuning job queue (workers claim what is queued here)."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from kernelsearch.db import errors as dberr
from kernelsearch.db.checks import axes_key
from kernelsearch.db.statuses import FINISHED_STATUSES, JobStatus
from kernelsearch.kernels.undeclared import UndeclaredKernel

from .. import schemas
from ..deps import SettingsDep, StoreDep, require_writer
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
    if body.n_trials > settings.max_trials_per_job:
        raise HTTPException(422, f"n_trials: at most {settings.max_trials_per_job} per job "
                                 f"(KS_MAX_TRIALS_PER_JOB), got {body.n_trials}")
    if body.cases == "all" and isinstance(k, UndeclaredKernel):
        raise HTTPException(422, f"cases: {k.name} is an undeclared kernel: it has no suite "
                                 f"cases; give one case of its keys{_captured_text(k, store)}")
    if body.cases == "all":
        cases = [dict(c.axes) for c in k.cases]
    else:
        if not body.cases:
            raise HTTPException(422, 'cases: give at least one case, or "all"')
        cases = []
        for i, axes in enumerate(body.cases):
            try:
                cases.append(k.validate_axes(axes, strict=True))
            except ValueError as exc:
                raise HTTPException(422, f"cases[{i}]: {exc}") from None
        cases = list({tuple(sorted(c.items())): c for c in cases}.values())
    if len(cases) > settings.max_cases_per_job:
        raise HTTPException(422, f"cases: at most {settings.max_cases_per_job} per job "
                                 f"(KS_MAX_CASES_PER_JOB), got {len(cases)}")
    capture = body.capture
    if capture is None and isinstance(k, UndeclaredKernel):
        capture = _stored_capture(k, cases, store)
    if capture is not None:
        _check_capture(k, capture, cases, settings)
    sampler = body.sampler or "tpe"
    known = _samplers()
    if known and sampler not in known:
        raise HTTPException(422, f"sampler: unknown {sampler!r}; known: {', '.join(known)}")
    try:
        job, existing = store.queue_job(k.name, cases, body.n_trials, sampler,
                                        timeout_s=body.timeout_s, max_queued=settings.max_queued_jobs,
                                        capture=capture)
    except dberr.Conflict as exc:
        raise HTTPException(429, str(exc)) from None
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


def _captured_text(k: UndeclaredKernel, store: Any) -> str:
    """The cases of `k` a job can tune (those with a stored call), as the end of a message."""
    cases = [", ".join(f"{a}={v}" for a, v in sorted(axes.items()))
             for axes, _ in store.kernel_captures(k.name)]
    return ("; the cases with a stored call: " + "; ".join(cases[:10])) if cases else \
        "; no call of it is stored yet"


def _stored_capture(k: UndeclaredKernel, cases: list[dict[str, Any]], store: Any) -> dict[str, Any]:
    """The call an undeclared kernel's job without one tunes on: the one stored with an earlier
    job of its case (it has no inputs of its own); 422 saying why when there is none."""
    if len(cases) != 1:
        raise HTTPException(422, f"cases: {k.name} is an undeclared kernel: a job tunes one case, "
                                 f"on a call of it; got {len(cases)} cases")
    stored = {axes_key(axes): cap for axes, cap in store.kernel_captures(k.name)}
    got = stored.get(axes_key(cases[0]))
    if got is None:
        raise HTTPException(422, f"cases[0]: {k.name} is an undeclared kernel and no call of it "
                                 f"for this case is stored to tune on (a process calling it under "
                                 f"@kernelsearch.autotune with KS_AUTOTUNE_FALLBACK=first or "
                                 f"nearest stores one with the job it queues)"
                                 f"{_captured_text(k, store)}")
    return got


def _check_capture(k: Any, capture: dict[str, Any], cases: list[dict[str, Any]],
                   settings: Any) -> None:
    """A capture belongs to an undeclared kernel's job of the one case its call has, of a
    module the workers trust, within the bounds of what a worker runs (422 naming the field or
    the setting otherwise); its size is bounded by the request's (KS_MAX_BODY_BYTES)."""
    from kernelsearch.kernels.capture import Capture, CaptureError
    from kernelsearch.kernels.undeclared import UndeclaredKernel

    from ..job_policy import module_refusal, submit_bounds

    if not isinstance(k, UndeclaredKernel):
        raise HTTPException(422, f"capture: {k.name} is a declared kernel; only an undeclared "
                                 f"kernel's job carries a capture")
    refused = module_refusal(k.definition.module, settings)
    if refused is not None:
        raise HTTPException(422, f"kernel: {refused}")
    try:
        cap = Capture.from_json(capture)
        cap.check_against(k.definition)
        cap.check_bounds(submit_bounds(settings), key=k.definition.key)
    except CaptureError as exc:
        raise HTTPException(422, str(exc)) from None
    axes = cap.case_axes(k.definition)
    if len(cases) != 1 or axes is None or k.validate_axes(axes) != cases[0]:
        raise HTTPException(422, f"cases: a job with a capture tunes the captured call's case "
                                 f"({axes}), got {cases}")


def _samplers() -> tuple[str, ...]:
    try:
        from kernelsearch.search_space.tuner import SAMPLERS
    except ImportError:
        return ()
    return tuple(SAMPLERS)
